package server

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/fencer-dev/fencer/embedetcd"
	"github.com/fencer-dev/fencer/etcdstore"
	"github.com/fencer-dev/fencer/internal/holderkey"
	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
)

// hubRig is a lease hub on a store of its own, with helpers to hold and
// lose leases on etcd leases the test grants.
type hubRig struct {
	t   *testing.T
	st  *etcdstore.Store
	hub *leaseHub
}

func newHubRig(t *testing.T) *hubRig {
	st := hubStore(t)
	r := &hubRig{t: t, st: st, hub: newLeaseHub(st, newMetrics())}
	t.Cleanup(r.hub.close)
	return r
}

// hubStore returns a store on an etcd member of t's own. The lease hub's
// tests are inside package server, so they cannot use fencertest, which
// imports it.
func hubStore(t *testing.T) *etcdstore.Store {
	t.Helper()
	srv, err := embedetcd.Start(testContext(t), embedetcd.Member{Name: "hub", Dir: t.TempDir()})
	require.NoError(t, err)
	t.Cleanup(srv.Close)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	require.NoError(t, err)
	t.Cleanup(func() { cli.Close() })
	st, err := etcdstore.New(cli)
	require.NoError(t, err)
	return st
}

// testContext returns a context that ends after 30 seconds or with t.
func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// session grants an etcd lease, as a remote session's.
func (r *hubRig) session() clientv3.LeaseID {
	g, err := r.st.Client().Grant(testContext(r.t), 60)
	require.NoError(r.t, err)
	return g.ID
}

// hold acquires leases names on session id.
func (r *hubRig) hold(id clientv3.LeaseID, names ...string) {
	for _, name := range names {
		_, _, err := r.st.AcquireOn(testContext(r.t), id, "holder", name, 0)
		require.NoError(r.t, err)
	}
}

// lose deletes the holder keys of names, held by r.hold, in one Txn and
// returns its revision.
func (r *hubRig) lose(names ...string) int64 {
	var ops []clientv3.Op
	for _, name := range names {
		ops = append(ops, clientv3.OpDelete(holderkey.Key(r.st.Prefix(), name)))
	}
	resp, err := r.st.Client().Txn(testContext(r.t)).Then(ops...).Commit()
	require.NoError(r.t, err)
	return resp.Header.Revision
}

// now is the store's current revision.
func (r *hubRig) now() int64 {
	resp, err := r.st.Client().Get(testContext(r.t), "any")
	require.NoError(r.t, err)
	return resp.Header.Revision
}

// subscribe subscribes as WatchLease does, and unsubscribes when the test
// ends.
func (r *hubRig) subscribe(id clientv3.LeaseID, start int64) *hubFeed {
	f := r.hub.subscribe(id, start, r.now(), nil)
	r.t.Cleanup(func() { r.hub.unsubscribe(f) })
	return f
}

// seen waits until the shared watch has handed out revision rev.
func (r *hubRig) seen(rev int64) {
	require.Eventually(r.t, func() bool {
		r.hub.mu.Lock()
		defer r.hub.mu.Unlock()
		return r.hub.shared != nil && r.hub.shared.next > rev
	}, 5*time.Second, time.Millisecond)
}

// onShared waits until f is served by the shared watch.
func (r *hubRig) onShared(f *hubFeed) {
	require.Eventually(r.t, func() bool {
		r.hub.mu.Lock()
		defer r.hub.mu.Unlock()
		return f.shared != nil && f.shared == r.hub.shared
	}, 10*time.Second, 5*time.Millisecond, "not handed over to the shared watch")
}

// joined reports whether f is on the shared watch now.
func (r *hubRig) joined(f *hubFeed) bool {
	r.hub.mu.Lock()
	defer r.hub.mu.Unlock()
	return f.shared != nil && f.shared == r.hub.shared
}

func (r *hubRig) watches() float64 { return testutil.ToFloat64(r.hub.m.leaseWatches) }

// next returns the next message of feed, skipping progress reports.
func next(t *testing.T, feed *hubFeed) *fencerv1.WatchLeaseResponse {
	t.Helper()
	for {
		select {
		case <-feed.q.ready:
			if msg, ok := feed.q.take(); ok && msg.GetType() != fencerv1.WatchLeaseResponse_TYPE_PROGRESS {
				return msg
			}
		case <-feed.gone:
			t.Fatalf("feed ended: %v", feed.err)
		case <-time.After(5 * time.Second):
			t.Fatal("no message")
		}
	}
}

