package client

import (
	"context"
	"time"

	"github.com/cenkalti/backoff/v5"

	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
	"github.com/fencer-dev/fencer/token"
)

// SessionHooks stop a session at the points where a loss could slip
// between an acquisition and the session's watch; see sessionHooks.
type SessionHooks struct {
	Acquired func(token.Token)                        // the Acquire call returned; before the Lease is registered
	Watch    func(from int64)                         // before each WatchLease call
	Received func(*fencerv1.WatchLeaseResponse)       // a message from the watch has been applied
	Check    func(context.Context, token.Token) error // instead of Client.Check, for the watch's checks
}

// WithHooks sets a session's test hooks.
func WithHooks(h SessionHooks) SessionOption {
	return func(s *Session) {
		s.hooks = sessionHooks{acquired: h.Acquired, watch: h.Watch, received: h.Received, check: h.Check}
	}
}

// WithRetry sets the backoff that paces a session's reconnects;
// newBackOff is given the cap the session would use.
func WithRetry(newBackOff func(maxInterval time.Duration) backoff.BackOff) SessionOption {
	return func(s *Session) { s.retry = newBackOff }
}
