package server

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fencer-dev/fencer/etcdstore"
	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
	"github.com/fencer-dev/fencer/ring"
	"github.com/fencer-dev/fencer/token"
)

// Errors of the service itself. Token and argument errors are the token and
// etcdstore packages'.
var (
	// ErrSessionNotFound means a session has expired, was released, or
	// never existed.
	ErrSessionNotFound = errors.New("server: session not found")
	// ErrPermissionDenied means a session or token belongs to another
	// principal.
	ErrPermissionDenied = errors.New("server: permission denied")
	// ErrUnauthenticated means a call carried no valid credentials.
	ErrUnauthenticated = errors.New("server: unauthenticated")
	// ErrWatchCompacted means a watch's start revision was compacted.
	ErrWatchCompacted = errors.New("server: watch start revision compacted")
	// ErrShuttingDown ends streams when the server shuts down.
	ErrShuttingDown = errors.New("server: shutting down")
	// errStoreUnavailable means etcd could not serve a request or watch.
	errStoreUnavailable = errors.New("server: store unavailable")
	// ErrRejoined ends a JoinRing stream when a newer JoinRing of the same
	// session and ring replaces it (gRPC ABORTED).
	ErrRejoined = errors.New("server: the member joined again through another JoinRing stream")
	// ErrNotJoinedHere means a ReleaseShards or LeaveRing reached a server
	// that does not run the member's JoinRing stream, which alone can hand
	// off its shards.
	ErrNotJoinedHere = errors.New("server: the member's JoinRing stream does not run on this server")
)

// ringError ties an error of package ring to the ring, and the member for
// a member name taken, that the caller named: the metadata of
// RING_NOT_FOUND and RING_CONFLICT.
type ringError struct {
	ring, member string
	err          error
}

func (e *ringError) Error() string { return fmt.Sprintf("server: ring %q: %v", e.ring, e.err) }
func (e *ringError) Unwrap() error { return e.err }

// inRing ties err, if not nil, to ring and member (see ringError). An
// error of package ring for a session that has ended is the service's
// ErrSessionNotFound too.
func inRing(ringName, member string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, token.ErrSessionExpired) && !errors.Is(err, ErrSessionNotFound) {
		err = fmt.Errorf("%w: %w", ErrSessionNotFound, err)
	}
	return &ringError{ring: ringName, member: member, err: err}
}

// fieldError ties an invalid value to the request field that carried it,
// such as "compares[2].key".
type fieldError struct {
	field string
	err   error
}

func (e *fieldError) Error() string { return fmt.Sprintf("server: field %s: %v", e.field, e.err) }
func (e *fieldError) Unwrap() error { return e.err }

func inField(field string, err error) error {
	if err == nil {
		return nil
	}
	return &fieldError{field: field, err: err}
}

// toStatus is the one place where the server turns an error into a gRPC
// status: a code plus a google.rpc.ErrorInfo in the fencer.dev domain, and a
// google.rpc.BadRequest for invalid fields. The interceptors apply it to
// every error a handler returns.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := err.(interface{ GRPCStatus() *status.Status }); ok {
		return err // already a status, e.g. from grpc itself
	}
	code, reason, md := classify(err)
	st := status.New(code, userMessage(err))
	details := []*errdetails.ErrorInfo{{Reason: reason.Reason(), Domain: fencerv1.ErrorDomain, Metadata: md}}
	var fe *fieldError
	if errors.As(err, &fe) {
		desc := err.Error()
		var ae *token.ArgumentError
		var me *token.MalformedError
		switch {
		case errors.As(err, &ae):
			desc = ae.Reason
		case errors.As(err, &me):
			desc = me.Field + ": " + me.Reason
		}
		br := &errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: fe.field, Description: desc}}}
		if withDetails, derr := st.WithDetails(details[0], br); derr == nil {
			return withDetails.Err()
		}
		return st.Err()
	}
	if withDetails, derr := st.WithDetails(details[0]); derr == nil {
		return withDetails.Err()
	}
	return st.Err()
}

