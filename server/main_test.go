package server_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"

	"github.com/fencer-dev/fencer/client"
	"github.com/fencer-dev/fencer/etcdstore"
	"github.com/fencer-dev/fencer/fencertest"
	"github.com/fencer-dev/fencer/internal/testkit/etcdproc"
	"github.com/fencer-dev/fencer/server"
)

func TestMain(m *testing.M) {
	etcdproc.RunIfMember()
	fencertest.Main(m, fencertest.IgnoreInProcessPeers())
}

// sameStore returns a store with its own etcd client on st's prefix.
func sameStore(t testing.TB, st *etcdstore.Store, endpoints ...string) *etcdstore.Store {
	t.Helper()
	st2, err := etcdstore.New(fencertest.Client(t, endpoints...), etcdstore.WithPrefix(st.Prefix()))
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
	return fencertest.Serve(t, cfg)
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

// schemeSeq names each test's manual resolver scheme uniquely.
var schemeSeq atomic.Int64

// dialWith connects to addrs (round-robin when several) with opts, which
// must set the transport credentials.
func dialWith(t testing.TB, opts []grpc.DialOption, addrs ...string) *grpc.ClientConn {
	t.Helper()
	r := manual.NewBuilderWithScheme(fmt.Sprintf("test%d", schemeSeq.Add(1)))
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

const (
	alice = "alice-token-0123456789"
	bob   = "bob-token-0123456789ab"
)
