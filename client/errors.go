package client

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/status"

	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
	"github.com/fencer-dev/fencer/token"
)

// Errors of the service that have no counterpart in the library.
var (
	// ErrPermissionDenied means the session or token belongs to another
	// principal.
	ErrPermissionDenied = errors.New("client: permission denied")
	// ErrUnauthenticated means the server did not accept the credentials.
	ErrUnauthenticated = errors.New("client: unauthenticated")
	// ErrSessionNotFound means the server no longer has the session: its
	// etcd lease expired, or was revoked (by a Release of the session, by
	// an operator). An error matching it also matches
	// token.ErrSessionExpired. It tells a session the server ended from one
	// the client ended itself because no renewal succeeded within its TTL,
	// which matches token.ErrSessionExpired only.
	ErrSessionNotFound = errors.New("client: the server has no such session (it expired or was revoked)")
	// ErrRingNotFound means the ring has not been created (CreateRing).
	ErrRingNotFound = errors.New("client: ring not found")
	// ErrRingConflict means the ring exists with other shards, or the
	// member name is taken in the ring by another session.
	ErrRingConflict = errors.New("client: ring conflict")
	// ErrRingRejoined ends a Ring whose member joined again through
	// another JoinRing of the same session and ring. An error matching it
	// also matches ErrRingConflict.
	ErrRingRejoined = errors.New("client: the member joined the ring again elsewhere")
	// ErrNotLosing means Ring.Release named a shard the member owns but is
	// not handing off: it was not released.
	ErrNotLosing = errors.New("client: shard is not being handed off")
	// ErrNotJoinedHere means a Release or Leave of a ring reached a server
	// that does not run the member's JoinRing stream; call it through the
	// same connection as the stream.
	ErrNotJoinedHere = errors.New("client: the member's JoinRing stream runs on another server")
	// errWatchCompacted means a lease watch must start again from now.
	errWatchCompacted = errors.New("client: watch compacted")
)