// quiet checks that feed gets nothing but progress for a while.
func quiet(t *testing.T, feed *hubFeed, below int64) {
	t.Helper()
	deadline := time.After(1500 * time.Millisecond)
	for {
		select {
		case <-feed.q.ready:
			msg, ok := feed.q.take()
			if !ok {
				continue
			}
			require.Equal(t, fencerv1.WatchLeaseResponse_TYPE_PROGRESS, msg.GetType(), "unexpected %v", msg)
			require.Less(t, msg.GetRevision(), below)
		case <-deadline:
			return
		}
	}
}

func TestLeaseHubSharesOneWatchAndReplaysItsBuffer(t *testing.T) {
	r := newHubRig(t)
	a, b := r.session(), r.session()
	r.hold(a, "a1")
	r.hold(b, "b1")
	from := r.now() + 1
	feedA := r.subscribe(a, from)
	require.True(t, r.joined(feedA), "a stream from now joins the shared watch")
	require.Nil(t, feedA.stopCatchUp)
	require.Equal(t, 1.0, r.watches())

	lostB := r.lose("b1")
	lostA := r.lose("a1")
	msg := next(t, feedA)
	require.Equal(t, fencerv1.WatchLeaseResponse_TYPE_LOST, msg.GetType())
	require.Equal(t, lostA, msg.GetRevision(), "A hears of its own loss only")
	require.Contains(t, msg.GetToken(), ":a1")
	r.seen(lostA)

	// B's stream starts after its loss was seen: the buffer replays it.
	feedB := r.subscribe(b, from)
	require.True(t, r.joined(feedB))
	require.Nil(t, feedB.stopCatchUp)
	require.Equal(t, 1.0, r.watches(), "one etcd watch for both streams")
	msg = next(t, feedB)
	require.Equal(t, lostB, msg.GetRevision())
	require.Contains(t, msg.GetToken(), ":b1")
}

func TestLeaseHubCatchesUpAStreamFromBeforeItsBufferThenHandsItOver(t *testing.T) {
	r := newHubRig(t)
	a := r.session()
	r.hold(a, "a1", "a2", "a3")
	from := r.now() + 1
	lost1 := r.lose("a1")
	r.hub.subscribe(r.session(), r.now()+1, r.now(), nil) // the shared watch starts after lost1
	early := r.subscribe(a, from)
	require.NotNil(t, early.stopCatchUp, "catching up on a watch of its own")
	require.Equal(t, lost1, next(t, early).GetRevision())
	r.onShared(early)
	require.Eventually(t, func() bool { return r.watches() == 1 }, 5*time.Second, time.Millisecond, "the catch-up watch did not end")
	lost2 := r.lose("a2")
	require.Equal(t, lost2, next(t, early).GetRevision())
	lost3 := r.lose("a3")
	require.Equal(t, lost3, next(t, early).GetRevision())
	quiet(t, early, lost3+100)
}

func TestLeaseHubBufferIsBounded(t *testing.T) {
	r := newHubRig(t)
	r.hub.buffer = 2
	a, b := r.session(), r.session()
	r.hold(b, "b1", "b2", "b3")
	from := r.now() + 1
	r.subscribe(a, from)
	first := r.lose("b1")
	r.lose("b2")
	last := r.lose("b3")
	r.seen(last)
	r.hub.mu.Lock()
	since, kept := r.hub.shared.since, len(r.hub.shared.buf)
	r.hub.mu.Unlock()
	require.Equal(t, first+1, since, "the oldest loss left the buffer")
	require.Equal(t, 2, kept)

	feed := r.subscribe(b, from)
	require.NotNil(t, feed.stopCatchUp, "the buffer no longer reaches back to from")
	require.Equal(t, first, next(t, feed).GetRevision())
}

func TestLeaseHubEndsAFeedThatFallsBehindAndQueuesNothingAfter(t *testing.T) {
	r := newHubRig(t)
	r.hub.feed = 1
	a := r.session()
	r.hold(a, "a1", "a2", "a3")
	feed := r.subscribe(a, r.now()+1)
	lost1 := r.lose("a1")
	lost2 := r.lose("a2") // the feed holds lost1 and is not read: lost2 is missed
	r.seen(lost2)
	select {
	case <-feed.gone:
		require.ErrorIs(t, feed.err, errStoreUnavailable)
		require.ErrorContains(t, feed.err, "fell behind")
	case <-time.After(5 * time.Second):
		t.Fatal("a feed that fell behind was not ended")
	}
	msg, ok := feed.q.take()
	require.True(t, ok, "the loss before the missed one")
	require.Equal(t, lost1, msg.GetRevision())
	lost3 := r.lose("a3")
	r.seen(lost3)
	time.Sleep(2 * progressEvery) // and a progress report
	_, ok = feed.q.take()
	require.False(t, ok, "nothing is queued after the missed loss")

	// Its client watches again from lost1+1: a feed of 1 cannot take the
	// two buffered losses, so it catches up on its own watch, which waits
	// for the stream.
	again := r.subscribe(a, lost1+1)
	require.Equal(t, lost2, next(t, again).GetRevision())
	require.Equal(t, lost3, next(t, again).GetRevision())
	r.onShared(again)
}

