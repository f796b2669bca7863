package client_test

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	testclock "k8s.io/utils/clock/testing"

	"github.com/fencer-dev/fencer/client"
	"github.com/fencer-dev/fencer/etcdstore"
	"github.com/fencer-dev/fencer/fencertest"
	"github.com/fencer-dev/fencer/internal/testkit/rpcfault"
	"github.com/fencer-dev/fencer/server"
)

// TestEndEarly: a session made to end 1s early (TTL 3s) reports, and
// keeps, a deadline 2s after the send time of its opening and of each
// successful renewal, renews every 2s/3, and, cut off from the server,
// ends at that deadline, a second before the server could expire it.
func TestEndEarly(t *testing.T) {
	c, in, clk, _ := fakeClockService(t)
	ends := make(chan time.Time, 16)
	s := newSession(t, c,
		client.WithTTL(3*time.Second), client.WithEndEarly(time.Second),
		client.WithDeadlineFunc(func(end time.Time) { ends <- end }))

	in.Count()
	t0 := clk.Now()
	l, err := s.Acquire(fencertest.Context(t), "early")
	require.NoError(t, err)
	require.Equal(t, t0.Add(2*time.Second), <-ends, "the deadline as the session opens")

	// The keepalive's renewal and expiry timers are set.
	require.Eventually(t, func() bool { return clk.Waiters() >= 2 }, 10*time.Second, time.Millisecond)
	renewal := t0.Add(2 * time.Second / 3)
	clk.SetTime(renewal)
	var end time.Time
	select {
	case end = <-ends:
	case <-time.After(10 * time.Second):
		t.Fatalf("no renewal 2s/3 after the session opened: calls %s, lease %v, waiters %d", rpcfault.Summary(in.Calls()), l.Err(), clk.Waiters())
	}
	require.Equal(t, renewal.Add(2*time.Second), end, "the deadline after a renewal")

	in.Start(status.Error(codes.Unavailable, "partition"))
	defer in.Stop()
	clk.SetTime(end)
	fencertest.WaitClosed(t, l.Done(), 10*time.Second, "Done of a lease whose session's early deadline passed")
	require.ErrorIs(t, l.Err(), etcdstore.ErrSessionExpired)
	require.True(t, clk.Now().Before(renewal.Add(3*time.Second)))
}

// fakeClockService serves a store on the shared etcd member and returns a
// client of it on a fake clock, whose calls go through in, and a client on
// the real clock.
func fakeClockService(t *testing.T) (*client.Client, *rpcfault.Injector, *testclock.FakeClock, *client.Client) {
	t.Helper()
	return faultService(t, true)
}

// faultService serves a store on the shared etcd member and returns a
// client of it whose calls go through in, on a fake clock if fake (nil
// otherwise), and a plain client on the real clock.
func faultService(t *testing.T, fake bool) (*client.Client, *rpcfault.Injector, *testclock.FakeClock, *client.Client) {
	t.Helper()
	addr, _ := fencertest.Serve(t, server.Config{Store: fencertest.SharedStore(t), Authenticator: server.Anonymous("tester")})
	dial := func(opts ...grpc.DialOption) *grpc.ClientConn {
		cc, err := grpc.NewClient(addr, append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))...)
		require.NoError(t, err)
		t.Cleanup(func() { cc.Close() })
		return cc
	}
	in := rpcfault.New()
	if !fake {
		return client.New(dial(in.DialOptions()...)), in, nil, client.New(dial())
	}
	clk := testclock.NewFakeClock(time.Now())
	return client.New(dial(in.DialOptions()...), client.WithClock(clientClock{clk})), in, clk, client.New(dial())
}

// clientClock gives a fake clock of k8s.io/utils the shape of
// client.Clock, whose NewTimer returns the client's own Timer type.
type clientClock struct{ *testclock.FakeClock }

func (c clientClock) NewTimer(d time.Duration) client.Timer { return c.FakeClock.NewTimer(d) }

// TestEndEarlyAfterWaiting: an acquisition that waited 5s opens a session
// (TTL 3s, ending 1.9s early) that the server renewed meanwhile, so the
// client can count on only half the TTL, less than the 1.9s it takes: the
// session is renewed before Acquire returns, and its first deadline is
// 1.1s after that renewal was sent, not already passed.
func TestEndEarlyAfterWaiting(t *testing.T) {
	c, in, clk, plain := fakeClockService(t)
	ctx := fencertest.Context(t)
	holder, err := newSession(t, plain).Acquire(ctx, "waited")
	require.NoError(t, err)
	ends := make(chan time.Time, 16)
	s := newSession(t, c,
		client.WithTTL(3*time.Second), client.WithEndEarly(1900*time.Millisecond),
		client.WithDeadlineFunc(func(end time.Time) { ends <- end }))
	in.Count()
	got := acquire(ctx, s, "waited")
	require.Eventually(t, func() bool { return in.Calls()["/fencer.v1.FencerService/Acquire"] > 0 }, 10*time.Second, time.Millisecond)
	clk.SetTime(clk.Now().Add(5 * time.Second)) // the wait, on the session's clock
	renewal := clk.Now()
	require.NoError(t, holder.Release(ctx))
	var a acquisition
	require.Eventually(t, func() bool {
		clk.Step(0) // fires the keepalive's first renewal, due at once
		select {
		case a = <-got:
			return true
		default:
			return false
		}
	}, 10*time.Second, time.Millisecond)
	require.NoError(t, a.err)
	require.NoError(t, a.l.Err())
	require.Equal(t, renewal.Add(1100*time.Millisecond), <-ends, "the first deadline")
}

// TestEndEarlyValidated: an early end that leaves a third of the TTL or
// less, or is negative, is refused with an *etcdstore.ArgumentError.
func TestEndEarlyValidated(t *testing.T) {
	c := client.New(nil)
	for _, tc := range []struct {
		early time.Duration
		ok    bool
	}{
		{0, true},
		{1999 * time.Millisecond, true},
		{2 * time.Second, false},
		{3 * time.Second, false},
		{-time.Nanosecond, false},
	} {
		s, err := c.NewSession(client.WithTTL(3*time.Second), client.WithEndEarly(tc.early))
		if tc.ok {
			require.NoError(t, err, tc.early)
			require.NoError(t, s.Close(t.Context()))
			continue
		}
		var arg *etcdstore.ArgumentError
		require.True(t, errors.As(err, &arg), "%s: %v", tc.early, err)
		require.Equal(t, "end early", arg.Arg)
	}
}
