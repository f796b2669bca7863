package fencertest

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// LeakOptions are goleak options for a package whose tests use the kit:
// they ignore only goroutines of etcd and grpc that outlive a Close by
// design. Pass them to goleak.VerifyTestMain or goleak.VerifyNone.
func LeakOptions() []goleak.Option {
	return []goleak.Option{
		// grpc-go's callback serializer exits shortly after a client closes.
		goleak.IgnoreTopFunction("google.golang.org/grpc/internal/grpcsync.(*CallbackSerializer).run"),
		goleak.IgnoreAnyFunction("go.etcd.io/etcd/pkg/v3/schedule.(*fifo).run"),
		// etcd members talk raft over keep-alive HTTP connections that
		// outlive Close until their idle timeout.
		goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreAnyFunction("net/http.(*conn).serve"),
		goleak.IgnoreAnyFunction("net/http.(*connReader).backgroundRead"),
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
func CheckLeaks(code int) int {
	if code != 0 {
		return code
	}
	if err := goleak.Find(LeakOptions()...); err != nil {
		fmt.Fprintln(os.Stderr, "goleak:", err)
		return 1
	}
	return 0
}
