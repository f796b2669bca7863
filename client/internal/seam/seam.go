// Package seam carries the test hooks of package client's sessions to
// package clienttest, so that tests outside the client module (against a
// real server) can reach them while client's own API does not offer them.
// Package client sets the variables in its init; only client and
// clienttest import seam.
//
// seam must import nothing outside the standard library and the client
// module's own requirements.
package seam

// WithHooks, set by package client, is a func(client.SessionHooks-like
// fields) returning a client.SessionOption; see clienttest.WithHooks.
// WithRetry is a func(func(time.Duration) backoff.BackOff) returning a
// client.SessionOption; see clienttest.WithRetry. They are typed any
// because seam cannot name client's types without an import cycle.
var (
	WithHooks any
	WithRetry any
)
