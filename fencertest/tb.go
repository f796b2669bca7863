package fencertest

import (
	"context"
	"time"
)

// TB is the part of testing.TB the kit uses: *testing.T, *testing.B and
// *testing.F implement it. Everything the kit starts for a TB is stopped by
// a function it registers with Cleanup; a failure to start calls Fatalf.
type TB interface {
	Helper()
	Cleanup(f func())
	Fatalf(format string, args ...any)
	TempDir() string
}

// Timeout bounds each step the kit takes on the caller's behalf: starting
// etcd or the service, and each write of Supersede.
const Timeout = time.Minute

// stepContext returns a context that ends after Timeout, and its cancel.
func stepContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), Timeout)
}
