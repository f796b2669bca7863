package etcdstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencer-dev/fencer/etcdstore"
	"github.com/fencer-dev/fencer/fencertest"
	"github.com/fencer-dev/fencer/internal/holderkey"
	"github.com/fencer-dev/fencer/token"
)

// testDelay is the lock-delay of these tests: etcd's minimum lease TTL
// with its default timing (1.5 s, rounded up to whole seconds).
const testDelay = 2 * time.Second

// TestLockDelayCleanReleaseSkipsIt: the holder's own release deletes the
// marker, so the lease can be acquired again at once.
func TestLockDelayCleanReleaseSkipsIt(t *testing.T) {
	ctx := fencertest.Context(t)
	st := fencertest.SharedStore(t)
	a, b := newSession(t, st), newSession(t, st)
	l, err := a.TryAcquire(ctx, "clean", etcdstore.WithLockDelay(testDelay))
	require.NoError(t, err)
	require.NoError(t, l.Release(ctx))
	l2, err := b.TryAcquire(ctx, "clean", etcdstore.WithLockDelay(testDelay))
	require.NoError(t, err, "a clean release must skip the lock-delay")
	require.Greater(t, l2.Token().Epoch, l.Token().Epoch)
	resp, err := st.Client().Get(ctx, st.Prefix()+"delays/", clientv3.WithPrefix())
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1, "only the new acquisition's marker is left")
}

// TestLockDelayEndings: every end of an acquisition other than its
// holder's release leaves the lease unavailable for the delay, enforced by
// etcd: acquirers that try again at once are refused, with an error
// distinct from held, until the delay has passed; then one acquires.
func TestLockDelayEndings(t *testing.T) {
	for _, tc := range []struct {
		name string
		end  func(t *testing.T, ctx context.Context, st *etcdstore.Store, s *etcdstore.Session, l *etcdstore.Lease)
	}{
		{"holder key deleted", func(t *testing.T, ctx context.Context, st *etcdstore.Store, _ *etcdstore.Session, l *etcdstore.Lease) {
			_, err := st.Client().Delete(ctx, holderkey.Key(st.Prefix(), l.Token().Lease))
			require.NoError(t, err)
		}},
		{"token released by another caller", func(t *testing.T, ctx context.Context, st *etcdstore.Store, _ *etcdstore.Session, l *etcdstore.Lease) {
			other, err := etcdstore.New(st.Client(), etcdstore.WithPrefix(st.Prefix()))
			require.NoError(t, err)
			released, err := other.Release(ctx, l.Token())
			require.NoError(t, err)
			require.True(t, released)
		}},
		{"session expired", func(t *testing.T, ctx context.Context, st *etcdstore.Store, s *etcdstore.Session, _ *etcdstore.Lease) {
			_, err := st.Client().Revoke(ctx, s.LeaseID())
			require.NoError(t, err)
		}},
		{"session closed", func(t *testing.T, ctx context.Context, _ *etcdstore.Store, s *etcdstore.Session, _ *etcdstore.Lease) {
			require.NoError(t, s.Close(ctx))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := fencertest.Context(t)
			st := fencertest.SharedStore(t)
			a, b := newSession(t, st), newSession(t, st)
			l, err := a.TryAcquire(ctx, "job", etcdstore.WithLockDelay(testDelay))
			require.NoError(t, err)
			tc.end(t, ctx, st, a, l)
			fencertest.WaitClosed(t, l.Done(), 10*time.Second, "the ended lease's Done")

			_, err = b.TryAcquire(ctx, "job")
			var de *token.LockDelayError
			require.ErrorAs(t, err, &de, "right after the end, the lease is in its lock-delay")
			require.ErrorIs(t, err, token.ErrLockDelay)
			require.False(t, errors.Is(err, token.ErrHeldByAnother), "a delay is not a holder")
			require.Equal(t, testDelay, de.Delay)
			start := time.Now()

			// Acquirers that do not wait are refused by etcd all the same.
			for i := 0; i < 3; i++ {
				_, err = b.TryAcquire(ctx, "job")
				require.ErrorIs(t, err, token.ErrLockDelay)
			}

			// Acquire waits the delay out, on etcd's clock.
			wctx, cancel := context.WithTimeout(ctx, 15*time.Second)
			defer cancel()
			l2, err := b.Acquire(wctx, "job")
			require.NoError(t, err)
			require.GreaterOrEqual(t, time.Since(start), testDelay/2, "the delay was not waited out")
			require.Greater(t, l2.Token().Epoch, l.Token().Epoch)
			// l2 set no delay: its loss leaves the lease free at once.
			_, err = st.Client().Delete(ctx, holderkey.Key(st.Prefix(), "job"))
			require.NoError(t, err)
			fencertest.WaitClosed(t, l2.Done(), 10*time.Second, "the second lease's Done")
			_, err = newSession(t, st).TryAcquire(ctx, "job")
			require.NoError(t, err)
		})
	}
}

// lost acquires lease name in a session of its own with opts, deletes its
// holder key with a raw etcd delete and waits until the Lease has ended.
func lost(t *testing.T, ctx context.Context, st *etcdstore.Store, name string, opts ...etcdstore.AcquireOption) {
	t.Helper()
	l, err := newSession(t, st).TryAcquire(ctx, name, opts...)
	require.NoError(t, err)
	_, err = st.Client().Delete(ctx, holderkey.Key(st.Prefix(), name))
	require.NoError(t, err)
	fencertest.WaitClosed(t, l.Done(), 10*time.Second, "the lost lease's Done")
}

