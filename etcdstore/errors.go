package etcdstore

import (
	"errors"

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
	// service's remote sessions, through internal/acquireon).
	ErrCondition = errors.New("etcdstore: acquire condition failed")
)

// ArgumentError is token.ArgumentError: it says which argument was invalid
// and why, and wraps ErrInvalidArgument.
type ArgumentError = token.ArgumentError

func invalid(arg, value, reason string) error { return token.InvalidArgument(arg, value, reason) }
