package client_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	grpcbackoff "google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"

	"github.com/fencer-dev/fencer/client"
	"github.com/fencer-dev/fencer/client/clienttest"
	"github.com/fencer-dev/fencer/etcdstore"
	"github.com/fencer-dev/fencer/fencertest"
	"github.com/fencer-dev/fencer/internal/holderkey"
	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
	"github.com/fencer-dev/fencer/server"
	"github.com/fencer-dev/fencer/token"
)

// The tests in this file stop a session exactly where a loss could slip
// between an acquisition and the session's watch, lose the lease there,
// and check that its Done still closes.

// service serves a store of its own on the shared etcd member, to
// anonymous callers, and returns the store and a client of the server.
func service(t testing.TB) (*etcdstore.Store, *client.Client) {
	t.Helper()
	svc := fencertest.Service(t, fencertest.WithStore(fencertest.SharedStore(t)))
	return svc.Store, svc.Client
}

func newSession(t testing.TB, c *client.Client, opts ...client.SessionOption) *client.Session {
	t.Helper()
	s, err := c.NewSession(opts...)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.Close(ctx)
	})
	return s
}

// gate stops the first goroutine that reaches it until opened; later ones
// pass once it is open.
type gate struct {
	reached chan struct{}
	open    chan struct{}
	once    sync.Once
}

func newGate() *gate { return &gate{reached: make(chan struct{}), open: make(chan struct{})} }

func (g *gate) pass() {
	g.once.Do(func() { close(g.reached) })
	<-g.open
}

type acquisition struct {
	l   *client.Lease
	err error
}

func acquire(ctx context.Context, s *client.Session, name string) <-chan acquisition {
	ch := make(chan acquisition, 1)
	go func() {
		l, err := s.Acquire(ctx, name)
		ch <- acquisition{l, err}
	}()
	return ch
}

// waitFor is how long a test waits for an event before it fails naming
// it, rather than hanging its package.
const waitFor = 20 * time.Second

// recv returns the next value from ch, or fails t naming what it waited
// for after waitFor.
func recv[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(waitFor):
		t.Fatalf("%s: nothing within %s", what, waitFor)
		panic("unreachable")
	}
}

// deleteHolder deletes lease name's holder key behind fencer's back and
// returns the revision of the deletion.
func deleteHolder(t *testing.T, st *etcdstore.Store, name string) int64 {
	t.Helper()
	resp, err := st.Client().Delete(fencertest.Context(t), holderkey.Key(st.Prefix(), name))
	require.NoError(t, err)
	require.EqualValues(t, 1, resp.Deleted)
	return resp.Header.Revision
}

// The watch reports the new token lost before the Acquire call's reply
// has been turned into a Lease.
func TestLossBeforeRegistrationEndsLease(t *testing.T) {
	ctx := fencertest.Context(t)
	st, c := service(t)
	acquired := newGate()
	var tok token.Token
	lost := make(chan string, 16)
	s := newSession(t, c, clienttest.WithHooks(clienttest.SessionHooks{
		Acquired: func(tk token.Token) {
			if tk.Lease == "b" {
				tok = tk
				acquired.pass()
			}
		},
		Received: func(ev *fencerv1.WatchLeaseResponse) {
			if ev.GetType() == fencerv1.WatchLeaseResponse_TYPE_LOST {
				lost <- ev.GetToken()
			}
		},
	}))
	_, err := s.Acquire(ctx, "a") // opens the session and its watch
	require.NoError(t, err)
	res := acquire(ctx, s, "b")
	fencertest.WaitClosed(t, acquired.reached, waitFor, "the acquisition of b")
	deleteHolder(t, st, "b")
	// The watch reports it, with nothing held under "b".
	require.Equal(t, tok.String(), recv(t, lost, "the watch's report of the loss"))
	close(acquired.open)

	r := recv(t, res, "the acquisition of b")
	require.NoError(t, r.err)
	fencertest.WaitClosed(t, r.l.Done(), 5*time.Second, "Done of a lease lost before it was registered")
	require.ErrorIs(t, r.l.Err(), etcdstore.ErrLeaseLost)
}