func TestLeaseHubDeliversMoreLossesInOneRevisionThanAFeedHolds(t *testing.T) {
	r := newHubRig(t)
	r.hub.feed = 4
	a := r.session()
	names := []string{"k0", "k1", "k2", "k3", "k4", "k5", "k6", "k7", "k8", "k9"}
	r.hold(a, names...)
	from := r.now() + 1
	lost := r.lose(names...)
	r.hub.subscribe(r.session(), r.now()+1, r.now(), nil)
	feed := r.subscribe(a, from)
	for range names {
		require.Equal(t, lost, next(t, feed).GetRevision())
	}
	r.onShared(feed)
}

func TestLeaseHubStreamsDoNotInheritEachOthersStart(t *testing.T) {
	r := newHubRig(t)
	a, b, c := r.session(), r.session(), r.session()
	r.hold(a, "x1", "x2")
	old := r.now()
	r.lose("x1")
	_, err := r.st.Client().Compact(testContext(t), r.now())
	require.NoError(t, err)

	compacted := r.subscribe(a, old) // its start is gone from etcd
	future := r.subscribe(b, 1<<40)  // any client may send this
	fresh := r.subscribe(c, r.now()+1)
	select {
	case <-compacted.gone:
		require.ErrorIs(t, compacted.err, ErrWatchCompacted)
	case <-time.After(5 * time.Second):
		t.Fatal("a stream from a compacted revision was not ended")
	}
	require.True(t, r.joined(future), "a future start joins the shared watch")
	require.True(t, r.joined(fresh))
	r.hold(c, "c1")
	lost := r.lose("c1")
	require.Equal(t, lost, next(t, fresh).GetRevision(), "the fresh stream is unharmed")
	quiet(t, future, 1<<40)
}

// TestLeaseHubFeedsAStreamFromAheadOfItsSharedWatch starts the shared
// watch late (as a restart after a failure does), so that it has seen
// nothing when streams subscribe from the revision an acquisition returned
// and from the store's next revision: both are ahead of it, join it, and
// get the loss once it catches up. WatchLease refuses only a start beyond
// the store's next revision (TestWatchLeaseRefusesAFutureStartRevision).
func TestLeaseHubFeedsAStreamFromAheadOfItsSharedWatch(t *testing.T) {
	r := newHubRig(t)
	since := r.now() + 1
	r.hub.mu.Lock()
	r.hub.shared = r.hub.runShared(&hubRun{since: since, next: since, reported: since, byLease: map[clientv3.LeaseID][]*clientv3.Event{}, delay: 3 * time.Second})
	r.hub.mu.Unlock()
	r.hold(r.session(), "other") // a revision the shared watch has not seen
	a := r.session()
	r.hold(a, "a1")
	acquired := r.now()
	feeds := []*hubFeed{r.subscribe(a, acquired), r.subscribe(a, acquired+1)}
	r.hub.mu.Lock()
	behind := r.hub.shared.next
	r.hub.mu.Unlock()
	require.Less(t, behind, acquired, "the shared watch has seen nothing yet")
	for _, f := range feeds {
		require.True(t, r.joined(f), "a start ahead of the shared watch joins it")
	}
	lost := r.lose("a1")
	for _, f := range feeds {
		require.Equal(t, lost, next(t, f).GetRevision())
	}
}

func TestLeaseHubCloseEndsFeeds(t *testing.T) {
	r := newHubRig(t)
	feed := r.subscribe(r.session(), r.now()+1)
	r.hub.close()
	<-feed.gone
	require.ErrorIs(t, feed.err, ErrShuttingDown)
	late := r.hub.subscribe(r.session(), r.now()+1, r.now(), nil)
	<-late.gone
	require.ErrorIs(t, late.err, ErrShuttingDown)
	require.Zero(t, r.watches())
}