// userMessage is the status message for err. For the errors a caller acts
// on (stale, held, foreign lease, not held, session not found, a malformed
// token, an invalid argument) it is a sentence built from the typed error,
// in the words the CLI uses, without the server's internal wrapping
// ("etcdstore: put ..."): clients in any language show it as it is. Any
// other error keeps its text.
func userMessage(err error) string {
	if stale, ok := errors.AsType[*token.StaleError](err); ok {
		if stale.Newer.IsZero() {
			return fmt.Sprintf("stale token: %s is no longer current; nothing was written", stale.Token)
		}
		return fmt.Sprintf("stale token: %s is superseded by %s; nothing was written", stale.Token, stale.Newer)
	}
	if held, ok := errors.AsType[*token.HeldError](err); ok {
		if held.Holder == "" {
			return fmt.Sprintf("lease %q is held by another holder", held.Lease)
		}
		return fmt.Sprintf("lease %q is held by %s", held.Lease, held.Holder)
	}
	if delay, ok := errors.AsType[*token.LockDelayError](err); ok {
		return delay.Explain()
	}
	if foreign, ok := errors.AsType[*token.ForeignLeaseError](err); ok {
		owner := fmt.Sprintf("lease %q", foreign.Got)
		if foreign.Got == anotherPrincipalsLease {
			owner = anotherPrincipalsLease
		}
		return fmt.Sprintf("foreign lease: the key or resource belongs to %s, not to the token's lease %q; nothing was written (set take_over to take it over)", owner, foreign.Want)
	}
	if malformed, ok := errors.AsType[*token.MalformedError](err); ok {
		return fmt.Sprintf("malformed token: %s %q: %s (a token looks like v1:EPOCH:REVISION:LEASE)", malformed.Field, malformed.Input, malformed.Reason)
	}
	if arg, ok := errors.AsType[*token.ArgumentError](err); ok {
		msg := fmt.Sprintf("invalid %s %q: %s", arg.Arg, arg.Value, arg.Reason)
		if fe, ok := errors.AsType[*fieldError](err); ok && fe.field != arg.Arg {
			msg += " (field " + fe.field + ")"
		}
		return msg
	}
	if re, ok := errors.AsType[*ringError](err); ok {
		if sj, ok := errors.AsType[*ring.SessionJoinedError](err); ok {
			return fmt.Sprintf("the session is member %q of ring %q already: a session is a member of a ring under one name", sj.Member, re.ring)
		}
		switch {
		case errors.Is(err, ring.ErrRingNotFound):
			return fmt.Sprintf("ring %q not found: create it first (CreateRing)", re.ring)
		case errors.Is(err, ring.ErrRingConflict) && re.member != "":
			return fmt.Sprintf("member %q of ring %q is taken by another session", re.member, re.ring)
		case errors.Is(err, ring.ErrRingConflict):
			return fmt.Sprintf("ring %q exists with other shards", re.ring)
		case errors.Is(err, ring.ErrNotLosing):
			return fmt.Sprintf("ring %q: a shard this member owns is not being handed off, so it was not released: release only shards reported LOSING", re.ring)
		case errors.Is(err, ErrNotJoinedHere):
			return fmt.Sprintf("ring %q: the member's JoinRing stream does not run on this server: call it through the server of the stream, or join again", re.ring)
		}
	}
	switch {
	case errors.Is(err, ErrRejoined):
		return "the member joined again through another JoinRing stream; this one ends"
	case errors.Is(err, token.ErrNotHeld):
		return "the lease is not held"
	case errors.Is(err, ErrSessionNotFound), errors.Is(err, rpctypes.ErrLeaseNotFound):
		return "session not found: it has expired or was released"
	}
	return err.Error()
}

