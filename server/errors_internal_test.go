package server

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
	"github.com/fencer-dev/fencer/ring"
	"github.com/fencer-dev/fencer/token"
)

// TestEtcdErrorsMapToCodes checks the table of etcd error classes, for
// etcd's errors as the client returns them (rpctypes.EtcdError) and as raw
// gRPC statuses, both wrapped as the store wraps them.
func TestEtcdErrorsMapToCodes(t *testing.T) {
	for _, tc := range []struct {
		err    error
		code   codes.Code
		reason string
		cause  string
	}{
		{rpctypes.ErrTimeout, codes.Unavailable, fencerv1.ErrorReason_ERROR_REASON_STORE_UNAVAILABLE.Reason(), "timeout"},
		{rpctypes.ErrTimeoutDueToLeaderFail, codes.Unavailable, fencerv1.ErrorReason_ERROR_REASON_STORE_UNAVAILABLE.Reason(), "timeout"},
		{rpctypes.ErrTimeoutDueToConnectionLost, codes.Unavailable, fencerv1.ErrorReason_ERROR_REASON_STORE_UNAVAILABLE.Reason(), "timeout"},
		{rpctypes.ErrTimeoutWaitAppliedIndex, codes.Unavailable, fencerv1.ErrorReason_ERROR_REASON_STORE_UNAVAILABLE.Reason(), "timeout"},
		{rpctypes.ErrNoLeader, codes.Unavailable, fencerv1.ErrorReason_ERROR_REASON_STORE_UNAVAILABLE.Reason(), "no_leader"},
		{rpctypes.ErrNotLeader, codes.Unavailable, fencerv1.ErrorReason_ERROR_REASON_STORE_UNAVAILABLE.Reason(), "no_leader"},
		{rpctypes.ErrLeaderChanged, codes.Unavailable, fencerv1.ErrorReason_ERROR_REASON_STORE_UNAVAILABLE.Reason(), "leader_changed"},
		{rpctypes.ErrNoSpace, codes.Unavailable, fencerv1.ErrorReason_ERROR_REASON_STORE_UNAVAILABLE.Reason(), "no_space"},
		{rpctypes.ErrStopped, codes.Unavailable, fencerv1.ErrorReason_ERROR_REASON_STORE_UNAVAILABLE.Reason(), "stopped"},
		{rpctypes.ErrUnhealthy, codes.Unavailable, fencerv1.ErrorReason_ERROR_REASON_STORE_UNAVAILABLE.Reason(), "unhealthy"},
		{rpctypes.ErrTooManyRequests, codes.Unavailable, fencerv1.ErrorReason_ERROR_REASON_STORE_UNAVAILABLE.Reason(), "too_many_requests"},
		{rpctypes.ErrInvalidAuthToken, codes.Unavailable, fencerv1.ErrorReason_ERROR_REASON_STORE_UNAVAILABLE.Reason(), "auth_token_expired"},
		{rpctypes.ErrRequestTooLarge, codes.InvalidArgument, fencerv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT.Reason(), "request_too_large"},
		{rpctypes.ErrTooManyOps, codes.InvalidArgument, fencerv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT.Reason(), "too_many_ops"},
		{rpctypes.ErrDuplicateKey, codes.InvalidArgument, fencerv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT.Reason(), "duplicate_key"},
		{rpctypes.ErrLeaseTTLTooLarge, codes.InvalidArgument, fencerv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT.Reason(), "ttl_too_large"},
		{rpctypes.ErrFutureRev, codes.InvalidArgument, fencerv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT.Reason(), "future_revision"},
		{rpctypes.ErrPermissionDenied, codes.Internal, fencerv1.ErrorReason_ERROR_REASON_INTERNAL.Reason(), "etcd_permission_denied"},
		{rpctypes.ErrAuthFailed, codes.Internal, fencerv1.ErrorReason_ERROR_REASON_INTERNAL.Reason(), "etcd_auth_failed"},
		{rpctypes.ErrCorrupt, codes.Internal, fencerv1.ErrorReason_ERROR_REASON_INTERNAL.Reason(), "corrupt"},
		{rpctypes.ErrMemberNotFound, codes.Internal, fencerv1.ErrorReason_ERROR_REASON_INTERNAL.Reason(), "etcd_error"},
	} {
		raw := rpctypes.ErrGRPCTimeout
		for _, g := range []error{
			rpctypes.ErrGRPCTimeout, rpctypes.ErrGRPCTimeoutDueToLeaderFail, rpctypes.ErrGRPCTimeoutDueToConnectionLost,
			rpctypes.ErrGRPCTimeoutWaitAppliedIndex, rpctypes.ErrGRPCNoLeader, rpctypes.ErrGRPCNotLeader, rpctypes.ErrGRPCLeaderChanged,
			rpctypes.ErrGRPCNoSpace, rpctypes.ErrGRPCStopped, rpctypes.ErrGRPCUnhealthy, rpctypes.ErrGRPCRequestTooManyRequests,
			rpctypes.ErrGRPCInvalidAuthToken, rpctypes.ErrGRPCRequestTooLarge, rpctypes.ErrGRPCTooManyOps, rpctypes.ErrGRPCDuplicateKey,
			rpctypes.ErrGRPCLeaseTTLTooLarge, rpctypes.ErrGRPCFutureRev, rpctypes.ErrGRPCPermissionDenied, rpctypes.ErrGRPCAuthFailed,
			rpctypes.ErrGRPCCorrupt, rpctypes.ErrGRPCMemberNotFound,
		} {
			if rpctypes.Error(g) == tc.err {
				raw = g
			}
		}
		for form, err := range map[string]error{"typed": tc.err, "raw status": raw} {
			t.Run(rpctypes.ErrorDesc(tc.err)+"/"+form, func(t *testing.T) {
				st := status.Convert(toStatus(fmt.Errorf("etcdstore: put: %w", err)))
				require.Equal(t, tc.code, st.Code())
				info := statusInfo(t, st)
				require.Equal(t, tc.reason, info.GetReason())
				require.Equal(t, tc.cause, info.GetMetadata()["cause"])
				require.Equal(t, rpctypes.ErrorDesc(tc.err), info.GetMetadata()["etcd_error"])
			})
		}
	}
}