// fromStatus is the one place where the client turns a gRPC status into
// the errors the Go library returns: *token.StaleError (with Newer when the
// server knew it), *token.HeldError, *token.LockDelayError, *token.ForeignLeaseError,
// *token.MalformedError, token.ErrNotHeld, *token.ArgumentError and
// token.ErrSessionExpired (with ErrSessionNotFound), or
// ErrPermissionDenied, ErrUnauthenticated and the ring's ErrRingNotFound,
// ErrRingConflict (with ErrRingRejoined), ErrNotLosing and
// ErrNotJoinedHere. Any other error is returned wrapped, so that
// status.Code still reports its code.
func fromStatus(err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return fmt.Errorf("client: %w", err)
	}
	info := errorInfo(st)
	if info == nil {
		return fmt.Errorf("client: %w", err)
	}
	md := info.GetMetadata()
	switch fencerv1.ParseReason(info.GetReason()) {
	case fencerv1.ErrorReason_ERROR_REASON_STALE_TOKEN:
		e := &token.StaleError{}
		e.Token, _ = token.Parse(md["token"])
		e.Newer, _ = token.Parse(md["newer_token"])
		return e
	case fencerv1.ErrorReason_ERROR_REASON_HELD_BY_ANOTHER:
		return &token.HeldError{Lease: md["lease"], Holder: md["holder"]}
	case fencerv1.ErrorReason_ERROR_REASON_LOCK_DELAY:
		e := &token.LockDelayError{Lease: md["lease"]}
		if ms, err := strconv.ParseInt(md["delay_ms"], 10, 64); err == nil {
			e.Delay = time.Duration(ms) * time.Millisecond
		}
		if ms, err := strconv.ParseInt(md["remaining_ms"], 10, 64); err == nil {
			e.Remaining = time.Duration(ms) * time.Millisecond
		}
		return e
	case fencerv1.ErrorReason_ERROR_REASON_FOREIGN_LEASE:
		return &token.ForeignLeaseError{Want: md["want"], Got: md["got"]}
	case fencerv1.ErrorReason_ERROR_REASON_LEASE_NOT_HELD:
		switch md["cause"] {
		case "not_losing":
			return fmt.Errorf("client: %s: %w", st.Message(), ErrNotLosing)
		case "not_joined_here":
			return fmt.Errorf("client: %s: %w", st.Message(), ErrNotJoinedHere)
		}
		return fmt.Errorf("client: %s: %w", st.Message(), token.ErrNotHeld)
	case fencerv1.ErrorReason_ERROR_REASON_RING_NOT_FOUND:
		return fmt.Errorf("client: %s: %w", st.Message(), ErrRingNotFound)
	case fencerv1.ErrorReason_ERROR_REASON_RING_CONFLICT:
		if md["cause"] == "rejoined" {
			return fmt.Errorf("client: %s: %w: %w", st.Message(), ErrRingRejoined, ErrRingConflict)
		}
		return fmt.Errorf("client: %s: %w", st.Message(), ErrRingConflict)
	case fencerv1.ErrorReason_ERROR_REASON_INVALID_TOKEN:
		return &token.MalformedError{Field: md["token_field"], Input: md["input"], Reason: md["reason"]}
	case fencerv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT:
		return &token.ArgumentError{Arg: md["field"], Value: md["input"], Reason: md["reason"]}
	case fencerv1.ErrorReason_ERROR_REASON_SESSION_NOT_FOUND:
		return fmt.Errorf("%w: %s: %w", ErrSessionNotFound, st.Message(), token.ErrSessionExpired)
	case fencerv1.ErrorReason_ERROR_REASON_PERMISSION_DENIED:
		return fmt.Errorf("client: %s: %w", st.Message(), ErrPermissionDenied)
	case fencerv1.ErrorReason_ERROR_REASON_UNAUTHENTICATED:
		return fmt.Errorf("client: %s: %w", st.Message(), ErrUnauthenticated)
	case fencerv1.ErrorReason_ERROR_REASON_WATCH_COMPACTED:
		return fmt.Errorf("client: %s: %w", st.Message(), errWatchCompacted)
	}
	return fmt.Errorf("client: %w", err)
}

// Reason returns the reason of the fencer.dev ErrorInfo carried by an
// error a Client method returned, as the fencerv1.ErrorReason enum. It
// returns fencerv1.ErrorReason_ERROR_REASON_UNSPECIFIED when the error
// carries none, as transport errors do, and when the reason is one this
// version of the enum does not know (a newer server's): the error's gRPC
// code (status.Code) still tells what kind of failure it was. Callers that
// need to tell a server that cannot reach etcd
// (ERROR_REASON_STORE_UNAVAILABLE) from one that is shutting down
// (ERROR_REASON_SHUTTING_DOWN) use it; the typed errors above cover every
// other reason.
func Reason(err error) fencerv1.ErrorReason {
	st, ok := status.FromError(err)
	if !ok {
		return fencerv1.ErrorReason_ERROR_REASON_UNSPECIFIED
	}
	return fencerv1.ParseReason(errorInfo(st).GetReason())
}

// Cause returns the "cause" metadata of the fencer.dev ErrorInfo carried
// by an error a Client method returned (docs/service.md lists the causes
// of each reason, e.g. "no_space" for a STORE_UNAVAILABLE whose etcd is
// out of space, "etcd_unreachable", "no_leader"), or "" when the error
// carries none. A cause refines its reason for people and for finer
// handling; a newer server may send causes this version does not name, so
// branch on Reason or the typed errors first.
func Cause(err error) string {
	st, ok := status.FromError(err)
	if !ok {
		return ""
	}
	return errorInfo(st).GetMetadata()["cause"]
}

// errorInfo returns st's ErrorInfo in the fencer.dev domain, or nil.
func errorInfo(st *status.Status) *errdetails.ErrorInfo {
	for _, d := range st.Details() {
		if ei, ok := d.(*errdetails.ErrorInfo); ok && ei.GetDomain() == fencerv1.ErrorDomain {
			return ei
		}
	}
	return nil
}
