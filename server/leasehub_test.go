package server

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencer-dev/fencer/etcdstore"
	"github.com/fencer-dev/fencer/internal/etcdtest"
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
	st := etcdtest.Store(t)
	return &hubRig{t: t, st: st, hub: newLeaseHub(st, newMetrics())}
}

// session grants an etcd lease, as a remote session's.
func (r *hubRig) session() clientv3.LeaseID {
	g, err := r.st.Client().Grant(etcdtest.Context(r.t), 60)
	require.NoError(r.t, err)
	return g.ID
}

// lose acquires lease name on session id and deletes its holder key from
// outside; it returns the revision of the delete.
func (r *hubRig) lose(id clientv3.LeaseID, name string) int64 {
	ctx := etcdtest.Context(r.t)
	_, _, err := r.st.TryAcquireOn(ctx, id, "holder", name)
	require.NoError(r.t, err)
	resp, err := r.st.Client().Delete(ctx, r.st.HolderKey(name))
	require.NoError(r.t, err)
	return resp.Header.Revision
}

// now is the store's current revision.
func (r *hubRig) now() int64 {
	resp, err := r.st.Client().Get(etcdtest.Context(r.t), "any")
	require.NoError(r.t, err)
	return resp.Header.Revision
}

// seen waits until the shared watch has handed out revision rev.
func (r *hubRig) seen(rev int64) {
	require.Eventually(r.t, func() bool {
		r.hub.mu.Lock()
		defer r.hub.mu.Unlock()
		return r.hub.shared != nil && r.hub.shared.next > rev
	}, 5*time.Second, time.Millisecond)
}

func (r *hubRig) watches() float64 { return testutil.ToFloat64(r.hub.m.leaseWatches) }

// next returns the next message of feed, skipping progress reports.
func next(t *testing.T, feed *hubSub) *fencerv1.WatchLeaseResponse {
	t.Helper()
	for {
		select {
		case msg := <-feed.ch:
			if msg.GetType() != fencerv1.WatchLeaseResponse_TYPE_PROGRESS {
				return msg
			}
		case <-feed.gone:
			t.Fatalf("feed ended: %v", feed.err)
		case <-time.After(5 * time.Second):
			t.Fatal("no message")
		}
	}
}

func TestLeaseHubSharesOneWatchAndReplaysItsBuffer(t *testing.T) {
	r := newHubRig(t)
	a, b := r.session(), r.session()
	from := r.now() + 1
	feedA := r.hub.subscribe(a, from)
	require.Equal(t, 1.0, r.watches())

	lostB := r.lose(b, "b1")
	lostA := r.lose(a, "a1")
	msg := next(t, feedA)
	require.Equal(t, fencerv1.WatchLeaseResponse_TYPE_LOST, msg.GetType())
	require.Equal(t, lostA, msg.GetRevision(), "A hears of its own loss only")
	require.Contains(t, msg.GetToken(), ":a1")
	r.seen(lostA)

	// B's stream starts after its loss was seen: the buffer replays it.
	feedB := r.hub.subscribe(b, from)
	require.Same(t, r.hub.shared, feedB.run)
	require.Equal(t, 1.0, r.watches(), "one etcd watch for both streams")
	msg = next(t, feedB)
	require.Equal(t, lostB, msg.GetRevision())
	require.Contains(t, msg.GetToken(), ":b1")

	// A stream starting before the buffer reaches back gets its own watch.
	early := r.hub.subscribe(b, from-1)
	require.NotSame(t, r.hub.shared, early.run)
	require.Equal(t, 2.0, r.watches())
	require.Equal(t, lostB, next(t, early).GetRevision())

	for _, f := range []*hubSub{feedA, feedB, early} {
		r.hub.unsubscribe(f)
	}
	require.Zero(t, r.watches(), "no stream, no watch")
	require.Nil(t, r.hub.shared)
}

func TestLeaseHubBufferIsBounded(t *testing.T) {
	r := newHubRig(t)
	r.hub.buffer = 2
	a, b := r.session(), r.session()
	from := r.now() + 1
	feedA := r.hub.subscribe(a, from)
	defer r.hub.unsubscribe(feedA)
	first := r.lose(b, "b1")
	r.lose(b, "b2")
	last := r.lose(b, "b3")
	r.seen(last)
	r.hub.mu.Lock()
	since, kept := r.hub.shared.since, len(r.hub.shared.buf)
	r.hub.mu.Unlock()
	require.Equal(t, first+1, since, "the oldest loss left the buffer")
	require.Equal(t, 2, kept)

	feed := r.hub.subscribe(b, from)
	defer r.hub.unsubscribe(feed)
	require.NotSame(t, r.hub.shared, feed.run, "the buffer no longer reaches back to from")
	require.Equal(t, first, next(t, feed).GetRevision())
}

func TestLeaseHubEndsAFeedThatFallsBehind(t *testing.T) {
	r := newHubRig(t)
	r.hub.sbuffer = 1
	a := r.session()
	feed := r.hub.subscribe(a, r.now()+1)
	defer r.hub.unsubscribe(feed)
	r.lose(a, "a1")
	r.lose(a, "a2") // the feed holds one message and is not read
	select {
	case <-feed.gone:
		require.ErrorIs(t, feed.err, errStoreUnavailable)
		require.ErrorContains(t, feed.err, "fell behind")
	case <-time.After(5 * time.Second):
		t.Fatal("a feed that fell behind was not ended")
	}
}
