package server

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// watchRig is a session watch on a store of its own, with helpers that
// open and end sessions as the server records them.
type watchRig struct {
	t      *testing.T
	cli    *clientv3.Client
	prefix string
	w      *sessionWatch
}

func newWatchRig(t *testing.T) *watchRig {
	st := hubStore(t)
	r := &watchRig{t: t, cli: st.Client(), prefix: st.Prefix() + "sessions/"}
	r.w = newSessionWatch(r.cli, r.prefix)
	t.Cleanup(r.w.close)
	return r
}

// open grants an etcd lease and writes its session key and secret key
// on it, as openSession does.
func (r *watchRig) open() clientv3.LeaseID {
	ctx := testContext(r.t)
	g, err := r.cli.Grant(ctx, 60)
	require.NoError(r.t, err)
	key := r.prefix + fmt.Sprintf("%016x", int64(g.ID))
	_, err = r.cli.Txn(ctx).Then(clientv3.OpPut(key, "p", clientv3.WithLease(g.ID)), clientv3.OpPut(key+"/secret", "s", clientv3.WithLease(g.ID))).Commit()
	require.NoError(r.t, err)
	return g.ID
}

// end revokes session id and returns the revision that deleted its keys.
func (r *watchRig) end(id clientv3.LeaseID) int64 {
	resp, err := r.cli.Revoke(testContext(r.t), id)
	require.NoError(r.t, err)
	return resp.Header.Revision
}

// head reads the store's revision linearizably.
func (r *watchRig) head() int64 {
	resp, err := r.cli.Get(testContext(r.t), "head")
	require.NoError(r.t, err)
	return resp.Header.Revision
}

// seen waits until the shared watch has handed out revision rev.
func (r *watchRig) seen(rev int64) {
	require.Eventually(r.t, func() bool {
		r.w.mu.Lock()
		defer r.w.mu.Unlock()
		return r.w.run != nil && r.w.run.next > rev
	}, 5*time.Second, 5*time.Millisecond, "the session watch never saw revision %d", rev)
}

func gone(sub *sessionSub) bool {
	select {
	case <-sub.gone:
		return true
	default:
		return false
	}
}

func awaitGone(t *testing.T, sub *sessionSub) {
	t.Helper()
	select {
	case <-sub.gone:
	case <-time.After(5 * time.Second):
		t.Fatalf("the subscription to session %x did not end", int64(sub.id))
	}
}

// TestSessionWatchEndsOnlyTheSessionThatEnded: three sessions' streams
// share one run, and the end of one session ends its subscriptions
// (both of them) and no other.
func TestSessionWatchEndsOnlyTheSessionThatEnded(t *testing.T) {
	r := newWatchRig(t)
	a, b, c := r.open(), r.open(), r.open()
	rev := r.head()
	subA, subA2, subB, subC := r.w.subscribe(a, rev, nil), r.w.subscribe(a, rev, nil), r.w.subscribe(b, rev, nil), r.w.subscribe(c, rev, nil)
	for _, sub := range []*sessionSub{subA, subA2, subB, subC} {
		require.True(t, r.w.covers(sub, rev))
		require.Same(t, subA.run, sub.run, "one run serves every stream")
	}
	defer r.w.unsubscribe(subC)

	endA := r.end(a)
	awaitGone(t, subA)
	awaitGone(t, subA2)
	require.ErrorIs(t, subA.err, ErrSessionNotFound)
	require.ErrorContains(t, subA.err, fmt.Sprintf("session ended at revision %d", endA))
	r.seen(endA)
	require.False(t, gone(subB) || gone(subC), "another session's end")

	r.w.unsubscribe(subB)
	r.end(b)
	r.end(c)
	awaitGone(t, subC)
	require.False(t, gone(subB), "a subscription that left")
}

// TestSessionWatchRecordEndsALateSubscriber: a stream read its session
// alive at rev; the session ended and the shared watch handed that out
// before the stream subscribed. Its record ends the subscription.
func TestSessionWatchRecordEndsALateSubscriber(t *testing.T) {
	r := newWatchRig(t)
	a, other := r.open(), r.open()
	rev := r.head()
	first := r.w.subscribe(other, rev, nil) // starts the run at rev+1
	defer r.w.unsubscribe(first)
	require.True(t, r.w.covers(first, rev))
	endA := r.end(a)
	r.seen(endA)

	late := r.w.subscribe(a, rev, nil)
	defer r.w.unsubscribe(late)
	require.Greater(t, late.from, rev+1, "the run is past the stream's read")
	require.True(t, r.w.covers(late, rev), "the record reaches back to the read")
	awaitGone(t, late)
	require.ErrorIs(t, late.err, ErrSessionNotFound)
	require.False(t, gone(first))
}

// TestSessionWatchAsksForAFreshReadBeyondItsRecord: with a record of two
// ends, four sessions end between a stream's read and its subscription.
// covers reports false; a read after subscribing settles it, and the
// session's later end still arrives.
func TestSessionWatchAsksForAFreshReadBeyondItsRecord(t *testing.T) {
	r := newWatchRig(t)
	r.w.record = 2
	a, other := r.open(), r.open()
	var ending []clientv3.LeaseID
	for range 4 {
		ending = append(ending, r.open())
	}
	rev := r.head()
	first := r.w.subscribe(other, rev, nil)
	defer r.w.unsubscribe(first)
	var last int64
	for _, id := range ending {
		last = r.end(id)
	}
	r.seen(last)

	sub := r.w.subscribe(a, rev, nil)
	defer r.w.unsubscribe(sub)
	require.False(t, r.w.covers(sub, rev), "the record does not reach back to the read")
	require.True(t, r.w.covers(sub, r.head()), "a read after subscribing")
	require.False(t, gone(sub))
	r.end(a)
	awaitGone(t, sub)
	require.ErrorIs(t, sub.err, ErrSessionNotFound)
}

// TestSessionWatchEndsItsSubscriptionsWhenItsWatchFails starts the shared
// watch at a compacted revision: its subscriptions end with
// ErrWatchCompacted, and the next one starts a run that works.
func TestSessionWatchEndsItsSubscriptionsWhenItsWatchFails(t *testing.T) {
	r := newWatchRig(t)
	a := r.open()
	old := r.head()
	r.open()
	_, err := r.cli.Compact(testContext(t), r.head())
	require.NoError(t, err)

	sub := r.w.subscribe(a, old-1, nil)
	awaitGone(t, sub)
	require.ErrorIs(t, sub.err, ErrWatchCompacted)
	r.w.unsubscribe(sub)

	rev := r.head()
	again := r.w.subscribe(a, rev, nil)
	defer r.w.unsubscribe(again)
	require.True(t, r.w.covers(again, rev))
	r.end(a)
	awaitGone(t, again)
	require.ErrorIs(t, again.err, ErrSessionNotFound)
}

// TestSessionWatchCloseEndsSubscriptions: close ends the open
// subscriptions with ErrShuttingDown, and later ones at once.
func TestSessionWatchCloseEndsSubscriptions(t *testing.T) {
	r := newWatchRig(t)
	a := r.open()
	rev := r.head()
	sub := r.w.subscribe(a, rev, nil)
	r.w.close()
	awaitGone(t, sub)
	require.ErrorIs(t, sub.err, ErrShuttingDown)
	later := r.w.subscribe(a, rev, nil)
	require.True(t, gone(later))
	require.ErrorIs(t, later.err, ErrShuttingDown)
	require.True(t, r.w.covers(later, rev))
}
