package server

import (
	"context"
	"errors"
	"fmt"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fencer-dev/fencer/etcdstore"
	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
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
)

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
	st := status.New(code, err.Error())
	details := []*errdetails.ErrorInfo{{Reason: reason, Domain: fencerv1.ErrorDomain, Metadata: md}}
	var fe *fieldError
	if errors.As(err, &fe) {
		desc := err.Error()
		var ae *etcdstore.ArgumentError
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

// classify picks the code, reason and metadata for err.
func classify(err error) (codes.Code, string, map[string]string) {
	var (
		stale     *token.StaleError
		held      *token.HeldError
		foreign   *token.ForeignLeaseError
		malformed *token.MalformedError
		arg       *etcdstore.ArgumentError
		fe        *fieldError
	)
	field := ""
	if errors.As(err, &fe) {
		field = fe.field
	}
	switch {
	case errors.As(err, &stale):
		md := map[string]string{"token": stale.Token.String()}
		if !stale.Newer.IsZero() {
			md["newer_token"] = stale.Newer.String()
		}
		return codes.FailedPrecondition, fencerv1.ReasonStaleToken, md
	case errors.As(err, &held):
		return codes.FailedPrecondition, fencerv1.ReasonHeldByAnother, map[string]string{"lease": held.Lease, "holder": held.Holder}
	case errors.As(err, &foreign):
		return codes.FailedPrecondition, fencerv1.ReasonForeignLease, map[string]string{"want": foreign.Want, "got": foreign.Got}
	case errors.Is(err, token.ErrNotHeld):
		return codes.FailedPrecondition, fencerv1.ReasonLeaseNotHeld, nil
	case errors.As(err, &malformed):
		if field == "" {
			field = malformed.Field
		}
		return codes.InvalidArgument, fencerv1.ReasonInvalidToken, map[string]string{"field": field, "token_field": malformed.Field, "input": malformed.Input, "reason": malformed.Reason}
	case errors.As(err, &arg):
		if field == "" {
			field = arg.Arg
		}
		return codes.InvalidArgument, fencerv1.ReasonInvalidArgument, map[string]string{"field": field, "input": arg.Value, "reason": arg.Reason}
	case errors.Is(err, ErrSessionNotFound), errors.Is(err, rpctypes.ErrLeaseNotFound):
		return codes.NotFound, fencerv1.ReasonSessionNotFound, nil
	case errors.Is(err, ErrPermissionDenied):
		return codes.PermissionDenied, fencerv1.ReasonPermissionDenied, nil
	case errors.Is(err, ErrUnauthenticated):
		return codes.Unauthenticated, fencerv1.ReasonUnauthenticated, nil
	case errors.Is(err, ErrWatchCompacted), errors.Is(err, rpctypes.ErrCompacted):
		return codes.OutOfRange, fencerv1.ReasonWatchCompacted, nil
	case errors.Is(err, errStoreUnavailable), etcdUnavailable(err):
		return codes.Unavailable, fencerv1.ReasonStoreUnavailable, nil
	case errors.Is(err, ErrShuttingDown):
		return codes.Unavailable, fencerv1.ReasonShuttingDown, nil
	case errors.Is(err, context.Canceled):
		return codes.Canceled, fencerv1.ReasonStoreUnavailable, nil
	case errors.Is(err, context.DeadlineExceeded):
		return codes.DeadlineExceeded, fencerv1.ReasonStoreUnavailable, nil
	}
	if st, ok := status.FromError(err); ok {
		switch st.Code() {
		case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled, codes.Aborted, codes.ResourceExhausted:
			return codes.Unavailable, fencerv1.ReasonStoreUnavailable, nil
		}
	}
	return codes.Internal, fencerv1.ReasonInternal, nil
}

// etcdUnavailable reports whether err is etcd saying that it cannot serve
// now, as without a quorum; a write may still have committed.
func etcdUnavailable(err error) bool {
	for _, e := range []error{rpctypes.ErrTimeout, rpctypes.ErrTimeoutDueToLeaderFail, rpctypes.ErrTimeoutDueToConnectionLost,
		rpctypes.ErrNoLeader, rpctypes.ErrLeaderChanged, rpctypes.ErrTimeoutWaitAppliedIndex} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}
