package client_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fencer-dev/fencer/client"
	"github.com/fencer-dev/fencer/fencertest"
	"github.com/fencer-dev/fencer/token"
)

// TestRenewalAfterAnOutageChecksTheLeases: while a session can neither
// renew nor watch, another caller releases its lease's token. When its
// renewals come back but its watch does not (a server restarted, whose
// lease watch reconnects later), the first successful renewal must not
// extend the session's deadline before the session has checked its
// leases: the released one ends at once, rather than living on for as long
// as the watch stays away (and past any lock-delay its acquisition set).
func TestRenewalAfterAnOutageChecksTheLeases(t *testing.T) {
	c, in, _, plain := faultService(t, false)
	ctx := fencertest.Context(t)
	s := newSession(t, c, client.WithTTL(6*time.Second))
	l, err := s.Acquire(ctx, "unheard")
	require.NoError(t, err)

	const keepAlive, watch = "/fencer.v1.FencerService/KeepAlive", "/fencer.v1.FencerService/WatchLease"
	cut := status.Error(codes.Unavailable, "cut off")
	in.Count()
	in.Start(cut, keepAlive, watch)
	released, err := plain.Release(ctx, l.Token())
	require.NoError(t, err)
	require.True(t, released)
	require.Eventually(t, func() bool { return in.Calls()[keepAlive] > 0 }, 10*time.Second, 10*time.Millisecond, "no renewal was tried in the outage")
	require.NoError(t, l.Err(), "the lease cannot have heard of its release yet")

	in.Start(cut, watch) // renewals come back; the watch stays away
	fencertest.WaitClosed(t, l.Done(), 4*time.Second, "Done of a lease released while its session could neither renew nor watch, after renewals came back")
	require.ErrorIs(t, l.Err(), token.ErrStale, "ended by the check, not by the session's deadline: %v", l.Err())
}
