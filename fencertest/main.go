package fencertest

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/fencer-dev/fencer/internal/etcdtest"
)

// LeakOptions are goleak options for a package whose tests use the kit:
// they ignore only goroutines of etcd and grpc that outlive a Close by
// design. Pass them to goleak.VerifyTestMain or goleak.VerifyNone.
func LeakOptions() []goleak.Option { return etcdtest.LeakOptions() }

// Main is a TestMain for packages that use the kit: it calls RunIfMember,
// runs the tests, and fails the run if they passed but left goroutines
// behind (see CheckLeaks). Use it as TestMain's only statement:
//
//	func TestMain(m *testing.M) { fencertest.Main(m) }
func Main(m *testing.M) {
	RunIfMember()
	os.Exit(CheckLeaks(m.Run()))
}

// CheckLeaks returns code, the exit code of m.Run, or 1 if code is 0 but
// goroutines other than those LeakOptions ignores are still running, which
// it reports on standard error. Call it after everything the tests share
// has been stopped.
func CheckLeaks(code int) int { return etcdtest.CheckLeaks(code) }