// TestLeaseHubNeverJoinsAnUnsubscribedFeed holds the hub's lock while the
// stream unsubscribes and its catch-up reaches handOver, so that both wait
// and the unsubscribe goes first.
func TestLeaseHubNeverJoinsAnUnsubscribedFeed(t *testing.T) {
	r := newHubRig(t)
	a := r.session()
	r.hold(a, "a1")
	from := r.now() + 1
	r.lose("a1")
	r.subscribe(r.session(), r.now()+1) // the shared watch starts after the loss
	f := r.hub.subscribe(a, from, r.now(), nil)
	require.NotNil(t, f.stopCatchUp)
	r.hub.mu.Lock()
	unsubscribed := make(chan struct{})
	go func() {
		r.hub.unsubscribe(f)
		close(unsubscribed)
	}()
	time.Sleep(700 * time.Millisecond) // the catch-up has the loss and waits in handOver
	r.hub.mu.Unlock()
	<-unsubscribed
	r.hub.mu.Lock()
	defer r.hub.mu.Unlock()
	require.NotContains(t, r.hub.shared.feeds[a], f, "an unsubscribed feed joined the shared watch")
}

// TestLeaseHubStartsNoSharedWatchInThePast has a stream catch up over more
// history than etcd sends in one response while no shared watch runs: the
// shared watch it starts begins at the store's revision, not where the
// first response ended.
func TestLeaseHubStartsNoSharedWatchInThePast(t *testing.T) {
	r := newHubRig(t)
	a := r.session()
	r.hold(a, "a1")
	from := r.now() + 1
	lost := r.lose("a1")
	for i := range 2500 { // holder-key revisions that are no losses
		_, err := r.st.Client().Put(testContext(t), holderkey.Key(r.st.Prefix(), fmt.Sprintf("x%d", i)), "v")
		require.NoError(t, err)
	}
	now := r.now()
	other := r.subscribe(r.session(), now+1)
	f := r.subscribe(a, from)
	r.hub.mu.Lock()
	old := r.hub.shared
	r.hub.failLocked(old, errWatchBroken, false) // no shared watch runs now
	r.hub.mu.Unlock()
	<-old.done
	<-other.gone
	require.Equal(t, lost, next(t, f).GetRevision())
	r.onShared(f)
	r.hub.mu.Lock()
	since := r.hub.shared.since
	r.hub.mu.Unlock()
	require.GreaterOrEqual(t, since, now, "the new shared watch would replay history")
}

// TestLeaseHubRestartsAFailedSharedWatchWithItsBuffer fails the shared
// watch as follow does on a watch error: its feeds end, and their streams,
// resuming from where they were, join the shared watch that took over at
// once, without catching up on watches of their own.
func TestLeaseHubRestartsAFailedSharedWatchWithItsBuffer(t *testing.T) {
	r := newHubRig(t)
	a := r.session()
	r.hold(a, "a1", "a2")
	from := r.now() + 1
	feed := r.subscribe(a, from)
	lost1 := r.lose("a1")
	require.Equal(t, lost1, next(t, feed).GetRevision())

	r.hub.mu.Lock()
	failed := r.hub.shared
	r.hub.failLocked(failed, errWatchBroken, true)
	r.hub.mu.Unlock()
	<-feed.gone
	require.ErrorIs(t, feed.err, errWatchBroken)
	<-failed.done

	again := r.subscribe(a, from)
	require.Nil(t, again.stopCatchUp, "joined the restarted shared watch at once")
	require.Equal(t, lost1, next(t, again).GetRevision(), "replayed from the inherited buffer")
	lost2 := r.lose("a2")
	require.Equal(t, lost2, next(t, again).GetRevision())
	require.Eventually(t, func() bool { return r.watches() == 1 }, 5*time.Second, time.Millisecond)
}

// TestLeaseHubRecoversFromACompactedPreviousValue makes the successor of a
// failed shared watch meet a holder-key delete whose previous value etcd
// has compacted: it ends, no successor follows it from the same revision,
// and the next stream starts a shared watch at the head that works.
func TestLeaseHubRecoversFromACompactedPreviousValue(t *testing.T) {
	r := newHubRig(t)
	a, b := r.session(), r.session()
	r.hold(a, "a1")
	r.hold(b, "b1")
	other := r.subscribe(r.session(), r.now()+1)
	r.hub.mu.Lock()
	failed := r.hub.shared
	from := failed.next
	r.hub.failLocked(failed, errWatchBroken, true) // a successor from `from`, after the restart backoff
	r.hub.mu.Unlock()
	<-other.gone
	require.Equal(t, from, r.lose("a1"))
	_, err := r.st.Client().Compact(testContext(t), from)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		r.hub.mu.Lock()
		defer r.hub.mu.Unlock()
		return r.hub.shared == nil
	}, 5*time.Second, time.Millisecond, "the successor keeps going")

	fresh := r.subscribe(b, r.now()+1)
	lost := r.lose("b1")
	require.Equal(t, lost, next(t, fresh).GetRevision())
}