// TestOverTheClientsSendLimitIsTooLarge: the etcd client's refusal of a
// request over its send limit, a gRPC ResourceExhausted that is none of
// etcd's errors, is the caller's INVALID_ARGUMENT like etcd's "request is
// too large" (do not retry), not STORE_UNAVAILABLE.
func TestOverTheClientsSendLimitIsTooLarge(t *testing.T) {
	err := status.Error(codes.ResourceExhausted, "trying to send message larger than max (2103933 vs. 2097152)")
	code, reason, md := classify(fmt.Errorf("etcdstore: txn: %w", err))
	require.Equal(t, codes.InvalidArgument, code)
	require.Equal(t, fencerv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT, reason)
	require.Equal(t, "request_too_large", md["cause"])
	require.Equal(t, "request", md["field"])
}

// TestStatusMessagesAreForUsers: the status message of an error a caller
// acts on is a sentence built from the typed error, without the server's
// internal wrapping (a Go package prefix such as "etcdstore: put"), so
// that clients in any language can show it as it is.
func TestStatusMessagesAreForUsers(t *testing.T) {
	old, _ := token.Parse("v1:1:3:orders")
	newer, _ := token.Parse("v1:2:7:orders")
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"stale superseded", fmt.Errorf("etcdstore: put %q: %w", "orders/total", &token.StaleError{Token: old, Newer: newer}),
			"stale token: v1:1:3:orders is superseded by v1:2:7:orders; nothing was written"},
		{"stale", fmt.Errorf("etcdstore: check: %w", &token.StaleError{Token: old}),
			"stale token: v1:1:3:orders is no longer current; nothing was written"},
		{"held", fmt.Errorf("etcdstore: acquire: %w", &token.HeldError{Lease: "orders", Holder: "alice/00000000000000ab"}),
			`lease "orders" is held by alice/00000000000000ab`},
		{"held, holder hidden", &token.HeldError{Lease: "orders"},
			`lease "orders" is held by another holder`},
		{"foreign", fmt.Errorf("etcdstore: put %q: %w", "orders/total", &token.ForeignLeaseError{Want: "billing", Got: "orders"}),
			`foreign lease: the key or resource belongs to lease "orders", not to the token's lease "billing"; nothing was written (set take_over to take it over)`},
		{"foreign, owner hidden", &token.ForeignLeaseError{Want: "billing", Got: anotherPrincipalsLease},
			`foreign lease: the key or resource belongs to a lease of another principal, not to the token's lease "billing"; nothing was written (set take_over to take it over)`},
		{"malformed token", inField("token", &token.MalformedError{Field: "version", Input: "v9", Reason: `want "v1"`}),
			`malformed token: version "v9": want "v1" (a token looks like v1:EPOCH:REVISION:LEASE)`},
		{"invalid argument", inField("key", token.InvalidArgument("key", "", "empty")),
			`invalid key "": empty`},
		{"invalid argument in another field", inField("compares[0].key", token.InvalidArgument("key", "", "empty")),
			`invalid key "": empty (field compares[0].key)`},
		{"not held", fmt.Errorf("etcdstore: release: %w", token.ErrNotHeld),
			"the lease is not held"},
		{"session not found", fmt.Errorf("%w: session ended at revision %d", ErrSessionNotFound, 42),
			"session not found: it has expired or was released"},
		{"etcd lease not found", fmt.Errorf("etcdstore: keepalive: %w", rpctypes.ErrLeaseNotFound),
			"session not found: it has expired or was released"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, status.Convert(toStatus(tc.err)).Message())
		})
	}
}

