package etcdstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/fencer-dev/fencer/etcdstore"
	"github.com/fencer-dev/fencer/fencertest"
	"github.com/fencer-dev/fencer/internal/testkit/faultproxy"
	"github.com/fencer-dev/fencer/token"
)

func get(t *testing.T, st *etcdstore.Store, key string) string {
	t.Helper()
	v, ok, err := st.Get(fencertest.Context(t), key)
	require.NoError(t, err)
	require.True(t, ok, "key %q missing", key)
	return string(v.Data)
}

func TestPausedHolderIsFencedByTheStore(t *testing.T) {
	ctx := fencertest.Context(t)
	st := fencertest.SharedStore(t)
	// A's clock never moves, so A never sends a keepalive: a process
	// paused past its TTL.
	paused := clocktesting.NewFakeClock(time.Now())
	a := newSession(t, st, etcdstore.WithTTL(time.Second), etcdstore.WithHolder("A"), etcdstore.WithClock(paused))
	b := newSession(t, st, etcdstore.WithHolder("B"))

	la, err := a.Acquire(ctx, "jobs")
	require.NoError(t, err)
	_, err = st.Put(ctx, la.Token(), "result", []byte("from A"))
	require.NoError(t, err)

	lb, err := b.Acquire(ctx, "jobs") // returns once A's etcd lease expired
	require.NoError(t, err)
	c, err := lb.Token().Compare(la.Token())
	require.NoError(t, err)
	require.Equal(t, 1, c)
	require.Equal(t, la.Token().Epoch+1, lb.Token().Epoch)
	_, err = st.Put(ctx, lb.Token(), "result", []byte("from B"))
	require.NoError(t, err)

	// A wakes and writes with its old token: etcd rejects it.
	_, err = st.Put(ctx, la.Token(), "result", []byte("late A"))
	var stale *token.StaleError
	require.ErrorAs(t, err, &stale)
	require.ErrorIs(t, err, token.ErrStale)
	require.Equal(t, lb.Token(), stale.Newer)
	require.Equal(t, "from B", get(t, st, "result"))

	fencertest.WaitClosed(t, la.Done(), 5*time.Second, "A's Done")
	require.ErrorIs(t, la.Err(), etcdstore.ErrLeaseLost)
	require.ErrorIs(t, la.Err(), token.ErrNotHeld)
	require.NoError(t, lb.Err())
}

func TestExternalDeleteEndsLease(t *testing.T) {
	ctx, st, _, l := holding(t, "jobs")
	require.NoError(t, st.Check(ctx, l.Token()))

	_, err := st.Client().Delete(ctx, st.Prefix()+"leases/jobs")
	require.NoError(t, err)
	fencertest.WaitClosed(t, l.Done(), 5*time.Second, "Done after external delete")
	require.ErrorIs(t, l.Err(), etcdstore.ErrLeaseLost)

	_, err = st.Put(ctx, l.Token(), "k", []byte("v"))
	require.ErrorIs(t, err, token.ErrStale)
	require.ErrorIs(t, st.Check(ctx, l.Token()), token.ErrStale)
	_, ok, err := st.Get(ctx, "k")
	require.NoError(t, err)
	require.False(t, ok)
}

func TestExternalReplaceEndsLease(t *testing.T) {
	ctx, st, _, l := holding(t, "jobs")
	// Another holder's record written over ours, keeping the key.
	_, err := st.Client().Put(ctx, st.Prefix()+"leases/jobs", `{"holder":"intruder","epoch":9}`, clientv3.WithIgnoreLease())
	require.NoError(t, err)
	fencertest.WaitClosed(t, l.Done(), 5*time.Second, "Done after another holder appeared")
	require.ErrorIs(t, l.Err(), etcdstore.ErrLeaseLost)
	require.Contains(t, l.Err().Error(), "intruder")
}

