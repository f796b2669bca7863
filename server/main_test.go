package server_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"

	"github.com/fencer-dev/fencer/client"
	"github.com/fencer-dev/fencer/embedetcd"
	"github.com/fencer-dev/fencer/etcdstore"
	"github.com/fencer-dev/fencer/server"
)

// shared is one embedded etcd member for the tests that do not stop it.
var shared *embedetcd.Server

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "server-test-")
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	shared, err = embedetcd.Start(ctx, embedetcd.Member{Name: "shared", Dir: dir})
	cancel()
	if err != nil {
		panic(err)
	}
	code := m.Run()
	shared.Close()
	os.RemoveAll(dir)
	if code == 0 {
		if err := goleak.Find(
			goleak.IgnoreTopFunction("google.golang.org/grpc/internal/grpcsync.(*CallbackSerializer).run"),
			goleak.IgnoreAnyFunction("go.etcd.io/etcd/pkg/v3/schedule.(*fifo).run"),
			// Embedded etcd members' peer HTTP connections close
			// asynchronously after the cluster test stops its members.
			goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
			goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"),
			goleak.IgnoreAnyFunction("net/http.(*conn).serve"),
			goleak.IgnoreAnyFunction("net/http.(*connReader).backgroundRead"),
		); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

var prefixSeq atomic.Int64

// newStore returns a store under a fresh prefix on endpoints (default: the
// shared member).
func newStore(t testing.TB, endpoints ...string) *etcdstore.Store {
	t.Helper()
	if len(endpoints) == 0 {
		endpoints = []string{shared.Endpoint()}
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	require.NoError(t, err)
	t.Cleanup(func() { cli.Close() })
	name := strings.NewReplacer("/", "-", " ", "-").Replace(t.Name())
	st, err := etcdstore.New(cli, etcdstore.WithPrefix(fmt.Sprintf("/test-%s-%d/", name, prefixSeq.Add(1))))
	require.NoError(t, err)
	return st
}

// sameStore returns a store with its own etcd client on st's prefix.
func sameStore(t testing.TB, st *etcdstore.Store, endpoints ...string) *etcdstore.Store {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	require.NoError(t, err)
	t.Cleanup(func() { cli.Close() })
	st2, err := etcdstore.New(cli, etcdstore.WithPrefix(st.Prefix()))
	require.NoError(t, err)
	return st2
}

// testTokens are the bearer tokens of the tests' two principals.
var testTokens = map[string]string{
	"alice-token-0123456789": "alice",
	"bob-token-0123456789ab": "bob",
}

// startServer serves st on a loopback port, in plaintext with the bearer
// tokens of testTokens, and returns its address.
func startServer(t testing.TB, st *etcdstore.Store) (string, *server.Server) {
	t.Helper()
	auth, err := server.NewBearerTokens(testTokens)
	require.NoError(t, err)
	return serve(t, server.Config{Store: st, Authenticator: auth})
}

// serve serves cfg on a loopback port until the test ends and returns its
// address.
func serve(t testing.TB, cfg server.Config) (string, *server.Server) {
	t.Helper()
	srv, err := server.New(cfg)
	require.NoError(t, err)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(lis) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
	})
	return lis.Addr().String(), srv
}

// dial connects to addrs (round-robin when several) in plaintext as the
// principal whose bearer token is tok ("" sends none).
func dial(t testing.TB, tok string, addrs ...string) *grpc.ClientConn {
	t.Helper()
	opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if tok != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(client.BearerToken(tok, false)))
	}
	return dialWith(t, opts, addrs...)
}

// dialWith connects to addrs (round-robin when several) with opts, which
// must set the transport credentials.
func dialWith(t testing.TB, opts []grpc.DialOption, addrs ...string) *grpc.ClientConn {
	t.Helper()
	r := manual.NewBuilderWithScheme(fmt.Sprintf("test%d", prefixSeq.Add(1)))
	var state resolver.State
	for _, a := range addrs {
		state.Addresses = append(state.Addresses, resolver.Address{Addr: a})
	}
	r.InitialState(state)
	opts = append(opts, grpc.WithResolvers(r), grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"round_robin":{}}]}`))
	cc, err := grpc.NewClient(r.Scheme()+":///fencer", opts...)
	require.NoError(t, err)
	t.Cleanup(func() { cc.Close() })
	return cc
}

func newSession(t testing.TB, c *client.Client, opts ...client.SessionOption) *client.Session {
	t.Helper()
	s, err := c.NewSession(opts...)
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

func waitDone(t testing.TB, ch <-chan struct{}, d time.Duration, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(d):
		t.Fatalf("%s: not done within %s", what, d)
	}
}

const (
	alice = "alice-token-0123456789"
	bob   = "bob-token-0123456789ab"
)
