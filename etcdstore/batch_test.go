package etcdstore_test

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/fencer-dev/fencer/etcdstore"
	"github.com/fencer-dev/fencer/fencertest"
	"github.com/fencer-dev/fencer/token"
)

// queueUp starts each write in a goroutine of its own while st's batcher
// is paused, in order: each is queued before the next starts. Then it sends
// them, and returns once every write has returned.
func queueUp(t *testing.T, st *etcdstore.Store, writes ...func()) {
	t.Helper()
	queued, resume := etcdstore.PauseBatching(st)
	var wg sync.WaitGroup
	for i, w := range writes {
		wg.Go(w)
		require.Eventually(t, func() bool { return queued() == i+1 }, 5*time.Second, time.Millisecond)
	}
	resume()
	wg.Wait()
}

func TestBatchedWritesShareATxnAndKeepTheirOwnGuards(t *testing.T) {
	ctx, st, s, l := holding(t, "batch")
	old, err := s.Acquire(ctx, "superseded")
	require.NoError(t, err)
	require.NoError(t, old.Release(ctx))
	newer, err := s.Acquire(ctx, "superseded")
	require.NoError(t, err)

	tok := l.Token()
	revs := make([]int64, 4)
	var staleErr, secondErr, delErr error
	var secondRev int64
	var deleted bool
	put := func(i int, key string) func() {
		return func() {
			var err error
			revs[i], err = st.Put(ctx, tok, key, []byte("first"))
			require.NoError(t, err)
		}
	}
	queueUp(t, st,
		put(0, "k0"), put(1, "k1"), put(2, "k2"), put(3, "k3"),
		func() { _, staleErr = st.Put(ctx, old.Token(), "k4", []byte("stale")) },
		func() { secondRev, secondErr = st.Put(ctx, tok, "k0", []byte("second")) },
		func() { deleted, delErr = st.Delete(ctx, tok, "k1") },
	)

	require.Equal(t, []int64{revs[0], revs[0], revs[0], revs[0]}, revs, "the four puts shared one Txn")
	var stale *token.StaleError
	require.ErrorAs(t, staleErr, &stale)
	require.Equal(t, newer.Token(), stale.Newer)
	_, ok, err := st.Get(ctx, "k4")
	require.NoError(t, err)
	require.False(t, ok, "the stale put wrote nothing")

	require.NoError(t, secondErr)
	require.Greater(t, secondRev, revs[0], "a second write to k0 waits for the next Txn")
	require.Equal(t, "second", get(t, st, "k0"))
	require.NoError(t, delErr)
	require.True(t, deleted, "the delete of k1 came after its put")
	_, ok, err = st.Get(ctx, "k1")
	require.NoError(t, err)
	require.False(t, ok)
	require.Equal(t, "first", get(t, st, "k2"))
}

func TestBatchedAcquisitionsAndReleases(t *testing.T) {
	ctx := fencertest.Context(t)
	st := fencertest.SharedStore(t)
	s := newSession(t, st)
	names := []string{"a", "b", "c", "d", "e"}
	leases := make([]*etcdstore.Lease, len(names))
	var writes []func()
	for i, name := range names {
		writes = append(writes, func() {
			var err error
			leases[i], err = s.TryAcquire(ctx, name)
			require.NoError(t, err)
		})
	}
	queueUp(t, st, writes...)
	for _, l := range leases {
		require.Equal(t, leases[0].Token().Revision, l.Token().Revision, "the acquisitions shared one Txn")
		require.Equal(t, uint64(1), l.Token().Epoch)
		require.NoError(t, st.Check(ctx, l.Token()))
	}

	writes = writes[:0]
	for _, l := range leases {
		writes = append(writes, func() { require.NoError(t, l.Release(ctx)) })
	}
	queueUp(t, st, writes...)
	for i, name := range names {
		status, err := st.Status(ctx, name)
		require.NoError(t, err)
		require.Equal(t, etcdstore.Status{Name: name, Epoch: 1}, status)
		l, err := s.TryAcquire(ctx, name)
		require.NoError(t, err)
		require.Equal(t, uint64(2), l.Token().Epoch)
		c, err := l.Token().Compare(leases[i].Token())
		require.NoError(t, err)
		require.Equal(t, 1, c)
	}
}

func TestBatchRejectedByEtcdIsRetriedWriteByWrite(t *testing.T) {
	ctx, st, _, l := holding(t, "batch")
	grant, err := st.Client().Grant(ctx, 60)
	require.NoError(t, err)
	_, err = st.Client().Revoke(ctx, grant.ID)
	require.NoError(t, err)

	var acquireErr error
	revs := make([]int64, 3)
	var writes []func()
	for i := range revs {
		writes = append(writes, func() {
			var err error
			revs[i], err = st.Put(ctx, l.Token(), "k"+string(rune('0'+i)), []byte("v"))
			require.NoError(t, err)
		})
	}
	writes = append(writes, func() { _, _, acquireErr = st.AcquireOn(ctx, grant.ID, "revoked", "orphan", 0) })
	queueUp(t, st, writes...)

	require.ErrorIs(t, acquireErr, rpctypes.ErrLeaseNotFound, "etcd refuses the whole Txn for this one write")
	require.NotEqual(t, revs[0], revs[1], "the puts were retried one by one")
	for i := range revs {
		require.Equal(t, "v", get(t, st, "k"+string(rune('0'+i))))
	}
	status, err := st.Status(ctx, "orphan")
	require.NoError(t, err)
	require.Equal(t, etcdstore.Status{Name: "orphan"}, status)
}