func TestSameHolderReacquiresWithGreaterToken(t *testing.T) {
	ctx := fencertest.Context(t)
	st := fencertest.SharedStore(t)
	s := newSession(t, st, etcdstore.WithHolder("worker"))
	first, err := s.Acquire(ctx, "jobs")
	require.NoError(t, err)
	_, err = st.Client().Delete(ctx, st.Prefix()+"leases/jobs")
	require.NoError(t, err)
	fencertest.WaitClosed(t, first.Done(), 5*time.Second, "Done")

	second, err := s.Acquire(ctx, "jobs")
	require.NoError(t, err)
	c, err := second.Token().Compare(first.Token())
	require.NoError(t, err)
	require.Equal(t, 1, c)
	require.Equal(t, first.Token().Epoch+1, second.Token().Epoch)

	// A restarted process with the same configured name is a new holder.
	restarted := newSession(t, st, etcdstore.WithHolder("worker"))
	require.NotEqual(t, s.Holder(), restarted.Holder())
	_, err = restarted.TryAcquire(ctx, "jobs")
	var held *token.HeldError
	require.ErrorAs(t, err, &held)
	require.Equal(t, s.Holder(), held.Holder)
}

func TestRetriedReleaseKeepsNewerHolder(t *testing.T) {
	ctx := fencertest.Context(t)
	st := fencertest.SharedStore(t)
	a := newSession(t, st)
	b := newSession(t, st)
	la, err := a.Acquire(ctx, "jobs")
	require.NoError(t, err)
	require.NoError(t, la.Release(ctx))
	require.ErrorIs(t, la.Err(), etcdstore.ErrReleased)

	lb, err := b.Acquire(ctx, "jobs")
	require.NoError(t, err)
	require.NoError(t, la.Release(ctx)) // the retry
	require.NoError(t, st.Check(ctx, lb.Token()))
	stat, err := st.Status(ctx, "jobs")
	require.NoError(t, err)
	require.Equal(t, lb.Token(), stat.Token)
	require.Equal(t, b.Holder(), stat.Holder)
	select {
	case <-lb.Done():
		t.Fatal("newer holder's lease ended")
	case <-time.After(100 * time.Millisecond):
	}
}

func TestTryAcquireHeldByAnother(t *testing.T) {
	ctx := fencertest.Context(t)
	st := fencertest.SharedStore(t)
	a := newSession(t, st)
	b := newSession(t, st)
	_, err := a.TryAcquire(ctx, "jobs")
	require.NoError(t, err)
	_, err = b.TryAcquire(ctx, "jobs")
	require.ErrorIs(t, err, token.ErrHeldByAnother)
	var held *token.HeldError
	require.ErrorAs(t, err, &held)
	require.Equal(t, a.Holder(), held.Holder)

	wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	_, err = b.Acquire(wctx, "jobs")
	require.ErrorIs(t, err, context.DeadlineExceeded)

	// A session holds a lease at most once; asking again fails at once.
	_, err = a.Acquire(ctx, "jobs")
	require.ErrorIs(t, err, etcdstore.ErrAlreadyHeld)
}

func TestAcquireWaitsForRelease(t *testing.T) {
	ctx := fencertest.Context(t)
	st := fencertest.SharedStore(t)
	a := newSession(t, st)
	b := newSession(t, st)
	la, err := a.Acquire(ctx, "jobs")
	require.NoError(t, err)
	got := make(chan *etcdstore.Lease)
	go func() {
		lb, err := b.Acquire(ctx, "jobs")
		if err != nil {
			t.Error(err)
		}
		got <- lb
	}()
	time.Sleep(100 * time.Millisecond)
	require.NoError(t, la.Release(ctx))
	lb := <-got
	require.NotNil(t, lb)
	require.Greater(t, lb.Token().Revision, la.Token().Revision)
}

