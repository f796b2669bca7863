package etcdstore_test

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

// shared is one embedded etcd member for the tests that do not stop it,
// started on first use so that fuzz workers never start one.
var shared struct {
	once sync.Once
	dir  string
	srv  *embedetcd.Server
	err  error
}

// sharedEndpoint returns the client URL of the shared member.
func sharedEndpoint(t testing.TB) string {
	t.Helper()
	shared.once.Do(func() {
		shared.dir, shared.err = os.MkdirTemp("", "etcdstore-test-")
		if shared.err != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		shared.srv, shared.err = embedetcd.Start(ctx, embedetcd.Member{Name: "shared", Dir: shared.dir})
	})
	require.NoError(t, shared.err)
	return shared.srv.Endpoint()
}

func TestMain(m *testing.M) {
	code := m.Run()
	if shared.srv != nil {
		shared.srv.Close()
	}
	if shared.dir != "" {
		os.RemoveAll(shared.dir)
	}
	if code == 0 {
		if err := goleak.Find(goleakOptions()...); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

func goleakOptions() []goleak.Option {
	return []goleak.Option{
		// grpc-go's callback serializer exits shortly after the client closes.
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

var prefixSeq atomic.Int64

// newStore returns a store under a fresh prefix on the shared member, with
// a client that is closed when the test ends.
func newStore(t testing.TB, endpoints ...string) *etcdstore.Store {
	t.Helper()
	if len(endpoints) == 0 {
		endpoints = []string{sharedEndpoint(t)}
	}
	cli := newClient(t, endpoints...)
	st, err := etcdstore.New(cli, etcdstore.WithPrefix(fmt.Sprintf("/test-%s-%d/", t.Name(), prefixSeq.Add(1))))
	require.NoError(t, err)
	return st
}

func newClient(t testing.TB, endpoints ...string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	require.NoError(t, err)
	t.Cleanup(func() { cli.Close() })
	return cli
}

func newSession(t testing.TB, st *etcdstore.Store, opts ...etcdstore.SessionOption) *etcdstore.Session {
	t.Helper()
	s, err := st.NewSession(context.Background(), opts...)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.Close(ctx)
	})
	return s
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// waitDone fails the test if ch is not closed within d.
func waitDone(t testing.TB, ch <-chan struct{}, d time.Duration, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(d):
		t.Fatalf("%s: not done within %s", what, d)
	}
}
