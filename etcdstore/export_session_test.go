package etcdstore

import (
	"github.com/cenkalti/backoff/v5"

	"github.com/fencer-dev/fencer/token"
)

// SessionHooks stop a session at the points where a change to a holder key
// could slip between an acquisition and the session's watch; see
// sessionHooks.
type SessionHooks struct {
	Acquired func(token.Token)   // after the acquiring Txn, before the Lease is registered
	Watching func(cancel func()) // a watch has started; cancel breaks it
	Resync   func()              // the watch broke; before the holder keys are read again
	Reread   func(rev int64)     // the holder keys were read at rev; before they are applied
	Observed func(rev int64)     // every change up to rev has been applied
}

// WithHooks sets a session's test hooks.
func WithHooks(h SessionHooks) SessionOption {
	return func(c *sessionConfig) {
		c.hooks = sessionHooks{acquired: h.Acquired, watching: h.Watching, resync: h.Resync, reread: h.Reread, observed: h.Observed}
	}
}

// WithRetry sets the backoff that paces a session's watch recovery.
func WithRetry(newBackOff func() backoff.BackOff) SessionOption {
	return func(c *sessionConfig) { c.retry = newBackOff }
}