func TestSessionCloseEndsAndFreesLeases(t *testing.T) {
	ctx := fencertest.Context(t)
	st := fencertest.SharedStore(t)
	s, err := st.NewSession(ctx)
	require.NoError(t, err)
	l1, err := s.Acquire(ctx, "one")
	require.NoError(t, err)
	l2, err := s.Acquire(ctx, "two")
	require.NoError(t, err)
	require.NoError(t, s.Close(ctx))
	require.NoError(t, s.Close(ctx))
	for _, l := range []*etcdstore.Lease{l1, l2} {
		fencertest.WaitClosed(t, l.Done(), time.Second, "Done")
		require.ErrorIs(t, l.Err(), etcdstore.ErrSessionClosed)
		require.ErrorIs(t, st.Check(ctx, l.Token()), token.ErrStale)
	}
	_, err = s.Acquire(ctx, "three")
	require.ErrorIs(t, err, etcdstore.ErrSessionClosed)
}

func TestKeepAliveFailureFailsClosed(t *testing.T) {
	ctx := fencertest.Context(t)
	p := faultproxy.New(t, strings.TrimPrefix(fencertest.SharedEtcd(t), "http://"))
	st := fencertest.StoreOn(t, []string{p.Endpoint()})
	clk := clocktesting.NewFakeClock(time.Now())
	s := newSession(t, st, etcdstore.WithTTL(3*time.Second), etcdstore.WithClock(clk))
	l, err := s.Acquire(ctx, "jobs")
	require.NoError(t, err)

	p.Cut() // etcd unreachable: keepalives fail, the watch sees nothing
	for i := 0; i < 3; i++ {
		waitWaiters(t, clk)
		select {
		case <-l.Done():
			t.Fatalf("ended after %d s, before the 3 s deadline: %v", i, l.Err())
		default:
		}
		clk.Step(time.Second)
	}
	fencertest.WaitClosed(t, l.Done(), 5*time.Second, "Done after the local deadline")
	require.ErrorIs(t, l.Err(), etcdstore.ErrSessionExpired)
	require.ErrorIs(t, s.Err(), etcdstore.ErrSessionExpired)
}

// waitWaiters waits until a goroutine waits on clk.
func waitWaiters(t *testing.T, clk *clocktesting.FakeClock) {
	t.Helper()
	require.Eventually(t, clk.HasWaiters, 10*time.Second, time.Millisecond)
}

func TestGuardedTxnTellsStaleFromOwnCompare(t *testing.T) {
	ctx, st, s, l := holding(t, "jobs")
	key := st.DataKey("counter")
	put := []clientv3.Op{clientv3.OpPut(key, "1")}

	resp, err := st.Txn(ctx, l.Token(), []clientv3.Cmp{clientv3.Compare(clientv3.Version(key), "=", 0)}, put, nil)
	require.NoError(t, err)
	require.True(t, resp.Succeeded)
	resp, err = st.Txn(ctx, l.Token(), []clientv3.Cmp{clientv3.Compare(clientv3.Version(key), "=", 0)}, put, []clientv3.Op{clientv3.OpGet(key)})
	require.NoError(t, err)
	require.False(t, resp.Succeeded, "the caller's compare failed")
	require.Equal(t, "1", string(resp.Responses[0].GetResponseRange().Kvs[0].Value))

	require.NoError(t, l.Release(ctx))
	_, err = st.Txn(ctx, l.Token(), nil, []clientv3.Op{clientv3.OpPut(key, "2")}, nil)
	require.ErrorIs(t, err, token.ErrStale)
	require.Equal(t, "1", get(t, st, "counter"))

	// The Cmp from Guard composes into the caller's own Txn.
	l2, err := s.Acquire(ctx, "jobs")
	require.NoError(t, err)
	cmps, err := st.Guard(l2.Token())
	require.NoError(t, err)
	r, err := st.Client().Txn(ctx).If(cmps...).Then(clientv3.OpPut(key, "3")).Commit()
	require.NoError(t, err)
	require.True(t, r.Succeeded)
	old, err := st.Guard(l.Token())
	require.NoError(t, err)
	r, err = st.Client().Txn(ctx).If(old...).Then(clientv3.OpPut(key, "4")).Commit()
	require.NoError(t, err)
	require.False(t, r.Succeeded)
	require.Equal(t, "3", get(t, st, "counter"))
	deleted, err := st.Delete(ctx, l.Token(), "counter")
	require.ErrorIs(t, err, token.ErrStale)
	require.False(t, deleted)
	deleted, err = st.Delete(ctx, l2.Token(), "counter")
	require.NoError(t, err)
	require.True(t, deleted)
}

