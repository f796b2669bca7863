package etcdstore

import (
	"context"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencer-dev/fencer/token"
)

// queued is a call that reads and writes the given keys and is size bytes.
func queued(reads, writes []string, size int) *call {
	return &call{ctx: context.Background(), reads: reads, writes: writes, size: size, done: make(chan struct{})}
}

func TestTakeFormsBatchesInOrderWithoutOverlap(t *testing.T) {
	putA := queued([]string{"h1"}, []string{"a"}, 10)
	putB := queued([]string{"h1"}, []string{"b"}, 10)
	putAAgain := queued([]string{"h1"}, []string{"a"}, 10) // writes what putA writes
	release := queued([]string{"h1"}, []string{"h1"}, 10)  // writes what the puts read
	putC := queued([]string{"h2"}, []string{"c"}, 10)
	readsA := queued([]string{"a"}, []string{"d"}, 10) // reads what putAAgain, held back, writes
	b := &batcher{max: 10, queue: []*call{putA, putB, putAAgain, release, putC, readsA}}
	b.busy = true

	require.Equal(t, []*call{putA, putB, putC}, b.take())
	require.Equal(t, []*call{putAAgain, release, readsA}, b.queue, "held-back writes keep their order")
	require.True(t, b.busy)
	require.Equal(t, []*call{putAAgain}, b.take(), "release overlaps the put before it; readsA the put it reads")
	require.Equal(t, []*call{release, readsA}, b.take())
	require.Nil(t, b.take())
	require.False(t, b.busy, "an empty queue leaves the batcher idle")
}

func TestTakeDropsWritesWhoseContextEnded(t *testing.T) {
	live, gone := queued(nil, []string{"a"}, 1), queued(nil, []string{"b"}, 1)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	gone.ctx = ctx
	b := &batcher{max: 10, queue: []*call{gone, live}, busy: true}
	require.Equal(t, []*call{live}, b.take())
	select {
	case <-gone.done:
		require.ErrorIs(t, gone.err, context.Canceled)
	default:
		t.Fatal("the cancelled write was not answered")
	}
	require.Empty(t, b.queue)

	b = &batcher{max: 10, queue: []*call{queued(nil, []string{"c"}, 1)}, busy: true}
	b.queue[0].ctx = ctx
	require.Nil(t, b.take(), "a queue of ended writes leaves nothing to send")
	require.False(t, b.busy)
}

func TestTakeKeepsBatchesWithinTheirLimits(t *testing.T) {
	var calls []*call
	for _, k := range []string{"a", "b", "c", "d", "e"} {
		calls = append(calls, queued(nil, []string{k}, 1))
	}
	b := &batcher{max: 2, queue: slices.Clone(calls), busy: true}
	require.Equal(t, calls[:2], b.take())
	require.Equal(t, calls[2:4], b.take())
	require.Equal(t, calls[4:], b.take())

	big := queued(nil, []string{"big"}, maxBatchBytes+1)
	small := queued(nil, []string{"small"}, 1)
	half := queued(nil, []string{"half"}, maxBatchBytes/2+1)
	b = &batcher{max: 10, queue: []*call{big, small, half, queued(nil, []string{"half2"}, maxBatchBytes/2+1)}, busy: true}
	require.Equal(t, []*call{big}, b.take(), "a write over the byte limit goes alone")
	require.Equal(t, []*call{small, half}, b.take())
	require.Len(t, b.take(), 1)
}

func TestStoresBatchByDefault(t *testing.T) {
	s, err := New(&clientv3.Client{})
	require.NoError(t, err)
	require.Equal(t, DefaultBatch, s.batch.max)
}

func TestWithBatchingClampsItsSize(t *testing.T) {
	for _, tc := range []struct{ in, want int }{{-1, 0}, {0, 0}, {1, 0}, {2, 2}, {64, 64}, {MaxBatch + 1, MaxBatch}} {
		s := &Store{}
		WithBatching(tc.in)(s)
		if tc.want == 0 {
			require.Nil(t, s.batch, "WithBatching(%d)", tc.in)
			continue
		}
		require.Equal(t, tc.want, s.batch.max, "WithBatching(%d)", tc.in)
	}
}

func TestKeysOfAGuardedWriteIncludeItsOwnerKey(t *testing.T) {
	s := &Store{prefix: "/p/"}
	put := clientv3.OpPut(s.DataKey("k"), "v")
	tok := token.Token{Lease: "orders", Epoch: 1, Revision: 2}
	guard := s.guard(tok)
	for name, c := range map[string]*call{
		"nested (owned or unowned)": {cmps: guard, then: s.ownedOps(tok, "k", put)},
		"takeover":                  {cmps: guard, then: []clientv3.Op{clientv3.OpPut(s.ownerKey("k"), ownerRecord(tok)), put}},
		"known owner": {cmps: []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(s.holderKey("orders")), "=", 2),
			clientv3.Compare(clientv3.Value(s.ownerKey("k")), "=", ownerRecord(tok))}, then: []clientv3.Op{put}},
	} {
		c.ctx = context.Background()
		require.True(t, c.keys(), name)
		require.Contains(t, c.reads, "/p/leases/orders", name)
		require.Contains(t, c.writes, "/p/data/k", name)
		if name != "known owner" {
			require.Contains(t, c.writes, "/p/owners/k", "%s: a write that may claim its key writes the owner key", name)
		}
		if name != "takeover" {
			require.Contains(t, c.reads, "/p/owners/k", name)
		}
	}
	// Another lease's write of the same key overlaps on the owner key too.
	a := &call{ctx: context.Background(), then: s.ownedOps(token.Token{Lease: "a", Revision: 1}, "k", clientv3.OpDelete(s.DataKey("k")))}
	b := &call{ctx: context.Background(), then: []clientv3.Op{clientv3.OpTxn(nil, []clientv3.Op{clientv3.OpPut(s.ownerKey("k"), "b")}, nil)}}
	require.True(t, a.keys())
	require.True(t, b.keys())
	a.done, b.done = make(chan struct{}), make(chan struct{})
	q := &batcher{max: 10, queue: []*call{a, b}, busy: true}
	require.Equal(t, []*call{a}, q.take())
	require.Equal(t, []*call{b}, q.take())

	// A nested range makes a write unshareable.
	r := &call{ctx: context.Background(), then: []clientv3.Op{clientv3.OpTxn(nil, nil, []clientv3.Op{clientv3.OpDelete("/p/data/", clientv3.WithPrefix())})}}
	require.False(t, r.keys())
}