// classify picks the code, reason and metadata for err. Every
// ErrorReason but UNSPECIFIED comes out of it for some error
// (TestEveryReasonIsClassified).
func classify(err error) (codes.Code, fencerv1.ErrorReason, map[string]string) {
	var (
		stale     *token.StaleError
		held      *token.HeldError
		delay     *token.LockDelayError
		foreign   *token.ForeignLeaseError
		malformed *token.MalformedError
		arg       *token.ArgumentError
		fe        *fieldError
	)
	field := ""
	if errors.As(err, &fe) {
		field = fe.field
	}
	if code, reason, md, ok := classifyRing(err); ok {
		return code, reason, md
	}
	switch {
	case errors.As(err, &stale):
		md := map[string]string{"token": stale.Token.String()}
		if !stale.Newer.IsZero() {
			md["newer_token"] = stale.Newer.String()
		}
		return codes.FailedPrecondition, fencerv1.ErrorReason_ERROR_REASON_STALE_TOKEN, md
	case errors.As(err, &held):
		return codes.FailedPrecondition, fencerv1.ErrorReason_ERROR_REASON_HELD_BY_ANOTHER, map[string]string{"lease": held.Lease, "holder": held.Holder}
	case errors.As(err, &delay):
		md := map[string]string{"lease": delay.Lease}
		if delay.Delay > 0 {
			md["delay_ms"] = strconv.FormatInt(delay.Delay.Milliseconds(), 10)
		}
		if delay.Remaining > 0 {
			md["remaining_ms"] = strconv.FormatInt(delay.Remaining.Milliseconds(), 10)
		}
		return codes.FailedPrecondition, fencerv1.ErrorReason_ERROR_REASON_LOCK_DELAY, md
	case errors.As(err, &foreign):
		return codes.FailedPrecondition, fencerv1.ErrorReason_ERROR_REASON_FOREIGN_LEASE, map[string]string{"want": foreign.Want, "got": foreign.Got}
	case errors.Is(err, token.ErrNotHeld):
		return codes.FailedPrecondition, fencerv1.ErrorReason_ERROR_REASON_LEASE_NOT_HELD, nil
	case errors.As(err, &malformed):
		if field == "" {
			field = malformed.Field
		}
		return codes.InvalidArgument, fencerv1.ErrorReason_ERROR_REASON_INVALID_TOKEN, map[string]string{"field": field, "token_field": malformed.Field, "input": malformed.Input, "reason": malformed.Reason}
	case errors.As(err, &arg):
		if field == "" {
			field = arg.Arg
		}
		return codes.InvalidArgument, fencerv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT, map[string]string{"field": field, "input": arg.Value, "reason": arg.Reason}
	case errors.Is(err, ErrSessionNotFound), errors.Is(err, rpctypes.ErrLeaseNotFound):
		return codes.NotFound, fencerv1.ErrorReason_ERROR_REASON_SESSION_NOT_FOUND, nil
	case errors.Is(err, ErrPermissionDenied):
		return codes.PermissionDenied, fencerv1.ErrorReason_ERROR_REASON_PERMISSION_DENIED, nil
	case errors.Is(err, ErrUnauthenticated):
		return codes.Unauthenticated, fencerv1.ErrorReason_ERROR_REASON_UNAUTHENTICATED, nil
	case errors.Is(err, ErrWatchCompacted), errors.Is(err, rpctypes.ErrCompacted):
		return codes.OutOfRange, fencerv1.ErrorReason_ERROR_REASON_WATCH_COMPACTED, nil
	case errors.Is(err, ErrEtcdUnreachable):
		return codes.Unavailable, fencerv1.ErrorReason_ERROR_REASON_STORE_UNAVAILABLE, map[string]string{"cause": "etcd_unreachable"}
	}
	if etcdstore.OverSendLimit(err) {
		// Like etcd's own "request is too large", one step earlier.
		return codes.InvalidArgument, fencerv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT, map[string]string{"cause": "request_too_large", "field": "request", "reason": status.Convert(err).Message()}
	}
	if c, etcdErr, ok := classifyEtcd(err); ok {
		desc := rpctypes.ErrorDesc(etcdErr)
		md := map[string]string{"cause": c.cause, "etcd_error": desc}
		if c.reason == fencerv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT {
			if field == "" {
				field = "request"
			}
			md["field"], md["reason"] = field, desc
		}
		return c.code, c.reason, md
	}
	switch {
	case errors.Is(err, errStoreUnavailable):
		return codes.Unavailable, fencerv1.ErrorReason_ERROR_REASON_STORE_UNAVAILABLE, nil
	case errors.Is(err, ErrShuttingDown):
		return codes.Unavailable, fencerv1.ErrorReason_ERROR_REASON_SHUTTING_DOWN, nil
	case errors.Is(err, context.Canceled):
		return codes.Canceled, fencerv1.ErrorReason_ERROR_REASON_STORE_UNAVAILABLE, nil
	case errors.Is(err, context.DeadlineExceeded):
		return codes.DeadlineExceeded, fencerv1.ErrorReason_ERROR_REASON_STORE_UNAVAILABLE, nil
	}
	if st, ok := status.FromError(err); ok {
		switch st.Code() {
		case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled, codes.Aborted:
			return codes.Unavailable, fencerv1.ErrorReason_ERROR_REASON_STORE_UNAVAILABLE, nil
		}
	}
	return codes.Internal, fencerv1.ErrorReason_ERROR_REASON_INTERNAL, nil
}

// classifyRing picks the code, reason and metadata of the ring's errors.
func classifyRing(err error) (codes.Code, fencerv1.ErrorReason, map[string]string, bool) {
	md := map[string]string{}
	if re, ok := errors.AsType[*ringError](err); ok {
		md["ring"] = re.ring
		if re.member != "" {
			md["member"] = re.member
		}
	}
	switch {
	case errors.Is(err, ring.ErrRingNotFound):
		delete(md, "member")
		return codes.NotFound, fencerv1.ErrorReason_ERROR_REASON_RING_NOT_FOUND, md, true
	case errors.Is(err, ring.ErrRingConflict):
		return codes.AlreadyExists, fencerv1.ErrorReason_ERROR_REASON_RING_CONFLICT, md, true
	case errors.Is(err, ErrRejoined):
		md["cause"] = "rejoined"
		return codes.Aborted, fencerv1.ErrorReason_ERROR_REASON_RING_CONFLICT, md, true
	case errors.Is(err, ring.ErrNotLosing):
		md["cause"] = "not_losing"
		return codes.FailedPrecondition, fencerv1.ErrorReason_ERROR_REASON_LEASE_NOT_HELD, md, true
	case errors.Is(err, ErrNotJoinedHere):
		md["cause"] = "not_joined_here"
		return codes.FailedPrecondition, fencerv1.ErrorReason_ERROR_REASON_LEASE_NOT_HELD, md, true
	}
	return 0, 0, nil, false
}