func TestAdvance(t *testing.T) {
	ctx, st, s, l1 := holding(t, "jobs")
	require.NoError(t, st.Advance(ctx, "bucket", l1.Token()))
	require.NoError(t, st.Advance(ctx, "bucket", l1.Token()), "re-advance with the same token is a no-op")
	require.NoError(t, l1.Release(ctx))
	require.ErrorIs(t, st.Advance(ctx, "bucket", l1.Token()), token.ErrStale, "not current")

	l2, err := s.Acquire(ctx, "jobs")
	require.NoError(t, err)
	require.NoError(t, st.Advance(ctx, "bucket", l2.Token()))
	rec, ok, err := st.Fence(ctx, "bucket")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, l2.Token(), rec)

	// A lower token is refused even while it is its lease's current token:
	// the resource has seen a newer one. Simulate with a second lease name
	// whose tokens are of another lease.
	other, err := s.Acquire(ctx, "other")
	require.NoError(t, err)
	err = st.Advance(ctx, "bucket", other.Token())
	require.ErrorIs(t, err, token.ErrForeignLease)
	rec, _, err = st.Fence(ctx, "bucket")
	require.NoError(t, err)
	require.Equal(t, l2.Token(), rec)
}

func TestAdvanceRejectsLowerRecorded(t *testing.T) {
	ctx, st, _, l := holding(t, "jobs")
	// A newer token of the lease reached the resource record through a
	// store with the same prefix (a restore, or a bug elsewhere): Advance
	// must not move it back even though l is current.
	newer := token.Token{Lease: "jobs", Epoch: l.Token().Epoch + 5, Revision: l.Token().Revision + 1000}
	_, err := st.Client().Put(ctx, st.Prefix()+"fences/bucket", newer.String())
	require.NoError(t, err)
	err = st.Advance(ctx, "bucket", l.Token())
	var stale *token.StaleError
	require.ErrorAs(t, err, &stale)
	require.Equal(t, newer, stale.Newer)
	rec, _, err := st.Fence(ctx, "bucket")
	require.NoError(t, err)
	require.Equal(t, newer, rec)
}

func TestConcurrentAdvanceRecordsMaximum(t *testing.T) {
	ctx := fencertest.Context(t)
	st := fencertest.SharedStore(t)
	var (
		mu       sync.Mutex
		accepted []token.Token
		wg       sync.WaitGroup
	)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := st.NewSession(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			defer s.Close(context.Background())
			var mine []token.Token
			for i := 0; i < 5; i++ {
				l, err := s.Acquire(ctx, "jobs")
				if err != nil {
					t.Error(err)
					return
				}
				mine = append(mine, l.Token())
				// Advance with every token this goroutine ever held: the
				// current one may pass, older ones must not.
				for _, tok := range mine {
					err := st.Advance(ctx, "bucket", tok)
					switch {
					case err == nil:
						mu.Lock()
						accepted = append(accepted, tok)
						mu.Unlock()
					case !errors.Is(err, token.ErrStale):
						t.Error(err)
					}
				}
				_ = l.Release(ctx)
			}
		}()
	}
	wg.Wait()
	require.NotEmpty(t, accepted)
	max := accepted[0]
	for _, tok := range accepted {
		if tok.Revision > max.Revision {
			max = tok
		}
	}
	rec, ok, err := st.Fence(ctx, "bucket")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, max, rec)
}

