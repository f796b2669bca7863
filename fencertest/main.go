package fencertest

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// LeakOptions are goleak options for a package whose tests use the kit:
// they ignore only goroutines of etcd and grpc that outlive a Close by
// design (grpc's callback serializer, which exits a moment after its
// client closes, and etcd's scheduler). They ignore no net/http
// goroutine: the kit closes its own HTTP connections (kubefencertest
// closes its clients' idle connections before returning), so an HTTP
// connection still open when CheckLeaks runs is the test's, unless
// IgnoreInProcessPeers says otherwise. Pass them to goleak.VerifyTestMain
// or goleak.VerifyNone.
func LeakOptions() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreTopFunction("google.golang.org/grpc/internal/grpcsync.(*CallbackSerializer).run"),
		goleak.IgnoreAnyFunction("go.etcd.io/etcd/pkg/v3/schedule.(*fifo).run"),
	}
}

// LeakOption changes what Main and CheckLeaks count as a leak.
type LeakOption func(*[]goleak.Option)

// IgnoreInProcessPeers is for tests that run several etcd members in one
// process (embedetcd.Start of a cluster): the members talk raft over
// keep-alive HTTP/1 connections whose loops (net/http's
// persistConn.readLoop and writeLoop, conn.serve and
// connReader.backgroundRead) outlive a member's Close until their idle
// timeout. It ignores those four functions, and so also hides any other
// HTTP/1 connection a test leaves open; HTTP/2 connections (client-go's
// to a kube-apiserver) are still counted.
func IgnoreInProcessPeers() LeakOption {
	return func(o *[]goleak.Option) {
		*o = append(*o,
			goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
			goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"),
			goleak.IgnoreAnyFunction("net/http.(*conn).serve"),
			goleak.IgnoreAnyFunction("net/http.(*connReader).backgroundRead"),
		)
	}
}

// Main is a TestMain for packages that use the kit: it calls RunIfMember,
// runs the tests, stops the shared member (StopShared), and fails the run
// if the tests passed but left goroutines behind (see CheckLeaks). Use it
// as TestMain's only statement:
//
//	func TestMain(m *testing.M) { fencertest.Main(m) }
func Main(m *testing.M, opts ...LeakOption) {
	RunIfMember()
	code := m.Run()
	StopShared()
	os.Exit(CheckLeaks(code, opts...))
}

// CheckLeaks returns code, the exit code of m.Run, or 1 if code is 0 but
// goroutines other than those LeakOptions (and opts) ignore are still
// running, which it reports on standard error. Call it after everything
// the tests share has been stopped.
func CheckLeaks(code int, opts ...LeakOption) int {
	if code != 0 {
		return code
	}
	ignore := LeakOptions()
	for _, o := range opts {
		o(&ignore)
	}
	if err := goleak.Find(ignore...); err != nil {
		fmt.Fprintln(os.Stderr, "goleak:", err)
		return 1
	}
	return 0
}
