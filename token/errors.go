package token

import (
	"errors"
	"fmt"
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
)

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
	if len(input) > 64 {
		input = input[:64]
	}
	return &MalformedError{Field: field, Input: input, Reason: reason}
}
