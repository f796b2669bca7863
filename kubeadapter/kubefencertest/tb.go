package kubefencertest

import "time"

// TB is the part of testing.TB that Supersede uses: *testing.T, *testing.B
// and *testing.F implement it. A failure calls Fatalf.
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
}

// Timeout bounds each step the kit takes on the caller's behalf: each write
// of Supersede, each install's wait for the API server.
const Timeout = time.Minute