// TestLockDelayNoneByDefault: without WithLockDelay, a lease whose holder
// key was deleted is free at once, as before lock-delays.
func TestLockDelayNoneByDefault(t *testing.T) {
	ctx := fencertest.Context(t)
	st := fencertest.SharedStore(t)
	lost(t, ctx, st, "nodelay")
	_, err := newSession(t, st).TryAcquire(ctx, "nodelay")
	require.NoError(t, err)
}

// TestLockDelayConcurrentAcquirers: acquirers racing to start the delay of
// one lease start it once, and all of them are refused until it passes.
func TestLockDelayConcurrentAcquirers(t *testing.T) {
	ctx := fencertest.Context(t)
	st := fencertest.SharedStore(t)
	lost(t, ctx, st, "race", etcdstore.WithLockDelay(testDelay))
	const n = 4
	errs := make(chan error, n)
	for range n {
		s := newSession(t, st)
		go func() { _, err := s.TryAcquire(ctx, "race"); errs <- err }()
	}
	for range n {
		require.ErrorIs(t, <-errs, token.ErrLockDelay)
	}
	resp, err := st.Client().Get(ctx, st.Prefix()+"delays/race/claim")
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1, "one claim times the delay")
}

// TestLockDelayInvalid: a delay outside 0 to MaxLockDelay is refused
// before anything is written.
func TestLockDelayInvalid(t *testing.T) {
	ctx := fencertest.Context(t)
	s := newSession(t, fencertest.SharedStore(t))
	for _, d := range []time.Duration{-time.Second, etcdstore.MaxLockDelay + time.Second} {
		_, err := s.TryAcquire(ctx, "bad", etcdstore.WithLockDelay(d))
		require.ErrorIs(t, err, etcdstore.ErrInvalidArgument)
	}
}

// TestLockDelaySkippedClaimIsRefused: the acquiring Txn itself refuses an
// acquirer that reads the marker and does not wait: one that sends the
// acquisition over the marker as read without starting the delay, one that
// pretends a claim, and one that does not wait for the claim to expire.
func TestLockDelaySkippedClaimIsRefused(t *testing.T) {
	ctx := fencertest.Context(t)
	st := fencertest.SharedStore(t)
	lost(t, ctx, st, "skip", etcdstore.WithLockDelay(testDelay))
	g, err := st.Client().Grant(ctx, 60)
	require.NoError(t, err)

	ok, err := etcdstore.AcquireOnce(ctx, st, g.ID, "skip", 0)
	require.NoError(t, err)
	require.False(t, ok, "an acquisition over an unstarted delay committed")
	ok, err = etcdstore.AcquireOnce(ctx, st, g.ID, "skip", int64(g.ID))
	require.NoError(t, err)
	require.False(t, ok, "an acquisition naming a claim the marker does not name committed")

	_, err = newSession(t, st).TryAcquire(ctx, "skip") // starts the delay
	require.ErrorIs(t, err, token.ErrLockDelay)
	ok, err = etcdstore.AcquireOnce(ctx, st, g.ID, "skip", 0)
	require.NoError(t, err)
	require.False(t, ok, "an acquisition before the claim expired committed")

	wctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	_, err = newSession(t, st).Acquire(wctx, "skip")
	require.NoError(t, err, "the delay never passed")
}

// TestLockDelayInStatus: Status, List and ListPage show a lease's
// lock-delay: the one a held lease's acquisition set; on a free lease
// that ended uncleanly, the pending delay and then the running one; none
// once it has passed or after a clean release. "a" and "a-b" share a page,
// where "a"'s claim key sorts after "a-b"'s keys.
func TestLockDelayInStatus(t *testing.T) {
	ctx := fencertest.Context(t)
	st := fencertest.SharedStore(t)
	sess, other := newSession(t, st), newSession(t, st)
	views := func(name string) []etcdstore.Status {
		t.Helper()
		one, err := st.Status(ctx, name)
		require.NoError(t, err)
		all, err := st.List(ctx)
		require.NoError(t, err)
		page, _, err := st.ListPage(ctx, "", 2)
		require.NoError(t, err)
		out := []etcdstore.Status{one}
		for _, l := range [][]etcdstore.Status{all, page} {
			for _, s := range l {
				if s.Name == name {
					out = append(out, s)
				}
			}
		}
		require.Len(t, out, 3, "%s in Status, List and ListPage", name)
		return out
	}
	want := func(name string, delay time.Duration, started bool) {
		t.Helper()
		for _, s := range views(name) {
			require.Equal(t, delay, s.LockDelay, "%+v", s)
			require.Equal(t, started, s.LockDelayStarted, "%+v", s)
		}
	}

	a, err := sess.TryAcquire(ctx, "a", etcdstore.WithLockDelay(testDelay))
	require.NoError(t, err)
	ab, err := sess.TryAcquire(ctx, "a-b", etcdstore.WithLockDelay(2*testDelay))
	require.NoError(t, err)
	want("a", testDelay, false) // held: the delay its acquisition set
	want("a-b", 2*testDelay, false)

	_, err = st.Release(ctx, a.Token()) // by token: not clean
	require.NoError(t, err)
	want("a", testDelay, false) // free, pending: the next acquirer starts it
	_, err = other.TryAcquire(ctx, "a")
	var de *token.LockDelayError
	require.ErrorAs(t, err, &de)
	require.GreaterOrEqual(t, de.Remaining, testDelay, "the refusal that starts the delay says how long it has left")
	want("a", testDelay, true) // running
	want("a-b", 2*testDelay, false)

	require.Eventually(t, func() bool { return views("a")[0].LockDelay == 0 }, 15*time.Second, 50*time.Millisecond)
	want("a", 0, false) // passed
	require.NoError(t, ab.Release(ctx))
	want("a-b", 0, false) // clean release
}