// etcdClass is how the service reports one class of etcd error: a code, an
// ErrorInfo reason, and a cause in the ErrorInfo metadata.
type etcdClass struct {
	code   codes.Code
	reason fencerv1.ErrorReason
	cause  string
}

func unavailable(cause string) etcdClass {
	return etcdClass{code: codes.Unavailable, reason: fencerv1.ErrorReason_ERROR_REASON_STORE_UNAVAILABLE, cause: cause}
}

func invalid(cause string) etcdClass {
	return etcdClass{code: codes.InvalidArgument, reason: fencerv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT, cause: cause}
}

func internal(cause string) etcdClass {
	return etcdClass{code: codes.Internal, reason: fencerv1.ErrorReason_ERROR_REASON_INTERNAL, cause: cause}
}

// etcdClasses maps etcd's typed errors to what clients see. UNAVAILABLE
// means "etcd could not answer now; a write may or may not have committed,
// retry"; INVALID_ARGUMENT means the request itself can never succeed;
// INTERNAL means the deployment is broken (credentials, corruption).
// docs/service.md has the same table.
var etcdClasses = []struct {
	err error
	etcdClass
}{
	{rpctypes.ErrTimeout, unavailable("timeout")},
	{rpctypes.ErrTimeoutDueToLeaderFail, unavailable("timeout")},
	{rpctypes.ErrTimeoutDueToConnectionLost, unavailable("timeout")},
	{rpctypes.ErrTimeoutWaitAppliedIndex, unavailable("timeout")},
	{rpctypes.ErrNoLeader, unavailable("no_leader")},
	{rpctypes.ErrNotLeader, unavailable("no_leader")},
	{rpctypes.ErrLeaderChanged, unavailable("leader_changed")},
	{rpctypes.ErrNoSpace, unavailable("no_space")},
	{rpctypes.ErrStopped, unavailable("stopped")},
	{rpctypes.ErrUnhealthy, unavailable("unhealthy")},
	{rpctypes.ErrTooManyRequests, unavailable("too_many_requests")},
	{rpctypes.ErrInvalidAuthToken, unavailable("auth_token_expired")},
	{rpctypes.ErrRequestTooLarge, invalid("request_too_large")},
	{rpctypes.ErrTooManyOps, invalid("too_many_ops")},
	{rpctypes.ErrDuplicateKey, invalid("duplicate_key")},
	{rpctypes.ErrLeaseTTLTooLarge, invalid("ttl_too_large")},
	{rpctypes.ErrFutureRev, invalid("future_revision")},
	{rpctypes.ErrPermissionDenied, internal("etcd_permission_denied")},
	{rpctypes.ErrAuthFailed, internal("etcd_auth_failed")},
	{rpctypes.ErrCorrupt, internal("corrupt")},
}

// classifyEtcd finds etcd's typed error in err's chain, either as the
// client's rpctypes.EtcdError or as the raw gRPC status etcd sent (which
// rpctypes.Error converts where etcd knows how), and returns its class
// and the etcd error. An rpctypes.EtcdError outside etcdClasses is
// UNAVAILABLE if etcd itself says so, INTERNAL otherwise.
func classifyEtcd(err error) (etcdClass, error, bool) {
	var etcdErr error
	var ee rpctypes.EtcdError
	var se interface{ GRPCStatus() *status.Status }
	switch {
	case errors.As(err, &ee):
		etcdErr = ee
	case errors.As(err, &se):
		etcdErr = rpctypes.Error(se.GRPCStatus().Err())
	default:
		return etcdClass{}, nil, false
	}
	for _, c := range etcdClasses {
		if errors.Is(etcdErr, c.err) {
			return c.etcdClass, etcdErr, true
		}
	}
	if ee, ok := etcdErr.(rpctypes.EtcdError); ok {
		if ee.Code() == codes.Unavailable {
			return unavailable("etcd_unavailable"), ee, true
		}
		return internal("etcd_error"), ee, true
	}
	return etcdClass{}, nil, false
}
