package etcdstore

import (
	"errors"
	"fmt"
)

// Sentinel errors of the store. Token errors (stale, not held, held by
// another, malformed) are the token package's.
var (
	// ErrInvalidArgument means a name, key or value was rejected before
	// anything was sent to etcd.
	ErrInvalidArgument = errors.New("etcdstore: invalid argument")
	// ErrReleased ends a Lease that its holder released.
	ErrReleased = errors.New("etcdstore: lease released")
	// ErrSessionClosed ends the leases of a Session that was closed.
	ErrSessionClosed = errors.New("etcdstore: session closed")
	// ErrSessionExpired ends the leases of a Session whose etcd lease
	// expired or could not be renewed before its local deadline.
	ErrSessionExpired = errors.New("etcdstore: session expired")
	// ErrLeaseLost ends a Lease whose holder key was deleted or replaced
	// by someone else.
	ErrLeaseLost = errors.New("etcdstore: lease lost")
	// ErrAlreadyHeld means the session already holds the lease it was
	// asked to acquire; a session holds a lease at most once at a time.
	ErrAlreadyHeld = errors.New("etcdstore: lease already held by this session")
	// ErrCondition means the caller's own compares in TryAcquireOn failed.
	ErrCondition = errors.New("etcdstore: acquire condition failed")
)

// ArgumentError says which argument was invalid and why. It wraps
// ErrInvalidArgument.
type ArgumentError struct {
	// Arg names the argument, such as "name" or "key".
	Arg string
	// Value is the offending value, truncated to 64 bytes.
	Value string
	// Reason says what is wrong.
	Reason string
}

// Error describes the error for people; match it with errors.Is or errors.As, never by its text.
func (e *ArgumentError) Error() string {
	return fmt.Sprintf("etcdstore: invalid %s %q: %s", e.Arg, e.Value, e.Reason)
}

// Unwrap returns ErrInvalidArgument.
func (e *ArgumentError) Unwrap() error { return ErrInvalidArgument }

func invalid(arg, value, reason string) error {
	if len(value) > 64 {
		value = value[:64]
	}
	return &ArgumentError{Arg: arg, Value: value, Reason: reason}
}