// TestEveryReasonIsClassified checks that every value of the ErrorReason
// enum comes out of classify for some error, unless fencer.proto
// documents it as reserved, that every value is documented, and that the
// reason string toStatus sends parses back to the value classify chose.
func TestEveryReasonIsClassified(t *testing.T) {
	produced := map[fencerv1.ErrorReason]bool{}
	for _, tc := range []struct {
		err  error
		want fencerv1.ErrorReason
	}{
		{&token.StaleError{}, fencerv1.ErrorReason_ERROR_REASON_STALE_TOKEN},
		{token.ErrNotHeld, fencerv1.ErrorReason_ERROR_REASON_LEASE_NOT_HELD},
		{&token.HeldError{Lease: "jobs"}, fencerv1.ErrorReason_ERROR_REASON_HELD_BY_ANOTHER},
		{&token.LockDelayError{Lease: "jobs"}, fencerv1.ErrorReason_ERROR_REASON_LOCK_DELAY},
		{&token.ForeignLeaseError{Want: "a", Got: "b"}, fencerv1.ErrorReason_ERROR_REASON_FOREIGN_LEASE},
		{inField("token", &token.MalformedError{Field: "version"}), fencerv1.ErrorReason_ERROR_REASON_INVALID_TOKEN},
		{inField("key", token.InvalidArgument("key", "", "empty")), fencerv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT},
		{ErrSessionNotFound, fencerv1.ErrorReason_ERROR_REASON_SESSION_NOT_FOUND},
		{ErrPermissionDenied, fencerv1.ErrorReason_ERROR_REASON_PERMISSION_DENIED},
		{ErrUnauthenticated, fencerv1.ErrorReason_ERROR_REASON_UNAUTHENTICATED},
		{ErrWatchCompacted, fencerv1.ErrorReason_ERROR_REASON_WATCH_COMPACTED},
		{errStoreUnavailable, fencerv1.ErrorReason_ERROR_REASON_STORE_UNAVAILABLE},
		{ErrShuttingDown, fencerv1.ErrorReason_ERROR_REASON_SHUTTING_DOWN},
		{errors.New("something else"), fencerv1.ErrorReason_ERROR_REASON_INTERNAL},
		{inRing("orders", "", fmt.Errorf("%w: %q", ring.ErrRingNotFound, "orders")), fencerv1.ErrorReason_ERROR_REASON_RING_NOT_FOUND},
		{inRing("orders", "w1", fmt.Errorf("%w: member taken", ring.ErrRingConflict)), fencerv1.ErrorReason_ERROR_REASON_RING_CONFLICT},
	} {
		t.Run(tc.want.String(), func(t *testing.T) {
			wrapped := fmt.Errorf("etcdstore: put: %w", tc.err)
			_, reason, _ := classify(wrapped)
			require.Equal(t, tc.want, reason)
			produced[reason] = true
			st := status.Convert(toStatus(wrapped))
			info := statusInfo(t, st)
			require.Equal(t, fencerv1.ErrorDomain, info.GetDomain())
			require.Equal(t, reason.Reason(), info.GetReason())
			require.Equal(t, reason, fencerv1.ParseReason(info.GetReason()))
		})
	}

	docs := errorReasonDocs(t, "../proto/fencer/v1/fencer.proto")
	values := fencerv1.ErrorReason(0).Descriptor().Values()
	for i := range values.Len() {
		r := fencerv1.ErrorReason(values.Get(i).Number())
		doc, ok := docs[r.String()]
		switch {
		case !ok || doc == "":
			t.Errorf("%s has no comment in fencer.proto", r)
		case produced[r] && strings.Contains(doc, "reserved"):
			t.Errorf("%s is documented as reserved, but classify produces it", r)
		case !produced[r] && !strings.Contains(doc, "reserved"):
			t.Errorf("%s is neither produced by classify nor documented as reserved in fencer.proto", r)
		}
	}
}

