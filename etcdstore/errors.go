package etcdstore

import (
	"errors"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fencer-dev/fencer/token"
)

// Sentinel errors of the store. Token errors (stale, not held, held by
// another, malformed) and the errors that end a lease are the token
// package's; the names below are the same values, so errors.Is matches
// either name whichever package returned the error.
var (
	// ErrInvalidArgument is token.ErrInvalidArgument: a name, key or value
	// was rejected before anything was sent to etcd.
	ErrInvalidArgument = token.ErrInvalidArgument
	// ErrReleased is token.ErrReleased: it ends a Lease that its holder
	// released.
	ErrReleased = token.ErrReleased
	// ErrSessionClosed is token.ErrSessionClosed: it ends the leases of a
	// Session that was closed.
	ErrSessionClosed = token.ErrSessionClosed
	// ErrSessionExpired is token.ErrSessionExpired: it ends the leases of a
	// Session whose etcd lease expired or could not be renewed before its
	// local deadline.
	ErrSessionExpired = token.ErrSessionExpired
	// ErrLeaseLost is token.ErrLeaseLost: it ends a Lease whose holder key
	// was deleted or replaced by someone else.
	ErrLeaseLost = token.ErrLeaseLost
	// ErrAlreadyHeld means the session already holds the lease it was
	// asked to acquire; a session holds a lease at most once at a time.
	ErrAlreadyHeld = errors.New("etcdstore: lease already held by this session")
	// ErrCondition means the caller's own compares failed in an
	// acquisition on an etcd lease the caller keeps alive itself (the
	// service's remote sessions, through Store.AcquireOn).
	ErrCondition = errors.New("etcdstore: acquire condition failed")
)

// ArgumentError is token.ArgumentError: it says which argument was invalid
// and why, and wraps ErrInvalidArgument.
type ArgumentError = token.ArgumentError

func invalid(arg, value, reason string) error { return token.InvalidArgument(arg, value, reason) }

// OverSendLimit reports whether err is the etcd client's refusal of a
// request larger than its send limit (2 MiB unless the client was
// configured otherwise): a gRPC ResourceExhausted that is not one of
// etcd's own errors (etcd's ResourceExhausted errors, too many requests
// and no space, are typed), whether the client converted those or not.
// Such a request never reached etcd, so nothing of it was written, and
// sending it again fails again. It does not tell
// that refusal from gRPC's rarer ResourceExhausted errors on the client's
// side (a response over the client's receive limit, an HTTP/2 stream reset
// with FLOW_CONTROL or ENHANCE_YOUR_CALM), which it reports the same way.
func OverSendLimit(err error) bool {
	var se interface{ GRPCStatus() *status.Status }
	if !errors.As(err, &se) || se.GRPCStatus().Code() != codes.ResourceExhausted {
		return false // etcd's errors as the client returns them have no GRPCStatus
	}
	_, etcds := rpctypes.Error(se.GRPCStatus().Err()).(rpctypes.EtcdError)
	return !etcds
}