func TestBadInputWritesNothing(t *testing.T) {
	ctx, st, s, l := holding(t, "jobs")
	good := l.Token()
	before, err := st.Client().Get(ctx, "anything")
	require.NoError(t, err)

	badNames := []string{"", strings.Repeat("n", etcdstore.MaxNameLen+1), "a/b", "sp ace", "ctl\x00", "\xff"}
	for _, name := range badNames {
		t.Run(fmt.Sprintf("name %q", name), func(t *testing.T) {
			_, err := s.TryAcquire(ctx, name)
			var ae *etcdstore.ArgumentError
			require.ErrorAs(t, err, &ae)
			require.ErrorIs(t, err, etcdstore.ErrInvalidArgument)
			_, err = s.Acquire(ctx, name)
			require.ErrorIs(t, err, etcdstore.ErrInvalidArgument)
			require.ErrorIs(t, st.Advance(ctx, name, good), etcdstore.ErrInvalidArgument)
			_, err = st.Status(ctx, name)
			require.ErrorIs(t, err, etcdstore.ErrInvalidArgument)
		})
	}
	badTokens := []token.Token{
		{},
		{Lease: "jobs"},
		{Lease: "jobs", Revision: -1},
		{Lease: "a/b", Revision: 5},
		{Lease: "", Revision: 5},
	}
	for _, tok := range badTokens {
		t.Run(fmt.Sprintf("token %#v", tok), func(t *testing.T) {
			_, err := st.Put(ctx, tok, "k", []byte("v"))
			require.ErrorIs(t, err, token.ErrMalformed)
			_, err = st.Delete(ctx, tok, "k")
			require.ErrorIs(t, err, token.ErrMalformed)
			_, err = st.Txn(ctx, tok, nil, nil, nil)
			require.ErrorIs(t, err, token.ErrMalformed)
			require.ErrorIs(t, st.Check(ctx, tok), token.ErrMalformed)
			require.ErrorIs(t, st.Advance(ctx, "r", tok), token.ErrMalformed)
			_, err = st.Guard(tok)
			require.ErrorIs(t, err, token.ErrMalformed)
		})
	}
	for _, key := range []string{"", strings.Repeat("k", etcdstore.MaxKeyLen+1), "ctl\n", "\xfe"} {
		_, err := st.Put(ctx, good, key, []byte("v"))
		require.ErrorIs(t, err, etcdstore.ErrInvalidArgument, "key %q", key)
	}
	_, err = st.Put(ctx, good, "k", make([]byte, etcdstore.MaxValueLen+1))
	require.ErrorIs(t, err, etcdstore.ErrInvalidArgument)

	after, err := st.Client().Get(ctx, "anything")
	require.NoError(t, err)
	require.Equal(t, before.Header.Revision, after.Header.Revision, "bad input changed etcd")
}

func TestConfigValidation(t *testing.T) {
	_, err := etcdstore.New(nil)
	require.ErrorIs(t, err, etcdstore.ErrInvalidArgument)
	_, err = etcdstore.New(fencertest.Client(t, fencertest.SharedEtcd(t)), etcdstore.WithPrefix("no-slash"))
	require.ErrorIs(t, err, etcdstore.ErrInvalidArgument)
	st := fencertest.SharedStore(t)
	for _, ttl := range []time.Duration{0, 500 * time.Millisecond, 1500 * time.Millisecond} {
		_, err := st.NewSession(fencertest.Context(t), etcdstore.WithTTL(ttl))
		require.ErrorIs(t, err, etcdstore.ErrInvalidArgument, "ttl %s", ttl)
	}
}