// TestRingErrors: the ring's errors, with the ring and member the caller
// named, map to their codes, reasons, metadata and messages.
func TestRingErrors(t *testing.T) {
	for _, tc := range []struct {
		name   string
		err    error
		code   codes.Code
		reason fencerv1.ErrorReason
		md     map[string]string
		msg    string
	}{
		{"not found", inRing("orders", "", fmt.Errorf("%w: %q", ring.ErrRingNotFound, "orders")), codes.NotFound, fencerv1.ErrorReason_ERROR_REASON_RING_NOT_FOUND,
			map[string]string{"ring": "orders"}, `ring "orders" not found: create it first (CreateRing)`},
		{"other shards", inRing("orders", "", ring.ErrRingConflict), codes.AlreadyExists, fencerv1.ErrorReason_ERROR_REASON_RING_CONFLICT,
			map[string]string{"ring": "orders"}, `ring "orders" exists with other shards`},
		{"member taken", inRing("orders", "w1", ring.ErrRingConflict), codes.AlreadyExists, fencerv1.ErrorReason_ERROR_REASON_RING_CONFLICT,
			map[string]string{"ring": "orders", "member": "w1"}, `member "w1" of ring "orders" is taken by another session`},
		{"session joined as another", inRing("orders", "w2", &ring.SessionJoinedError{Ring: "orders", Member: "w1"}), codes.AlreadyExists, fencerv1.ErrorReason_ERROR_REASON_RING_CONFLICT,
			map[string]string{"ring": "orders", "member": "w2"}, `the session is member "w1" of ring "orders" already: a session is a member of a ring under one name`},
		{"rejoined", inRing("orders", "w1", ErrRejoined), codes.Aborted, fencerv1.ErrorReason_ERROR_REASON_RING_CONFLICT,
			map[string]string{"ring": "orders", "member": "w1", "cause": "rejoined"}, "the member joined again through another JoinRing stream; this one ends"},
		{"not losing", inRing("orders", "", fmt.Errorf("ring: release %q: %w", "3", ring.ErrNotLosing)), codes.FailedPrecondition, fencerv1.ErrorReason_ERROR_REASON_LEASE_NOT_HELD,
			map[string]string{"ring": "orders", "cause": "not_losing"}, `ring "orders": a shard this member owns is not being handed off, so it was not released: release only shards reported LOSING`},
		{"session ended", inRing("orders", "w1", fmt.Errorf("ring: leave: the member key is gone: %w", token.ErrSessionExpired)), codes.NotFound,
			fencerv1.ErrorReason_ERROR_REASON_SESSION_NOT_FOUND, nil, "session not found: it has expired or was released"},
		{"not joined here", inRing("orders", "", ErrNotJoinedHere), codes.FailedPrecondition, fencerv1.ErrorReason_ERROR_REASON_LEASE_NOT_HELD,
			map[string]string{"ring": "orders", "cause": "not_joined_here"}, `ring "orders": the member's JoinRing stream does not run on this server: call it through the server of the stream, or join again`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := status.Convert(toStatus(tc.err))
			require.Equal(t, tc.code, st.Code())
			info := statusInfo(t, st)
			require.Equal(t, tc.reason.Reason(), info.GetReason())
			require.Equal(t, tc.md, info.GetMetadata())
			require.Equal(t, tc.msg, st.Message())
		})
	}
}

// errorReasonDocs returns the comment above each value of enum
// ErrorReason in the .proto file at path, by value name.
func errorReasonDocs(t *testing.T, path string) map[string]string {
	t.Helper()
	text, err := os.ReadFile(path)
	require.NoError(t, err)
	_, body, ok := strings.Cut(string(text), "\nenum ErrorReason {\n")
	require.True(t, ok, "no enum ErrorReason in %s", path)
	body, _, ok = strings.Cut(body, "\n}\n")
	require.True(t, ok, "enum ErrorReason does not end in %s", path)
	docs := map[string]string{}
	var comment []string
	for line := range strings.Lines(body) {
		line = strings.TrimSpace(line)
		if c, ok := strings.CutPrefix(line, "//"); ok {
			comment = append(comment, strings.TrimSpace(c))
			continue
		}
		if name, _, ok := strings.Cut(line, " = "); ok {
			docs[name] = strings.Join(comment, " ")
		}
		comment = nil
	}
	return docs
}

// statusInfo returns st's ErrorInfo, failing the test if it has none.
func statusInfo(t *testing.T, st *status.Status) *errdetails.ErrorInfo {
	t.Helper()
	for _, d := range st.Details() {
		if ei, ok := d.(*errdetails.ErrorInfo); ok {
			return ei
		}
	}
	t.Fatalf("status %v carries no ErrorInfo", st)
	return nil
}
