// Package etcdtest gives fencer's tests real etcd: embedded members from
// embedetcd, clients for them, and the goroutine-leak rules that go with
// them, which the public kit (package fencertest) shares. It must not
// import fencertest: the kit imports the client and server packages,
// whose internal tests use etcdtest.
//
// One member per test binary is shared by the tests that do not stop it;
// tests that stop, restart or partition etcd start their own with Start.
package etcdtest

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/fencer-dev/fencer/embedetcd"
	"github.com/fencer-dev/fencer/etcdstore"
)

var shared struct {
	once sync.Once
	dir  string
	srv  *embedetcd.Server
	err  error
}

// Shared returns the client URL of the test binary's shared member,
// starting it on first use, so that fuzz workers and tests that need no
// etcd start none. StopShared stops it.
func Shared(tb testing.TB) string {
	tb.Helper()
	shared.once.Do(func() {
		if shared.dir, shared.err = os.MkdirTemp("", "fencer-etcd-"); shared.err != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		shared.srv, shared.err = embedetcd.Start(ctx, embedetcd.Member{Name: "shared", Dir: shared.dir})
	})
	require.NoError(tb, shared.err)
	return shared.srv.Endpoint()
}

// StopShared stops the shared member, if it was started, and removes its
// data. Call it from TestMain after m.Run.
func StopShared() {
	if shared.srv != nil {
		shared.srv.Close()
	}
	if shared.dir != "" {
		os.RemoveAll(shared.dir)
	}
}

// Start runs a member of its own in a temporary directory of tb until tb
// ends.
func Start(tb testing.TB) *embedetcd.Server {
	tb.Helper()
	srv, err := embedetcd.Start(Context(tb), embedetcd.Member{Name: "test", Dir: tb.TempDir()})
	require.NoError(tb, err)
	tb.Cleanup(srv.Close)
	return srv
}

// Client returns an etcd client for endpoints (the shared member when none
// are given) that is closed when tb ends.
func Client(tb testing.TB, endpoints ...string) *clientv3.Client {
	tb.Helper()
	if len(endpoints) == 0 {
		endpoints = []string{Shared(tb)}
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	require.NoError(tb, err)
	tb.Cleanup(func() { cli.Close() })
	return cli
}

var prefixSeq atomic.Int64

// Store returns an etcdstore.Store under a prefix of its own, on endpoints
// (the shared member when none are given), so that tests sharing a member
// do not see each other's keys.
func Store(tb testing.TB, endpoints ...string) *etcdstore.Store {
	tb.Helper()
	st, err := etcdstore.New(Client(tb, endpoints...), etcdstore.WithPrefix(fmt.Sprintf("/test-%d/", prefixSeq.Add(1))))
	require.NoError(tb, err)
	return st
}

// Context returns a context that ends after 30 seconds or with tb.
func Context(tb testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	tb.Cleanup(cancel)
	return ctx
}

// WaitClosed fails tb unless ch is closed within d.
func WaitClosed(tb testing.TB, ch <-chan struct{}, d time.Duration, what string) {
	tb.Helper()
	select {
	case <-ch:
	case <-time.After(d):
		tb.Fatalf("%s: not done within %s", what, d)
	}
}

// LeakOptions are the goleak options for a package whose tests run
// embedded etcd members and etcd or gRPC clients. They ignore only
// goroutines that outlive a Close by design:
//   - grpc-go's callback serializer, which exits a moment after its client
//     closes, and etcd's scheduler (schedule.(*fifo).run);
//   - four net/http functions, for in-process clusters of several
//     members: members talk raft over keep-alive HTTP/1 connections whose
//     client loops (persistConn.readLoop and writeLoop) and server side
//     (conn.serve, connReader.backgroundRead) outlive a member's Close
//     until their idle timeout. These also hide any other HTTP/1
//     connection a test leaves open; HTTP/2 connections (client-go's to a
//     kube-apiserver) are not ignored.
//
// fencertest.LeakOptions, for the public kit, whose members are one per
// process, leaves the net/http entries out.
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

// Main runs a test binary's tests, stops the shared member, and fails the
// run if goroutines leaked. Call it as TestMain's only statement.
func Main(m *testing.M) {
	code := m.Run()
	StopShared()
	os.Exit(CheckLeaks(code))
}

// CheckLeaks returns code, the exit code of m.Run, or 1 if code is 0 but
// goroutines other than those LeakOptions ignores are still running, which
// it reports on standard error.
func CheckLeaks(code int) int { return CheckLeaksOf(code, LeakOptions()) }

// CheckLeaksOf is CheckLeaks with the goleak options opts instead of
// LeakOptions.
func CheckLeaksOf(code int, opts []goleak.Option) int {
	if code != 0 {
		return code
	}
	if err := goleak.Find(opts...); err != nil {
		fmt.Fprintln(os.Stderr, "goleak:", err)
		return 1
	}
	return 0
}