func TestListPageReadsEveryLeaseOnce(t *testing.T) {
	ctx := fencertest.Context(t)
	st := fencertest.SharedStore(t)
	s := newSession(t, st)
	for _, name := range []string{"a", "b", "c", "d", "e", "f", "g"} {
		l, err := s.Acquire(ctx, name)
		require.NoError(t, err)
		if name == "c" || name == "f" {
			require.NoError(t, l.Release(ctx))
		}
	}
	all, err := st.List(ctx)
	require.NoError(t, err)
	require.Len(t, all, 7)

	var got []etcdstore.Status
	var mores []bool
	after := ""
	for {
		page, more, err := st.ListPage(ctx, after, 3)
		require.NoError(t, err)
		got, mores = append(got, page...), append(mores, more)
		if !more {
			break
		}
		after = page[len(page)-1].Name
	}
	require.Equal(t, all, got)
	require.Equal(t, []bool{true, true, false}, mores)

	page, more, err := st.ListPage(ctx, "g", 3)
	require.NoError(t, err)
	require.Empty(t, page)
	require.False(t, more)
	page, _, err = st.ListPage(ctx, "b", 1)
	require.NoError(t, err)
	require.Equal(t, all[2:3], page, "the page starts after the name given")

	page, _, err = st.ListPage(ctx, "b~not a name", 1)
	require.NoError(t, err)
	require.Equal(t, all[2:3], page, "any cursor works")

	_, _, err = st.ListPage(ctx, "", 0)
	var ae *etcdstore.ArgumentError
	require.ErrorAs(t, err, &ae)
	require.Equal(t, "limit", ae.Arg)
}

// TestListPageWithNamePrefix: WithNamePrefix lists the leases whose names
// start with the prefix, a page at a time, and a cursor before or after
// the prefix's range works.
func TestListPageWithNamePrefix(t *testing.T) {
	ctx := fencertest.Context(t)
	st := fencertest.SharedStore(t)
	s := newSession(t, st)
	for _, name := range []string{"a", "bench", "bench-0", "bench-0-1", "bench-1", "benches", "bencg", "c"} {
		_, err := s.Acquire(ctx, name)
		require.NoError(t, err)
	}
	var names []string
	var mores []bool
	after := ""
	for {
		page, more, err := st.ListPage(ctx, after, 2, etcdstore.WithNamePrefix("bench-"))
		require.NoError(t, err)
		for _, p := range page {
			names = append(names, p.Name)
		}
		mores = append(mores, more)
		if !more {
			break
		}
		after = page[len(page)-1].Name
	}
	require.Equal(t, []string{"bench-0", "bench-0-1", "bench-1"}, names)
	require.Equal(t, []bool{true, false}, mores)

	page, _, err := st.ListPage(ctx, "a", 5, etcdstore.WithNamePrefix("bench-"))
	require.NoError(t, err)
	require.Len(t, page, 3, "a cursor before the range starts at the range")
	page, more, err := st.ListPage(ctx, "c", 5, etcdstore.WithNamePrefix("bench-"))
	require.NoError(t, err)
	require.Empty(t, page, "a cursor past the range lists nothing")
	require.False(t, more)
	page, _, err = st.ListPage(ctx, "", 5, etcdstore.WithNamePrefix("nosuch"))
	require.NoError(t, err)
	require.Empty(t, page)
}

// TestListPageSurvivesForeignKeys checks that a key under epochs/ that
// fencer did not write, with a name no lease may have, is listed and can
// be paged past.
func TestListPageSurvivesForeignKeys(t *testing.T) {
	ctx := fencertest.Context(t)
	st := fencertest.SharedStore(t)
	s := newSession(t, st)
	for _, name := range []string{"a", "c"} {
		_, err := s.Acquire(ctx, name)
		require.NoError(t, err)
	}
	_, err := st.Client().Put(ctx, st.Prefix()+"epochs/b not/a name", "7")
	require.NoError(t, err)
	var names []string
	after := ""
	for {
		page, more, err := st.ListPage(ctx, after, 1)
		require.NoError(t, err)
		for _, p := range page {
			names = append(names, p.Name)
		}
		if !more {
			break
		}
		after = page[len(page)-1].Name
	}
	require.Equal(t, []string{"a", "b not/a name", "c"}, names)
}