// TestLeaseHubRestartsBackOffAndStartOverOnceAnswered fails the shared
// watch again and again: each successor waits about twice as long as the
// one before (200 ms, doubling, up to 5 s, each ±50%); once etcd has
// answered a successor, the next failure is followed soon again.
func TestLeaseHubRestartsBackOffAndStartOverOnceAnswered(t *testing.T) {
	r := newHubRig(t)
	r.subscribe(r.session(), r.now()+1)
	within := func(nominal, d time.Duration) {
		t.Helper()
		require.GreaterOrEqual(t, d, nominal/2)
		require.LessOrEqual(t, d, nominal*3/2+time.Millisecond)
	}
	r.hub.mu.Lock()
	for i := range 7 {
		r.hub.failLocked(r.hub.shared, errWatchBroken, true)
		within(min(200*time.Millisecond<<i, 5*time.Second), r.hub.shared.delay)
	}
	answered := r.hub.shared
	seen := answered.next - 1
	r.hub.mu.Unlock()

	// etcd's first answer: progress up to where the watch starts.
	require.True(t, r.hub.apply(answered, clientv3.WatchResponse{Header: &etcdserverpb.ResponseHeader{Revision: seen}}))
	r.hub.mu.Lock()
	r.hub.failLocked(answered, errWatchBroken, true)
	within(200*time.Millisecond, r.hub.shared.delay)
	r.hub.mu.Unlock()
}

// TestFeedQueue: a feed's queue keeps order, refuses a message past its
// limit, keeps no buffer once drained, and putWait waits for the stream
// to take one (or for its context).
func TestFeedQueue(t *testing.T) {
	q := newFeedQueue(2)
	msg := func(rev int64) *fencerv1.WatchLeaseResponse {
		return &fencerv1.WatchLeaseResponse{Type: fencerv1.WatchLeaseResponse_TYPE_LOST, Revision: rev}
	}
	require.True(t, q.put(msg(1)))
	require.True(t, q.put(msg(2)))
	require.False(t, q.put(msg(3)), "past the limit")
	require.Zero(t, q.room())

	waited := make(chan bool, 1)
	go func() { waited <- q.putWait(context.Background(), msg(3)) }()
	select {
	case <-waited:
		t.Fatal("putWait did not wait for room")
	case <-time.After(50 * time.Millisecond):
	}
	for want := int64(1); want <= 3; want++ {
		<-q.ready
		m, ok := q.take()
		require.True(t, ok)
		require.Equal(t, want, m.GetRevision())
		if want == 1 {
			require.True(t, <-waited, "room made by a take")
		}
	}
	_, ok := q.take()
	require.False(t, ok)
	require.Nil(t, q.msgs, "a drained queue keeps no buffer")

	q.put(msg(4))
	q.put(msg(5))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.False(t, q.putWait(ctx, msg(6)), "an ended context")
	require.Equal(t, 0, q.room())
}

// TestFeedQueueKeepsOneUntakenProgress: a PROGRESS report replaces one
// the stream has not taken if it is last, and never one before a LOST.
func TestFeedQueueKeepsOneUntakenProgress(t *testing.T) {
	q := newFeedQueue(8)
	progress := func(rev int64) *fencerv1.WatchLeaseResponse {
		return &fencerv1.WatchLeaseResponse{Type: fencerv1.WatchLeaseResponse_TYPE_PROGRESS, Revision: rev}
	}
	lost := func(rev int64) *fencerv1.WatchLeaseResponse {
		return &fencerv1.WatchLeaseResponse{Type: fencerv1.WatchLeaseResponse_TYPE_LOST, Revision: rev}
	}
	q.put(lost(4))
	for rev := int64(5); rev < 100; rev++ {
		require.True(t, q.putProgress(progress(rev)))
	}
	q.put(lost(100))
	q.putProgress(progress(101))
	q.putProgress(progress(102))
	var got []string
	for {
		msg, ok := q.take()
		if !ok {
			break
		}
		got = append(got, fmt.Sprintf("%s@%d", msg.GetType(), msg.GetRevision()))
	}
	require.Equal(t, []string{"TYPE_LOST@4", "TYPE_PROGRESS@99", "TYPE_LOST@100", "TYPE_PROGRESS@102"}, got)
}
