package fencertest

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/fencer-dev/fencer/internal/etcdtest"
)

// LeakOptions are goleak options for a package whose tests use the kit:
// they ignore only goroutines of etcd and grpc that outlive a Close by
// design (grpc's callback serializer, which exits a moment after its
// client closes, and etcd's scheduler). They ignore no net/http
// goroutine: the kit closes its own HTTP connections (kubefencertest
// closes its clients' idle connections before returning), so an HTTP
// connection still open when CheckLeaks runs is the test's. Pass them to
// goleak.VerifyTestMain or goleak.VerifyNone.
func LeakOptions() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreTopFunction("google.golang.org/grpc/internal/grpcsync.(*CallbackSerializer).run"),
		goleak.IgnoreAnyFunction("go.etcd.io/etcd/pkg/v3/schedule.(*fifo).run"),
	}
}

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
func CheckLeaks(code int) int { return etcdtest.CheckLeaksOf(code, LeakOptions()) }
