package client

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
	"github.com/fencer-dev/fencer/token"
)

func withInfo(code codes.Code, reason string, md map[string]string) error {
	st, err := status.New(code, "msg").WithDetails(&errdetails.ErrorInfo{Reason: reason, Domain: fencerv1.ErrorDomain, Metadata: md})
	if err != nil {
		panic(err)
	}
	return st.Err()
}

func TestFromStatus(t *testing.T) {
	old := token.Token{Lease: "jobs", Epoch: 1, Revision: 5}
	newer := token.Token{Lease: "jobs", Epoch: 2, Revision: 9}
	cases := []struct {
		name  string
		in    error
		is    error
		check func(t *testing.T, err error)
	}{
		{"stale", withInfo(codes.FailedPrecondition, fencerv1.ErrorReason_ERROR_REASON_STALE_TOKEN.Reason(), map[string]string{"token": old.String(), "newer_token": newer.String()}), token.ErrStale,
			func(t *testing.T, err error) {
				var e *token.StaleError
				require.ErrorAs(t, err, &e)
				require.Equal(t, old, e.Token)
				require.Equal(t, newer, e.Newer)
			}},
		{"held", withInfo(codes.FailedPrecondition, fencerv1.ErrorReason_ERROR_REASON_HELD_BY_ANOTHER.Reason(), map[string]string{"lease": "jobs", "holder": "bob/1"}), token.ErrHeldByAnother,
			func(t *testing.T, err error) {
				var e *token.HeldError
				require.ErrorAs(t, err, &e)
				require.Equal(t, "bob/1", e.Holder)
			}},
		{"lock-delay", withInfo(codes.FailedPrecondition, fencerv1.ErrorReason_ERROR_REASON_LOCK_DELAY.Reason(), map[string]string{"lease": "jobs", "delay_ms": "2000", "remaining_ms": "1000"}), token.ErrLockDelay,
			func(t *testing.T, err error) {
				var e *token.LockDelayError
				require.ErrorAs(t, err, &e)
				require.Equal(t, token.LockDelayError{Lease: "jobs", Delay: 2 * time.Second, Remaining: time.Second}, *e)
				require.NotErrorIs(t, err, token.ErrHeldByAnother)
			}},
		{"foreign", withInfo(codes.FailedPrecondition, fencerv1.ErrorReason_ERROR_REASON_FOREIGN_LEASE.Reason(), map[string]string{"want": "a", "got": "b"}), token.ErrForeignLease, nil},
		{"not held", withInfo(codes.FailedPrecondition, fencerv1.ErrorReason_ERROR_REASON_LEASE_NOT_HELD.Reason(), nil), token.ErrNotHeld, nil},
		{"malformed", withInfo(codes.InvalidArgument, fencerv1.ErrorReason_ERROR_REASON_INVALID_TOKEN.Reason(), map[string]string{"token_field": "revision"}), token.ErrMalformed, nil},
		{"argument", withInfo(codes.InvalidArgument, fencerv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT.Reason(), map[string]string{"field": "key"}), token.ErrInvalidArgument, nil},
		{"session", withInfo(codes.NotFound, fencerv1.ErrorReason_ERROR_REASON_SESSION_NOT_FOUND.Reason(), nil), token.ErrSessionExpired,
			func(t *testing.T, err error) { require.ErrorIs(t, err, ErrSessionNotFound) }},
		{"permission", withInfo(codes.PermissionDenied, fencerv1.ErrorReason_ERROR_REASON_PERMISSION_DENIED.Reason(), nil), ErrPermissionDenied, nil},
		{"unauthenticated", withInfo(codes.Unauthenticated, fencerv1.ErrorReason_ERROR_REASON_UNAUTHENTICATED.Reason(), nil), ErrUnauthenticated, nil},
		{"compacted", withInfo(codes.OutOfRange, fencerv1.ErrorReason_ERROR_REASON_WATCH_COMPACTED.Reason(), nil), errWatchCompacted, nil},
		{"ring not found", withInfo(codes.NotFound, fencerv1.ErrorReason_ERROR_REASON_RING_NOT_FOUND.Reason(), map[string]string{"ring": "r"}), ErrRingNotFound, nil},
		{"ring conflict", withInfo(codes.AlreadyExists, fencerv1.ErrorReason_ERROR_REASON_RING_CONFLICT.Reason(), map[string]string{"ring": "r"}), ErrRingConflict,
			func(t *testing.T, err error) { require.NotErrorIs(t, err, ErrRingRejoined) }},
		{"ring rejoined", withInfo(codes.Aborted, fencerv1.ErrorReason_ERROR_REASON_RING_CONFLICT.Reason(), map[string]string{"ring": "r", "cause": "rejoined"}), ErrRingRejoined,
			func(t *testing.T, err error) { require.ErrorIs(t, err, ErrRingConflict) }},
		{"not losing", withInfo(codes.FailedPrecondition, fencerv1.ErrorReason_ERROR_REASON_LEASE_NOT_HELD.Reason(), map[string]string{"ring": "r", "cause": "not_losing"}), ErrNotLosing,
			func(t *testing.T, err error) { require.NotErrorIs(t, err, token.ErrNotHeld) }},
		{"not joined here", withInfo(codes.FailedPrecondition, fencerv1.ErrorReason_ERROR_REASON_LEASE_NOT_HELD.Reason(), map[string]string{"ring": "r", "cause": "not_joined_here"}), ErrNotJoinedHere, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := fromStatus(tc.in)
			require.ErrorIs(t, err, tc.is)
			if tc.check != nil {
				tc.check(t, err)
			}
		})
	}
	t.Run("other statuses keep their code", func(t *testing.T) {
		err := fromStatus(withInfo(codes.Unavailable, fencerv1.ErrorReason_ERROR_REASON_STORE_UNAVAILABLE.Reason(), nil))
		require.Equal(t, codes.Unavailable, status.Code(err))
		require.Equal(t, codes.Unavailable, status.Code(fromStatus(status.Error(codes.Unavailable, "x"))))
		require.NoError(t, fromStatus(nil))
		require.False(t, errors.Is(err, token.ErrStale))
	})
}