// The session's first acquisition: its watch starts only after the reply,
// from the token's revision, so it reports a loss that came before.
func TestLossBeforeTheWatchStartsEndsLease(t *testing.T) {
	ctx := fencertest.Context(t)
	st, c := service(t)
	acquired := newGate()
	s := newSession(t, c, clienttest.WithHooks(clienttest.SessionHooks{
		Acquired: func(token.Token) { acquired.pass() },
	}))
	res := acquire(ctx, s, "a")
	fencertest.WaitClosed(t, acquired.reached, waitFor, "the acquisition of a")
	deleteHolder(t, st, "a")
	close(acquired.open)

	r := recv(t, res, "the acquisition of a")
	require.NoError(t, r.err)
	fencertest.WaitClosed(t, r.l.Done(), 5*time.Second, "Done of a lease lost before the session's watch started")
	require.ErrorIs(t, r.l.Err(), etcdstore.ErrLeaseLost)
}

// replicas serves one store from one fencer server at a time, to a
// client whose resolver follows the current one, as a client behind a
// load balancer follows a failover between replicas.
type replicas struct {
	t   *testing.T
	cfg server.Config
	r   *manual.Resolver
	srv *server.Server
}

// newReplicas serves st to anonymous callers and returns the replicas and
// a client of the current one.
func newReplicas(t *testing.T, st *etcdstore.Store) (*replicas, *client.Client) {
	t.Helper()
	p := &replicas{t: t, cfg: server.Config{Store: st, Authenticator: server.Anonymous("client-test")}}
	addr, srv := fencertest.Serve(t, p.cfg)
	p.srv = srv
	p.r = manual.NewBuilderWithScheme("replicas")
	p.r.InitialState(resolver.State{Addresses: []resolver.Address{{Addr: addr}}})
	cc, err := grpc.NewClient(p.r.Scheme()+":///fencer",
		grpc.WithResolvers(p.r),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: grpcbackoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, MaxDelay: time.Second}, MinConnectTimeout: 5 * time.Second}))
	require.NoError(t, err)
	t.Cleanup(func() { cc.Close() })
	return p, client.New(cc)
}

// failover shuts the current server down and moves the client to a
// server started now, whose lease hub has seen no loss before this
// moment: a stream resuming from an earlier revision must read it from
// etcd.
func (p *replicas) failover() {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = p.srv.Shutdown(ctx) // a deadline is a hard stop, which serves as well
	addr, srv := fencertest.Serve(p.t, p.cfg)
	p.srv = srv
	p.r.UpdateState(resolver.State{Addresses: []resolver.Address{{Addr: addr}}})
}

