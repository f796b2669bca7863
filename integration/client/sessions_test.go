package client_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/fencer-dev/fencer/client"
	"github.com/fencer-dev/fencer/fencertest"
	"github.com/fencer-dev/fencer/internal/testkit/rpcfault"
	"github.com/fencer-dev/fencer/server"
)

const sessionsMethod = "/fencer.v1.FencerService/Sessions"

// countedService serves a store of its own to anonymous callers and
// returns the server, a client whose calls go through the returned
// injector, and a plain client.
func countedService(t *testing.T) (*server.Server, *client.Client, *rpcfault.Injector, *client.Client) {
	t.Helper()
	addr, srv := fencertest.Serve(t, server.Config{Store: fencertest.SharedStore(t), Authenticator: server.Anonymous("tester")})
	dial := func(opts ...grpc.DialOption) *client.Client {
		cc, err := grpc.NewClient(addr, append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))...)
		require.NoError(t, err)
		t.Cleanup(func() { cc.Close() })
		return client.New(cc)
	}
	in := rpcfault.New()
	return srv, dial(in.DialOptions()...), in, dial()
}

// streams sums the server's grpc_server_<what>_total series of method.
func streams(t *testing.T, srv *server.Server, what, method string) float64 {
	t.Helper()
	rec := httptest.NewRecorder()
	srv.MetricsHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	sum := 0.0
	for _, line := range strings.Split(rec.Body.String(), "\n") {
		if strings.HasPrefix(line, "grpc_server_"+what+"_total{") && strings.Contains(line, `grpc_method="`+method+`"`) {
			v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
			require.NoError(t, err)
			sum += v
		}
	}
	return sum
}

// TestClientSessionsShareOneStream: twenty sessions of one Client renew
// and watch over one Sessions stream, and no KeepAlive or WatchLease
// stream; a loss ends its own lease only; the stream ends with the last
// session.
func TestClientSessionsShareOneStream(t *testing.T) {
	ctx := fencertest.Context(t)
	srv, c, _, plain := countedService(t)
	const n = 20
	sessions := make([]*client.Session, n)
	leases := make([]*client.Lease, n)
	for i := range sessions {
		s, err := c.NewSession(client.WithTTL(3 * time.Second))
		require.NoError(t, err)
		sessions[i] = s
		leases[i], err = s.Acquire(ctx, fmt.Sprintf("shared-%d", i))
		require.NoError(t, err)
	}
	time.Sleep(2500 * time.Millisecond) // every session renews at least once
	require.Equal(t, 1.0, streams(t, srv, "started", "Sessions"), "Sessions streams")
	require.Zero(t, streams(t, srv, "started", "KeepAlive"), "KeepAlive streams")
	require.Zero(t, streams(t, srv, "started", "WatchLease"), "WatchLease streams")

	released, err := plain.Release(ctx, leases[7].Token())
	require.NoError(t, err)
	require.True(t, released)
	fencertest.WaitClosed(t, leases[7].Done(), 10*time.Second, "Done of the released lease")
	time.Sleep(500 * time.Millisecond)
	for i, l := range leases {
		if i != 7 {
			require.NoError(t, l.Err(), "lease %d", i)
		}
	}

	for _, s := range sessions[1:] {
		require.NoError(t, s.Close(ctx))
	}
	require.Zero(t, streams(t, srv, "handled", "Sessions"), "the stream ended while a session still used it")
	require.NoError(t, leases[0].Err())
	require.NoError(t, sessions[0].Close(ctx))
	require.Eventually(t, func() bool { return streams(t, srv, "handled", "Sessions") == 1 }, 5*time.Second, 20*time.Millisecond,
		"the Sessions stream outlived the Client's last session")
}

// TestClientFallsBackWithoutSessions: against a server that answers
// Sessions with UNIMPLEMENTED, a session renews over a KeepAlive stream
// and watches over a WatchLease stream of its own, and still hears of a
// loss.
func TestClientFallsBackWithoutSessions(t *testing.T) {
	ctx := fencertest.Context(t)
	srv, c, in, plain := countedService(t)
	in.Start(status.Error(codes.Unimplemented, "unknown method Sessions"), sessionsMethod)
	s := newSession(t, c, client.WithTTL(2*time.Second))
	l, err := s.Acquire(ctx, "fallback")
	require.NoError(t, err)
	time.Sleep(3 * time.Second) // past the TTL: renewed, or ended
	require.NoError(t, l.Err(), "the session was not renewed without Sessions")
	require.Positive(t, streams(t, srv, "started", "KeepAlive"), "KeepAlive streams")
	require.Positive(t, streams(t, srv, "started", "WatchLease"), "WatchLease streams")
	require.Zero(t, streams(t, srv, "started", "Sessions"), "Sessions streams reached the server")

	released, err := plain.Release(ctx, l.Token())
	require.NoError(t, err)
	require.True(t, released)
	fencertest.WaitClosed(t, l.Done(), 10*time.Second, "Done of the released lease")
}

// TestClientSessionsSurviveABrokenStream: the Sessions stream breaks; a
// lease released meanwhile ends once it is back, and the other sessions,
// renewed again in time, live on.
func TestClientSessionsSurviveABrokenStream(t *testing.T) {
	ctx := fencertest.Context(t)
	srv, c, in, plain := countedService(t)
	var leases []*client.Lease
	for i := range 3 {
		l, err := newSession(t, c, client.WithTTL(6*time.Second)).Acquire(ctx, fmt.Sprintf("broken-%d", i))
		require.NoError(t, err)
		leases = append(leases, l)
	}
	in.Start(status.Error(codes.Unavailable, "test: the stream broke"), sessionsMethod)
	released, err := plain.Release(ctx, leases[1].Token())
	require.NoError(t, err)
	require.True(t, released)
	time.Sleep(time.Second)
	require.NoError(t, leases[1].Err(), "the lease heard of its release while its stream was down")
	in.Stop()
	fencertest.WaitClosed(t, leases[1].Done(), 10*time.Second, "Done of the lease released while the stream was down")
	time.Sleep(6 * time.Second) // past the TTL
	require.NoError(t, leases[0].Err())
	require.NoError(t, leases[2].Err())
	require.GreaterOrEqual(t, streams(t, srv, "started", "Sessions"), 2.0, "the client opened no new stream")
}
