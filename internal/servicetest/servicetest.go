// Package servicetest runs fencer's gRPC server on loopback for tests.
package servicetest

import (
	"testing"

	"github.com/fencer-dev/fencer/fencertest"
	"github.com/fencer-dev/fencer/server"
)

// Serve serves cfg on a free loopback port until tb ends, then shuts the
// server down gracefully, and returns its address and the server
// (fencertest.Serve).
func Serve(tb testing.TB, cfg server.Config) (string, *server.Server) {
	tb.Helper()
	return fencertest.Serve(tb, cfg)
}
