package fencertest_test

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fencer-dev/fencer/etcdstore"
	"github.com/fencer-dev/fencer/fencertest"
	"github.com/fencer-dev/fencer/token"
)

// ctx returns a context that ends with t or after a minute.
func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return c
}

// waitDone waits until h's Done closes, and fails t if it has not within
// a minute, so that a holder that never notices fails rather than hangs.
func waitDone(t *testing.T, h interface{ Done() <-chan struct{} }) {
	t.Helper()
	select {
	case <-h.Done():
	case <-time.After(time.Minute):
		t.Fatal("the superseded holder's Done never closed")
	}
}

// TestSupersedeStore checks that after Supersede the holder's guarded
// writes fail with a *token.StaleError naming the new token, its Done
// closes with ErrLeaseLost, and the new holder writes.
func TestSupersedeStore(t *testing.T) {
	c := ctx(t)
	st := fencertest.Store(t)
	held, err := fencertest.Session(t, st).Acquire(c, "orders")
	require.NoError(t, err)
	_, err = st.Put(c, held.Token(), "total", []byte("100"))
	require.NoError(t, err)

	newer := fencertest.Supersede(t, st, held)

	_, err = st.Put(c, held.Token(), "total", []byte("late"))
	var stale *token.StaleError
	require.ErrorAs(t, err, &stale)
	require.Equal(t, newer.Token(), stale.Newer)
	require.ErrorIs(t, st.Advance(c, "printer", held.Token()), token.ErrStale)
	waitDone(t, held)
	require.ErrorIs(t, held.Err(), etcdstore.ErrLeaseLost)

	cmp, err := newer.Token().Compare(held.Token())
	require.NoError(t, err)
	require.Equal(t, 1, cmp)
	_, err = st.Put(c, newer.Token(), "total", []byte("250"))
	require.NoError(t, err)
	v, _, err := st.Get(c, "total")
	require.NoError(t, err)
	require.Equal(t, "250", string(v.Data))
}

// fatalRecorder is a TB whose Fatalf records the message and ends the
// calling goroutine, as testing.T's does, without failing the test.
type fatalRecorder struct {
	*testing.T
	mu  sync.Mutex
	msg string
}

func (r *fatalRecorder) Fatalf(format string, args ...any) {
	r.mu.Lock()
	r.msg = fmt.Sprintf(format, args...)
	r.mu.Unlock()
	runtime.Goexit()
}

// fatal runs f with a fatalRecorder on a goroutine of its own and returns
// what f's Fatalf said, or "" if f returned.
func fatal(t *testing.T, f func(fencertest.TB)) string {
	r := &fatalRecorder{T: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(r)
	}()
	<-done
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.msg
}

// TestSupersedeRefusesStaleToken checks that Supersede fails the test,
// and changes nothing, when the token it is given is no longer current.
func TestSupersedeRefusesStaleToken(t *testing.T) {
	c := ctx(t)
	st := fencertest.Store(t)
	s := fencertest.Session(t, st)
	first, err := s.Acquire(c, "orders")
	require.NoError(t, err)
	require.NoError(t, first.Release(c))
	second, err := s.Acquire(c, "orders")
	require.NoError(t, err)

	msg := fatal(t, func(tb fencertest.TB) { fencertest.Supersede(tb, st, first) })
	require.Contains(t, msg, "not its lease's current token")
	require.NoError(t, st.Check(c, second.Token()), "a refused Supersede must leave the current holder alone")
}