// The watch cannot report a loss because its history was compacted (it
// resumes on a replica started after the loss and the compaction), so it
// checks the held tokens; an acquisition in flight during that check is
// checked once registered.
func TestLossHiddenByCompactionEndsLeaseAcquiredMeanwhile(t *testing.T) {
	ctx := fencertest.Context(t)
	st := fencertest.SharedStore(t)
	p, c := newReplicas(t, st)
	watch, acquired := newGate(), newGate()
	compacted := make(chan struct{}, 16)
	// checking is closed when the resync after the compaction checks "a".
	// That check comes after the resync has marked the acquisition in
	// flight for a check of its own, whichever stream runs it: a resync
	// whose check gets no answer is made again on the next stream.
	checking := make(chan struct{})
	var checkingOnce sync.Once
	s := newSession(t, c, clienttest.WithHooks(clienttest.SessionHooks{
		Acquired: func(tk token.Token) {
			if tk.Lease == "b" {
				acquired.pass()
			}
		},
		Watch: func(from int64) {
			watch.pass()
			if from == 0 {
				compacted <- struct{}{}
			}
		},
		Check: func(ctx context.Context, tk token.Token) error {
			if tk.Lease == "a" {
				checkingOnce.Do(func() { close(checking) })
			}
			return c.Check(ctx, tk)
		},
	}))
	la, err := s.Acquire(ctx, "a") // opens the session; its watch waits at the gate
	require.NoError(t, err)
	fencertest.WaitClosed(t, watch.reached, waitFor, "the session's watch")
	res := acquire(ctx, s, "b")
	fencertest.WaitClosed(t, acquired.reached, waitFor, "the acquisition of b")
	_, err = st.Client().Compact(ctx, deleteHolder(t, st, "b"))
	require.NoError(t, err)
	p.failover()
	close(watch.open) // compacted, so the watch starts over from now and checks "a"
	fencertest.WaitClosed(t, checking, waitFor, "the check of a after the compaction")
	require.NotEmpty(t, compacted, "the watch started over from now")
	close(acquired.open)

	r := recv(t, res, "the acquisition of b")
	require.NoError(t, r.err)
	fencertest.WaitClosed(t, r.l.Done(), 5*time.Second, "Done of a lease lost while the watch's history was compacted")
	require.ErrorIs(t, r.l.Err(), etcdstore.ErrLeaseLost)
	require.ErrorIs(t, r.l.Err(), token.ErrStale)
	require.NoError(t, la.Err())
}

// After a compaction, a check that gets no answer is made again.
func TestCompactionCheckIsRetriedUntilAnswered(t *testing.T) {
	ctx := fencertest.Context(t)
	st := fencertest.SharedStore(t)
	p, c := newReplicas(t, st)
	watch := newGate()
	var checks atomic.Int32
	s := newSession(t, c, clienttest.WithHooks(clienttest.SessionHooks{
		Watch: func(int64) { watch.pass() },
		Check: func(ctx context.Context, tok token.Token) error {
			if checks.Add(1) == 1 {
				return errors.New("injected: no server answered")
			}
			return c.Check(ctx, tok)
		},
	}))
	la, err := s.Acquire(ctx, "a")
	require.NoError(t, err)
	fencertest.WaitClosed(t, watch.reached, waitFor, "the session's watch")
	_, err = st.Client().Compact(ctx, deleteHolder(t, st, "a"))
	require.NoError(t, err)
	p.failover()
	close(watch.open)

	fencertest.WaitClosed(t, la.Done(), waitFor, "Done of a lease whose first check failed")
	require.ErrorIs(t, la.Err(), token.ErrStale)
	require.GreaterOrEqual(t, checks.Load(), int32(2))
}

// Client.Release ends an acquisition by its token alone, once;
// WatchSession reports it lost, after saying its watch is in place; and
// the watch ends with the session.
func TestReleaseByTokenAndWatchSession(t *testing.T) {
	ctx := fencertest.Context(t)
	_, c := service(t)
	s := newSession(t, c)
	l, err := s.Acquire(ctx, "watched")
	require.NoError(t, err)

	synced := make(chan int64, 1)
	events := make(chan client.LossEvent, 4)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- c.WatchSession(wctx, s.ID(), func(rev int64) { synced <- rev }, func(ev client.LossEvent) error {
			events <- ev
			return nil
		})
	}()
	require.GreaterOrEqual(t, recv(t, synced, "the session's watch in place"), l.Token().Revision)

	released, err := c.Release(ctx, l.Token())
	require.NoError(t, err)
	require.True(t, released)
	ev := recv(t, events, "the release reported")
	require.Equal(t, l.Token(), ev.Token)
	require.Equal(t, "deleted", ev.Reason)
	fencertest.WaitClosed(t, l.Done(), waitFor, "Done of the released lease")
	released, err = c.Release(ctx, l.Token())
	require.NoError(t, err)
	require.False(t, released, "a second release ends nothing")

	require.NoError(t, s.Close(ctx))
	require.ErrorIs(t, recv(t, done, "the end of the session's watch"), etcdstore.ErrSessionExpired)
}
