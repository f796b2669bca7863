package server_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fencer-dev/fencer/client"
	"github.com/fencer-dev/fencer/internal/etcdtest"
	"github.com/fencer-dev/fencer/token"
)

// TestLockDelayThroughTheService: an acquisition's lock_delay_seconds
// reaches the store. The holder's own release (holder_session_id) frees the
// lease at once; a release of its token by another caller leaves the lease
// refused with LOCK_DELAY, distinct from HELD_BY_ANOTHER, until the delay
// has passed, and a waiting Acquire waits it out.
func TestLockDelayThroughTheService(t *testing.T) {
	ctx := etcdtest.Context(t)
	addr, _ := startServer(t, etcdtest.Store(t))
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
	ctx := etcdtest.Context(t)
	addr, _ := startServer(t, etcdtest.Store(t))
	c := client.New(dial(t, alice, addr))
	_, err := newSession(t, c).TryAcquire(ctx, "svc", client.WithLockDelay(time.Hour+time.Second))
	require.ErrorIs(t, err, token.ErrInvalidArgument)
}