func TestBatchedWriteCancelledWhileQueuedWritesNothing(t *testing.T) {
	ctx, st, _, l := holding(t, "batch")
	for i := range 10 {
		key := "k" + strconv.Itoa(i)
		wctx, cancel := context.WithCancel(ctx)
		var otherErr, cancelledErr error
		queued, resume := etcdstore.PauseBatching(st)
		var wg sync.WaitGroup
		wg.Go(func() { _, otherErr = st.Put(ctx, l.Token(), "other"+key, []byte("v")) })
		require.Eventually(t, func() bool { return queued() == 1 }, 5*time.Second, time.Millisecond)
		wg.Go(func() { _, cancelledErr = st.Put(wctx, l.Token(), key, []byte("v")) })
		require.Eventually(t, func() bool { return queued() == 2 }, 5*time.Second, time.Millisecond)
		cancel() // before anything is sent: whether its caller or take sees it first
		resume()
		wg.Wait()
		require.NoError(t, otherErr)
		require.ErrorIs(t, cancelledErr, context.Canceled)
		_, ok, err := st.Get(ctx, key)
		require.NoError(t, err)
		require.False(t, ok, "a write cancelled while queued was sent")
	}
	// The batcher is idle again: the next write goes at once.
	_, err := st.Put(ctx, l.Token(), "k", []byte("v"))
	require.NoError(t, err)
}

// TestBatchRefusedForOneWritesPermissionIsRetriedWriteByWrite runs on an
// etcd member with authentication, as an etcd user who may write fencer's
// data, owner, holder, epoch and lock-delay keys but only read its fences.
func TestBatchRefusedForOneWritesPermissionIsRetriedWriteByWrite(t *testing.T) {
	ctx := fencertest.Context(t)
	member := fencertest.Etcd(t)
	root := fencertest.Client(t, member.Endpoint())
	must := func(_ any, err error) { t.Helper(); require.NoError(t, err) }
	must(root.RoleAdd(ctx, "root"))
	must(root.UserAdd(ctx, "root", "root-password"))
	must(root.UserGrantRole(ctx, "root", "root"))
	must(root.RoleAdd(ctx, "writer"))
	readWrite, readOnly := clientv3.PermissionType(clientv3.PermReadWrite), clientv3.PermissionType(clientv3.PermRead)
	for prefix, perm := range map[string]clientv3.PermissionType{"data/": readWrite, "owners/": readWrite, "leases/": readWrite, "epochs/": readWrite, "delays/": readWrite, "fences/": readOnly} {
		key := etcdstore.DefaultPrefix + prefix
		must(root.RoleGrantPermission(ctx, "writer", key, clientv3.GetPrefixRangeEnd(key), perm))
	}
	must(root.UserAdd(ctx, "writer", "writer-password"))
	must(root.UserGrantRole(ctx, "writer", "writer"))
	must(root.AuthEnable(ctx))
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{member.Endpoint()}, Username: "writer", Password: "writer-password",
		DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	require.NoError(t, err)
	t.Cleanup(func() { cli.Close() })
	st, err := etcdstore.New(cli)
	require.NoError(t, err)
	l, err := newSession(t, st).Acquire(ctx, "guarded")
	require.NoError(t, err)

	var putErr, advanceErr error
	queueUp(t, st,
		func() { _, putErr = st.Put(ctx, l.Token(), "k", []byte("v")) },
		func() { advanceErr = st.Advance(ctx, "forbidden", l.Token()) },
	)
	require.ErrorIs(t, advanceErr, rpctypes.ErrPermissionDenied)
	require.NoError(t, putErr, "the put failed only because it shared a Txn with a forbidden write")
	require.Equal(t, "v", get(t, st, "k"))
}

func TestLargeBatchedWritesGoInTxnsOfTheirOwn(t *testing.T) {
	ctx, st, _, l := holding(t, "batch")
	big := []byte(strings.Repeat("x", 600<<10))
	revs := make([]int64, 3)
	var writes []func()
	for i := range revs {
		writes = append(writes, func() {
			var err error
			revs[i], err = st.Put(ctx, l.Token(), "big"+string(rune('0'+i)), big)
			require.NoError(t, err)
		})
	}
	queueUp(t, st, writes...)
	require.Len(t, map[int64]bool{revs[0]: true, revs[1]: true, revs[2]: true}, 3, "no two 600 KiB puts share a Txn")
}
