package etcdstore_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fencer-dev/fencer/etcdstore"
	"github.com/fencer-dev/fencer/fencertest"
	"github.com/fencer-dev/fencer/internal/holderkey"
	"github.com/fencer-dev/fencer/token"
)

// The tests in this file stop a session exactly where a change to a
// holder key could slip between the acquiring Txn and the session's
// watch, make the change there, and check that the Lease still ends.

// progress follows how far a session's watch has applied changes.
type progress struct {
	mu    sync.Mutex
	seen  int64
	moved chan struct{}
}

func newProgress() *progress { return &progress{moved: make(chan struct{})} }

// saw is the session's Observed hook.
func (p *progress) saw(rev int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if rev > p.seen {
		p.seen = rev
		close(p.moved)
		p.moved = make(chan struct{})
	}
}

// wait returns once every change up to rev has been applied.
func (p *progress) wait(t *testing.T, ctx context.Context, rev int64) {
	t.Helper()
	for {
		p.mu.Lock()
		seen, moved := p.seen, p.moved
		p.mu.Unlock()
		if seen >= rev {
			return
		}
		select {
		case <-moved:
		case <-ctx.Done():
			t.Fatalf("the session's watch never applied revision %d (it got to %d)", rev, seen)
		}
	}
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
	l   *etcdstore.Lease
	err error
}

func tryAcquire(ctx context.Context, s *etcdstore.Session, name string) <-chan acquisition {
	ch := make(chan acquisition, 1)
	go func() {
		l, err := s.TryAcquire(ctx, name)
		ch <- acquisition{l, err}
	}()
	return ch
}

// The watch delivers the deletion of the new holder key before the Lease
// is registered with it.
func TestLossBeforeRegistrationEndsLease(t *testing.T) {
	ctx := fencertest.Context(t)
	st := fencertest.SharedStore(t)
	seen := newProgress()
	acquired := newGate()
	var tok token.Token
	s := newSession(t, st, etcdstore.WithHooks(etcdstore.SessionHooks{
		Acquired: func(tk token.Token) { tok = tk; acquired.pass() },
		Observed: seen.saw,
	}))
	res := tryAcquire(ctx, s, "jobs")
	<-acquired.reached
	del, err := st.Client().Delete(ctx, holderkey.Key(st.Prefix(), "jobs"))
	require.NoError(t, err)
	require.EqualValues(t, 1, del.Deleted)
	seen.wait(t, ctx, del.Header.Revision) // the watch has seen the deletion, with nothing held
	close(acquired.open)

	r := <-res
	require.NoError(t, r.err)
	require.Equal(t, tok, r.l.Token())
	fencertest.WaitClosed(t, r.l.Done(), 5*time.Second, "Done of a lease deleted before it was registered")
	require.ErrorIs(t, r.l.Err(), etcdstore.ErrLeaseLost)
	require.ErrorIs(t, st.Check(ctx, tok), token.ErrStale)

	// The name is free for the session again.
	l, err := s.TryAcquire(ctx, "jobs")
	require.NoError(t, err)
	require.NoError(t, l.Err())
}

// The holder key is replaced by another session's before the Lease is
// registered; the watch delivers both changes first.
func TestReplacementBeforeRegistrationEndsLease(t *testing.T) {
	ctx := fencertest.Context(t)
	st := fencertest.SharedStore(t)
	seen := newProgress()
	acquired := newGate()
	s := newSession(t, st, etcdstore.WithHooks(etcdstore.SessionHooks{
		Acquired: func(token.Token) { acquired.pass() },
		Observed: seen.saw,
	}))
	other := newSession(t, st)
	res := tryAcquire(ctx, s, "jobs")
	<-acquired.reached
	_, err := st.Client().Delete(ctx, holderkey.Key(st.Prefix(), "jobs"))
	require.NoError(t, err)
	lo, err := other.TryAcquire(ctx, "jobs")
	require.NoError(t, err)
	seen.wait(t, ctx, lo.Token().Revision)
	close(acquired.open)

	r := <-res
	require.NoError(t, r.err)
	fencertest.WaitClosed(t, r.l.Done(), 5*time.Second, "Done of a lease replaced before it was registered")
	require.ErrorIs(t, r.l.Err(), etcdstore.ErrLeaseLost)
	require.NoError(t, lo.Err())
}

// The watch breaks while an acquisition is in flight, the holder key is
// deleted before the session re-reads the holder keys, and the session
// watches again from after the deletion: the re-read, not the watch, must
// end the Lease.
func TestLossBeforeRegistrationAcrossResync(t *testing.T) {
	ctx := fencertest.Context(t)
	st := fencertest.SharedStore(t)
	watching := make(chan func(), 8)
	acquired, resync := newGate(), newGate()
	s := newSession(t, st, etcdstore.WithHooks(etcdstore.SessionHooks{
		Acquired: func(token.Token) { acquired.pass() },
		Watching: func(cancel func()) { watching <- cancel },
		Resync:   resync.pass,
	}))
	breakWatch := <-watching
	res := tryAcquire(ctx, s, "jobs")
	<-acquired.reached
	breakWatch()
	<-resync.reached // the broken watch is gone and saw no deletion
	_, err := st.Client().Delete(ctx, holderkey.Key(st.Prefix(), "jobs"))
	require.NoError(t, err)
	close(resync.open)
	<-watching // re-read and watching again, from after the deletion
	close(acquired.open)

	r := <-res
	require.NoError(t, r.err)
	fencertest.WaitClosed(t, r.l.Done(), 5*time.Second, "Done of a lease deleted while the watch was down")
	require.ErrorIs(t, r.l.Err(), etcdstore.ErrLeaseLost)
}

// A lease acquired after the re-read's revision, and registered before
// the re-read is applied, is absent from what was read: that says nothing
// about it, and it stays held.
func TestResyncKeepsLeaseAcquiredAfterItsRead(t *testing.T) {
	ctx := fencertest.Context(t)
	st := fencertest.SharedStore(t)
	seen := newProgress()
	watching := make(chan func(), 8)
	reread := newGate()
	var readAt int64
	s := newSession(t, st, etcdstore.WithHooks(etcdstore.SessionHooks{
		Watching: func(cancel func()) { watching <- cancel },
		Reread:   func(rev int64) { readAt = rev; reread.pass() },
		Observed: seen.saw,
	}))
	(<-watching)()
	<-reread.reached
	l, err := s.TryAcquire(ctx, "jobs")
	require.NoError(t, err)
	require.Greater(t, l.Token().Revision, readAt)
	close(reread.open)
	seen.wait(t, ctx, readAt)
	<-watching
	require.NoError(t, l.Err(), "a lease acquired after the re-read was ended by it")

	// The new watch still ends it on loss.
	_, err = st.Client().Delete(ctx, holderkey.Key(st.Prefix(), "jobs"))
	require.NoError(t, err)
	fencertest.WaitClosed(t, l.Done(), 5*time.Second, "Done after the watch came back")
	require.ErrorIs(t, l.Err(), etcdstore.ErrLeaseLost)
}
