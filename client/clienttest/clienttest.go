// Package clienttest holds the test hooks of package client's sessions,
// for tests that drive a client.Session against a real fencer server and
// must stop it at an exact point. Nothing here is for production use.
//
// Its options set the test-only fields of the session settings that
// package client's options set too (client/internal/seam's
// SessionConfig), so they are typed end to end: a hook whose signature
// changes here or in client fails to compile, not to run.
//
// clienttest imports only package client and the client module's own
// requirements: no etcd server code and no Kubernetes module.
package clienttest

import (
	"context"
	"time"

	"github.com/cenkalti/backoff/v5"

	"github.com/fencer-dev/fencer/client"
	"github.com/fencer-dev/fencer/client/internal/seam"
	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
	"github.com/fencer-dev/fencer/token"
)

// SessionHooks stop a session at the points where a loss could slip
// between an acquisition and the session's watch. A nil hook does nothing.
type SessionHooks struct {
	Acquired func(token.Token)                        // the Acquire call returned; before the Lease is registered
	Watch    func(from int64)                         // before each WatchLease call
	Received func(*fencerv1.WatchLeaseResponse)       // a message from the watch has been applied
	Check    func(context.Context, token.Token) error // instead of Client.Check, for the watch's checks
	JoinRing func(ring string)                        // before each JoinRing call of a Ring that joins again
}

// WithHooks sets a session's test hooks.
func WithHooks(h SessionHooks) client.SessionOption {
	return func(c *seam.SessionConfig) { c.Hooks = seam.Hooks(h) }
}

// WithRetry sets the backoff that paces a session's reconnects;
// newBackOff is given the cap the session would use.
func WithRetry(newBackOff func(maxInterval time.Duration) backoff.BackOff) client.SessionOption {
	return func(c *seam.SessionConfig) { c.Retry = newBackOff }
}
