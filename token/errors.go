package token

import (
	"errors"
	"fmt"
	"time"
)

// Sentinel errors. Match them with errors.Is; the struct errors below wrap
// them and carry details for errors.As.
var (
	// ErrStale means a write presented a token that a newer token of the
	// same lease has superseded, or that is no longer the lease's current
	// token.
	ErrStale = errors.New("token: stale")
	// ErrNotHeld means the lease is not held (never acquired, released,
	// expired or lost).
	ErrNotHeld = errors.New("token: lease not held")
	// ErrHeldByAnother means another holder holds the lease.
	ErrHeldByAnother = errors.New("token: lease held by another")
	// ErrForeignLease means two tokens, or a token and an object, belong to
	// different leases.
	ErrForeignLease = errors.New("token: foreign lease")
	// ErrMalformed means a token or its text or annotation form is invalid.
	ErrMalformed = errors.New("token: malformed")
	// ErrLockDelay means the lease is free but inside its lock-delay: its
	// last acquisition ended without a clean release by its holder
	// (expiry, a deleted holder record, a release by someone else), and
	// the store refuses a new acquisition until the delay has passed on
	// the store's clock. It is distinct from ErrHeldByAnother: nobody
	// holds the lease.
	ErrLockDelay = errors.New("token: lease in lock-delay")
)

// LockDelayError reports a free lease whose lock-delay has not passed. It
// wraps ErrLockDelay.
type LockDelayError struct {
	// Lease is the lease that may not be acquired yet.
	Lease string
	// Delay is the lock-delay set by the acquisition that ended, when
	// known; 0 when unknown.
	Delay time.Duration
	// Remaining is an estimate of how long the delay still runs, read from
	// the store when the error was made; 0 when unknown. The store decides
	// when it ends, not this estimate.
	Remaining time.Duration
}

// Error describes the error for people; match it with errors.Is or errors.As, never by its text.
func (e *LockDelayError) Error() string {
	msg := fmt.Sprintf("token: lease %q in lock-delay", e.Lease)
	if e.Delay > 0 {
		msg += fmt.Sprintf(" of %s", e.Delay)
	}
	if e.Remaining > 0 {
		msg += fmt.Sprintf(", about %s left", e.Remaining)
	}
	return msg + ": its last holder did not release it cleanly"
}

// Unwrap returns ErrLockDelay.
func (e *LockDelayError) Unwrap() error { return ErrLockDelay }

// Explain says for people, without Error's "token:" prefix, that the lease
// is in its lock-delay and why: the text the service and the CLI show.
func (e *LockDelayError) Explain() string {
	msg := fmt.Sprintf("lease %q is in its lock-delay", e.Lease)
	if e.Delay > 0 {
		msg += " of " + e.Delay.String()
	}
	if e.Remaining > 0 {
		msg += fmt.Sprintf(" (about %s left)", e.Remaining)
	}
	return msg + ": its last holder did not release it cleanly, so nobody can acquire it until the delay has passed"
}

// StaleError reports a token that has been superseded. It wraps ErrStale.
type StaleError struct {
	// Token is the token that was presented.
	Token Token
	// Newer is the superseding token when the store reported it; it is the
	// zero Token when unknown.
	Newer Token
}

// Error describes the error for people; match it with errors.Is or errors.As, never by its text.
func (e *StaleError) Error() string {
	if e.Newer.IsZero() {
		return fmt.Sprintf("token: stale: %s is no longer current", e.Token)
	}
	return fmt.Sprintf("token: stale: %s is superseded by %s", e.Token, e.Newer)
}

// Unwrap returns ErrStale.
func (e *StaleError) Unwrap() error { return ErrStale }

// HeldError reports a lease held by another holder. It wraps
// ErrHeldByAnother.
type HeldError struct {
	// Lease is the contended lease.
	Lease string
	// Holder identifies the current holder, when known.
	Holder string
}

// Error describes the error for people; match it with errors.Is or errors.As, never by its text.
func (e *HeldError) Error() string {
	if e.Holder == "" {
		return fmt.Sprintf("token: lease %q held by another", e.Lease)
	}
	return fmt.Sprintf("token: lease %q held by another: %s", e.Lease, e.Holder)
}

// Unwrap returns ErrHeldByAnother.
func (e *HeldError) Unwrap() error { return ErrHeldByAnother }

// ForeignLeaseError reports a token or object of another lease. It wraps
// ErrForeignLease.
type ForeignLeaseError struct {
	// Want is the lease the caller holds or expected.
	Want string
	// Got is the lease that was found.
	Got string
}

// Error describes the error for people; match it with errors.Is or errors.As, never by its text.
func (e *ForeignLeaseError) Error() string {
	return fmt.Sprintf("token: foreign lease: want %q, got %q", e.Want, e.Got)
}

// Unwrap returns ErrForeignLease.
func (e *ForeignLeaseError) Unwrap() error { return ErrForeignLease }

// MalformedError reports invalid input. It wraps ErrMalformed.
type MalformedError struct {
	// Field names what was invalid, such as "revision" or an annotation key.
	Field string
	// Input is the offending value, truncated to 64 bytes.
	Input string
	// Reason says what is wrong with it.
	Reason string
}

// Error describes the error for people; match it with errors.Is or errors.As, never by its text.
func (e *MalformedError) Error() string {
	return fmt.Sprintf("token: malformed %s %q: %s", e.Field, e.Input, e.Reason)
}

// Unwrap returns ErrMalformed.
func (e *MalformedError) Unwrap() error { return ErrMalformed }

func malformed(field, input, reason string) error {
	return &MalformedError{Field: field, Input: truncate(input), Reason: reason}
}

// Errors that end a held lease or reject an argument, shared by every
// package that holds leases (etcdstore, client, kubeadapter) so that
// errors.Is answers the same whichever kind of lease ended. The errors a
// Holder's Err returns wrap one of them and also match ErrNotHeld.
var (
	// ErrReleased ends a lease that its holder released.
	ErrReleased = errors.New("token: lease released")
	// ErrLeaseLost ends a lease whose holder record was deleted or
	// replaced by someone else.
	ErrLeaseLost = errors.New("token: lease lost")
	// ErrSessionClosed ends the leases of a session that was closed.
	ErrSessionClosed = errors.New("token: session closed")
	// ErrSessionExpired ends the leases of a session whose store lease
	// expired or could not be renewed before its local deadline.
	ErrSessionExpired = errors.New("token: session expired")
	// ErrInvalidArgument means a name, key or value was rejected before
	// anything was sent to the store.
	ErrInvalidArgument = errors.New("token: invalid argument")
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
	return fmt.Sprintf("token: invalid %s %q: %s", e.Arg, e.Value, e.Reason)
}

// Unwrap returns ErrInvalidArgument.
func (e *ArgumentError) Unwrap() error { return ErrInvalidArgument }

// InvalidArgument returns an *ArgumentError for arg, with value truncated
// to 64 bytes.
func InvalidArgument(arg, value, reason string) error {
	return &ArgumentError{Arg: arg, Value: truncate(value), Reason: reason}
}

func truncate(s string) string {
	if len(s) > 64 {
		return s[:64]
	}
	return s
}