func TestListAndStatus(t *testing.T) {
	ctx := fencertest.Context(t)
	st := fencertest.SharedStore(t)
	s := newSession(t, st)
	la, err := s.Acquire(ctx, "a")
	require.NoError(t, err)
	lb, err := s.Acquire(ctx, "b")
	require.NoError(t, err)
	require.NoError(t, lb.Release(ctx))
	list, err := st.List(ctx)
	require.NoError(t, err)
	require.Equal(t, []etcdstore.Status{
		{Name: "a", Token: la.Token(), Holder: s.Holder(), Epoch: 1},
		{Name: "b", Epoch: 1},
	}, list)
}

// countingStore returns a store on st's prefix whose etcd client counts the
// Txns it sends.
func countingStore(t *testing.T, st *etcdstore.Store) (*etcdstore.Store, *atomic.Int64) {
	t.Helper()
	var txns atomic.Int64
	count := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if strings.HasSuffix(method, "/Txn") {
			txns.Add(1)
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{fencertest.SharedEtcd(t)}, DialTimeout: 5 * time.Second,
		Logger: zap.NewNop(), DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(count)}})
	require.NoError(t, err)
	t.Cleanup(func() { cli.Close() })
	cst, err := etcdstore.New(cli, etcdstore.WithPrefix(st.Prefix()))
	require.NoError(t, err)
	return cst, &txns
}

func TestReacquiringAKnownLeaseTakesOneTxn(t *testing.T) {
	ctx := fencertest.Context(t)
	st := fencertest.SharedStore(t)
	cst, txns := countingStore(t, st)
	grant, err := st.Client().Grant(ctx, 60)
	require.NoError(t, err)
	acquire := func(s *etcdstore.Store) token.Token {
		t.Helper()
		tok, _, err := s.AcquireOn(ctx, grant.ID, "holder", "known", 0)
		require.NoError(t, err)
		_, err = s.Release(ctx, tok)
		require.NoError(t, err)
		return tok
	}
	acquire(cst)
	txns.Store(0)
	tok := acquire(cst)
	require.Equal(t, uint64(2), tok.Epoch)
	require.Equal(t, int64(2), txns.Load(), "one Txn to acquire, one to release")

	// Another store's acquisition makes the guess wrong: one more Txn, and
	// still the right epoch.
	acquire(st)
	txns.Store(0)
	tok = acquire(cst)
	require.Equal(t, uint64(4), tok.Epoch)
	require.Equal(t, int64(3), txns.Load())
}

// TestAcquireOnNoEtcdLeaseIsRefused: AcquireOn with etcd lease 0 would
// write a holder key that never expires; it is refused and writes nothing.
func TestAcquireOnNoEtcdLeaseIsRefused(t *testing.T) {
	ctx := fencertest.Context(t)
	st := fencertest.SharedStore(t)
	_, _, err := st.AcquireOn(ctx, 0, "holder", "forever", 0)
	require.ErrorIs(t, err, token.ErrInvalidArgument)
	status, err := st.Status(ctx, "forever")
	require.NoError(t, err)
	require.Equal(t, etcdstore.Status{Name: "forever"}, status)
}

func TestHolderKeyAndHolderOf(t *testing.T) {
	ctx, st, s, l := holding(t, "ring:r:s1")
	resp, err := st.Client().Get(ctx, st.HolderKey("ring:r:"), clientv3.WithPrefix())
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1)
	require.Equal(t, st.HolderKey("ring:r:s1"), string(resp.Kvs[0].Key))
	tok, holder := etcdstore.HolderOf("ring:r:s1", resp.Kvs[0])
	require.Equal(t, l.Token(), tok)
	require.Equal(t, s.Holder(), holder)
	require.Equal(t, st.HolderKey(""), st.HolderKey("x")[:len(st.HolderKey(""))])
}