func TestReason(t *testing.T) {
	require.Equal(t, fencerv1.ErrorReason_ERROR_REASON_SHUTTING_DOWN, Reason(fromStatus(withInfo(codes.Unavailable, "SHUTTING_DOWN", nil))))
	require.Equal(t, fencerv1.ErrorReason_ERROR_REASON_STORE_UNAVAILABLE, Reason(fromStatus(withInfo(codes.Unavailable, "STORE_UNAVAILABLE", nil))))
	unspecified := fencerv1.ErrorReason_ERROR_REASON_UNSPECIFIED
	require.Equal(t, unspecified, Reason(fromStatus(status.Error(codes.Unavailable, "connection refused"))))
	require.Equal(t, unspecified, Reason(errors.New("plain")))
	require.Equal(t, unspecified, Reason(nil))
	// A reason of a newer server: the code still tells what it was.
	newer := fromStatus(withInfo(codes.Unavailable, "SOMETHING_NEWER", nil))
	require.Equal(t, unspecified, Reason(newer))
	require.Equal(t, codes.Unavailable, status.Code(newer))
}

func TestCause(t *testing.T) {
	noSpace := fromStatus(withInfo(codes.Unavailable, "STORE_UNAVAILABLE", map[string]string{"cause": "no_space", "etcd_error": "etcdserver: mvcc: database space exceeded"}))
	require.Equal(t, "no_space", Cause(noSpace))
	require.Equal(t, "", Cause(fromStatus(withInfo(codes.Unavailable, "SHUTTING_DOWN", nil))))
	require.Equal(t, "", Cause(fromStatus(status.Error(codes.Unavailable, "connection refused"))))
	require.Equal(t, "", Cause(errors.New("plain")))
	require.Equal(t, "", Cause(nil))
	// Another domain's ErrorInfo is not fencer's.
	st, err := status.New(codes.Unavailable, "msg").WithDetails(&errdetails.ErrorInfo{Reason: "X", Domain: "example.com", Metadata: map[string]string{"cause": "no_space"}})
	require.NoError(t, err)
	require.Equal(t, "", Cause(st.Err()))
}
