package server_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fencer-dev/fencer/client"
	"github.com/fencer-dev/fencer/fencertest"
	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
	"github.com/fencer-dev/fencer/server"
	"github.com/fencer-dev/fencer/token"
)

// TestLockDelayThroughTheService: an acquisition's lock_delay_seconds
// reaches the store. The holder's own release (holder_session_id) frees the
// lease at once; a release of its token by another caller leaves the lease
// refused with LOCK_DELAY, distinct from HELD_BY_ANOTHER, until the delay
// has passed, and a waiting Acquire waits it out.
func TestLockDelayThroughTheService(t *testing.T) {
	ctx := fencertest.Context(t)
	addr, _ := startServer(t, fencertest.SharedStore(t))
	c := client.New(dial(t, alice, addr))
	const delay = 2 * time.Second

	l, err := newSession(t, c).Acquire(ctx, "svc", client.WithLockDelay(delay))
	require.NoError(t, err)
	require.NoError(t, l.Release(ctx))
	l, err = newSession(t, c).TryAcquire(ctx, "svc", client.WithLockDelay(delay))
	require.NoError(t, err, "the holder's release skips the delay")

	released, err := c.Release(ctx, l.Token()) // by token alone: another caller
	require.NoError(t, err)
	require.True(t, released)
	s := newSession(t, c)
	_, err = s.TryAcquire(ctx, "svc")
	var de *token.LockDelayError
	require.ErrorAs(t, err, &de)
	require.NotErrorIs(t, err, token.ErrHeldByAnother)
	require.Equal(t, "svc", de.Lease)
	require.Equal(t, delay, de.Delay)

	wctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	_, err = s.Acquire(wctx, "svc")
	require.NoError(t, err, "a waiting Acquire waits the delay out")
}

// TestLockDelayValidated: lock_delay_seconds beyond an hour is refused.
func TestLockDelayValidated(t *testing.T) {
	ctx := fencertest.Context(t)
	addr, _ := startServer(t, fencertest.SharedStore(t))
	c := client.New(dial(t, alice, addr))
	_, err := newSession(t, c).TryAcquire(ctx, "svc", client.WithLockDelay(time.Hour+time.Second))
	require.ErrorIs(t, err, token.ErrInvalidArgument)
}

// TestCleanReleaseNeedsTheSessionSecret: another caller of the holder's own
// principal, who can learn the holder's session ID (it is in the holder
// name that status and the audit log show), cannot make the clean release
// that skips the lock-delay. Without the session's secret, which only the
// Acquire that opened the session returned, the release is refused and
// changes nothing; with a wrong one too. Its release by token alone is not
// clean, and the delay holds.
func TestCleanReleaseNeedsTheSessionSecret(t *testing.T) {
	ctx := fencertest.Context(t)
	addr, _ := startServer(t, fencertest.SharedStore(t))
	holder := client.New(dial(t, alice, addr))
	const delay = 30 * time.Second
	sess := newSession(t, holder)
	l, err := sess.Acquire(ctx, "svc", client.WithLockDelay(delay))
	require.NoError(t, err)

	other := fencerv1.NewFencerServiceClient(dial(t, alice, addr)) // same principal, another process
	for _, tc := range []struct {
		secret []byte
		want   codes.Code
	}{
		{nil, codes.InvalidArgument},
		{[]byte("short"), codes.InvalidArgument},
		{make([]byte, server.SessionSecretLen), codes.PermissionDenied},
	} {
		_, err = other.Release(ctx, &fencerv1.ReleaseRequest{
			Target:              &fencerv1.ReleaseRequest_Token{Token: l.Token().String()},
			HolderSessionId:     sess.ID(),
			HolderSessionSecret: tc.secret,
		})
		require.Equal(t, tc.want, status.Code(err), "a clean release with secret %x: %v", tc.secret, err)
		require.NoError(t, holder.Check(ctx, l.Token()), "a refused release changes nothing")
	}
	_, err = other.Release(ctx, &fencerv1.ReleaseRequest{
		Target:              &fencerv1.ReleaseRequest_SessionId{SessionId: sess.ID()},
		HolderSessionSecret: make([]byte, server.SessionSecretLen),
	})
	require.Equal(t, codes.InvalidArgument, status.Code(err), "a secret without holder_session_id: %v", err)
	require.NoError(t, holder.Check(ctx, l.Token()))

	resp, err := other.Release(ctx, &fencerv1.ReleaseRequest{Target: &fencerv1.ReleaseRequest_Token{Token: l.Token().String()}})
	require.NoError(t, err)
	require.True(t, resp.GetReleased())
	_, err = newSession(t, holder).TryAcquire(ctx, "svc")
	var de *token.LockDelayError
	require.ErrorAs(t, err, &de, "a release by token alone is not clean")
}
