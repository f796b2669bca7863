package client_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/fencer-dev/fencer/client"
	"github.com/fencer-dev/fencer/etcdstore"
	"github.com/fencer-dev/fencer/fencertest"
	"github.com/fencer-dev/fencer/internal/holderkey"
	"github.com/fencer-dev/fencer/internal/testkit/rpcfault"
	"github.com/fencer-dev/fencer/server"
	"github.com/fencer-dev/fencer/token"
)

// serveWithFaults serves st to anonymous callers and returns a client of
// the server whose calls go through the returned injector.
func serveWithFaults(tb testing.TB, st *etcdstore.Store) (*client.Client, *rpcfault.Injector) {
	addr, _ := fencertest.Serve(tb, server.Config{Store: st, Authenticator: server.Anonymous("tester")})
	in := rpcfault.New()
	cc, err := grpc.NewClient(addr, append(in.DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	require.NoError(tb, err)
	tb.Cleanup(func() { cc.Close() })
	return client.New(cc), in
}

const watchLeaseMethod = "/fencer.v1.FencerService/WatchLease"

// lossLog records what WatchSession reported, and can break the watch's
// stream from inside its lost callback.
type lossLog struct {
	mu     sync.Mutex
	synced []int64
	lost   []token.Token
	onLost func(n int) // called with the number of losses so far
	got    chan struct{}
}

func (l *lossLog) sync(rev int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.synced = append(l.synced, rev)
}

func (l *lossLog) lose(ev client.LossEvent) error {
	l.mu.Lock()
	l.lost = append(l.lost, ev.Token)
	n, f := len(l.lost), l.onLost
	l.mu.Unlock()
	if f != nil {
		f(n)
	}
	l.got <- struct{}{}
	return nil
}

func (l *lossLog) snapshot() ([]int64, []token.Token) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]int64(nil), l.synced...), append([]token.Token(nil), l.lost...)
}

// TestWatchSessionReconnects: WatchSession survives its stream breaking.
// A loss while it reconnects is still reported, and losses at one revision
// that it reported before the stream broke are not reported again, though
// it resumes at that revision and the server sends them again.
func TestWatchSessionReconnects(t *testing.T) {
	ctx := fencertest.Context(t)
	st := fencertest.SharedStore(t)
	c, in := serveWithFaults(t, st)
	s := newSession(t, c)
	leases := map[string]*client.Lease{}
	for _, name := range []string{"a", "b", "c"} {
		l, err := s.Acquire(ctx, name)
		require.NoError(t, err)
		leases[name] = l
	}

	log := &lossLog{got: make(chan struct{}, 4)}
	wctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	done := make(chan error, 1)
	go func() { done <- c.WatchSession(wctx, s.ID(), log.sync, log.lose) }()
	require.Eventually(t, func() bool { synced, _ := log.snapshot(); return len(synced) == 1 }, 10*time.Second, 10*time.Millisecond)

	// A loss while the watch is broken is reported once it is back.
	outage := status.Error(codes.Unavailable, "test: the server is restarting")
	in.Start(outage, watchLeaseMethod)
	deleteHolder(t, st, "a")
	in.Stop()
	waitLoss(t, log)

	// b and c are lost at one revision; the stream breaks right after the
	// first of them is reported, so the watch resumes at that revision.
	log.mu.Lock()
	log.onLost = func(n int) {
		if n == 2 {
			in.Start(outage, watchLeaseMethod)
			in.Stop()
		}
	}
	log.mu.Unlock()
	resp, err := st.Client().Txn(ctx).Then(clientv3.OpDelete(holderkey.Key(st.Prefix(), "b")), clientv3.OpDelete(holderkey.Key(st.Prefix(), "c"))).Commit()
	require.NoError(t, err)
	waitLoss(t, log)
	waitLoss(t, log)
	require.Eventually(t, func() bool { synced, _ := log.snapshot(); return len(synced) >= 3 }, 10*time.Second, 10*time.Millisecond,
		"the watch did not watch again after the second break")

	// A later loss comes after anything the resumed stream sent again.
	d, err := s.Acquire(ctx, "d")
	require.NoError(t, err)
	deleteHolder(t, st, "d")
	waitLoss(t, log)

	synced, lost := log.snapshot()
	require.Equal(t, []token.Token{leases["a"].Token(), leases["b"].Token(), leases["c"].Token(), d.Token()}, lost, "each loss reported exactly once, in order")
	require.Equal(t, resp.Header.Revision, synced[2], "the third watch resumed at the revision of b's and c's loss")
	require.NoError(t, s.Close(ctx))
	require.ErrorIs(t, <-done, token.ErrSessionExpired, "the watch ends with its session")
}

func waitLoss(t *testing.T, log *lossLog) {
	t.Helper()
	select {
	case <-log.got:
	case <-time.After(30 * time.Second):
		t.Fatal("no loss reported")
	}
}
