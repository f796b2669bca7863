// Package seam holds the settings of a client.Session that its options
// set. client.SessionOption is a func(*SessionConfig): package client's
// own options (WithTTL, WithEndEarly, WithDeadlineFunc) set the
// production fields, and package clienttest's (WithHooks, WithRetry) set
// the test-only ones, Retry and Hooks. That is how the test hooks reach a
// session without being part of client's API: Go's internal rule lets
// only packages of the client module import seam, so no other code can
// name SessionConfig or build an option that sets them.
//
// There is no function variable and no init(): client and clienttest name
// the same typed fields, so a change to a field or a hook's signature on
// one side fails to compile on the other (clienttest converts its
// SessionHooks to Hooks, which needs identical fields), rather than
// panicking at run time.
//
// seam imports nothing outside the standard library and the client
// module's own requirements (backoff, token, fencerv1).
package seam

import (
	"context"
	"time"

	"github.com/cenkalti/backoff/v5"

	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
	"github.com/fencer-dev/fencer/token"
)

// SessionConfig is what a session is built from. client.NewSession starts
// from the defaults, applies the options in order, and validates the
// result; nothing here is validated by seam.
type SessionConfig struct {
	TTL        time.Duration                                   // client.WithTTL
	EndEarly   time.Duration                                   // client.WithEndEarly
	OnDeadline func(end time.Time)                             // client.WithDeadlineFunc; nil if not set
	Retry      func(maxInterval time.Duration) backoff.BackOff // paces reconnects; clienttest.WithRetry
	Hooks      Hooks                                           // clienttest.WithHooks
}

// Hooks stop a session at the points where a loss could slip between an
// acquisition and the session's watch, and replace the watch's checks. A
// nil hook does nothing; each is nil outside tests. Its fields are
// clienttest.SessionHooks', which is converted to it.
type Hooks struct {
	Acquired func(token.Token)                        // the Acquire call returned; before the Lease is registered
	Watch    func(from int64)                         // before each WatchLease call
	Received func(*fencerv1.WatchLeaseResponse)       // a message from the watch has been applied
	Check    func(context.Context, token.Token) error // instead of Client.Check, for the watch's checks
	JoinRing func(ring string)                        // before each JoinRing call of a Ring that joins again
}
