package etcdstore_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencer-dev/fencer/fencertest"
	"github.com/fencer-dev/fencer/token"
)

// forgeries returns tokens that were never issued but share the lease and
// revision of real, the current token of its lease, and one that shares
// its lease and epoch but not its revision. real's epoch must be at least
// 2.
func forgeries(real token.Token) []token.Token {
	with := func(epoch uint64, rev int64) token.Token {
		return token.Token{Lease: real.Lease, Epoch: epoch, Revision: rev}
	}
	return []token.Token{
		with(real.Epoch+1, real.Revision),
		with(real.Epoch+5, real.Revision),
		with(real.Epoch-1, real.Revision), // the previous acquisition's epoch
		with(0, real.Revision),
		with(^uint64(0), real.Revision),
		with(real.Epoch, real.Revision+1),
	}
}

// TestForgedTokensAreRefusedByEveryGuardedCall is the attack on exact
// tokens: a token that differs from the current one only in its epoch (or
// only in its revision) was never issued, and no guarded call may accept
// it or write anything with it.
func TestForgedTokensAreRefusedByEveryGuardedCall(t *testing.T) {
	ctx, st, s, first := holding(t, "exact")
	require.NoError(t, first.Release(ctx))
	l, err := s.Acquire(ctx, "exact")
	require.NoError(t, err)
	real := l.Token()
	require.Equal(t, uint64(2), real.Epoch)

	calls := map[string]func(tok token.Token) error{
		"Check": func(tok token.Token) error { return st.Check(ctx, tok) },
		"Put": func(tok token.Token) error {
			_, err := st.Put(ctx, tok, "forged", []byte("x"))
			return err
		},
		"Delete": func(tok token.Token) error {
			_, err := st.Delete(ctx, tok, "kept")
			return err
		},
		"Txn": func(tok token.Token) error {
			_, err := st.Txn(ctx, tok, nil, []clientv3.Op{clientv3.OpPut(st.DataKey("forged"), "x")}, nil)
			return err
		},
		"Advance": func(tok token.Token) error { return st.Advance(ctx, "forged", tok) },
		"Release": func(tok token.Token) error {
			released, err := st.Release(ctx, tok)
			if err == nil && released {
				return fmt.Errorf("released with %s", tok)
			}
			return token.ErrStale
		},
		"Guard in the caller's Txn": func(tok token.Token) error {
			cmps, err := st.Guard(tok)
			if err != nil {
				return err
			}
			r, err := st.Client().Txn(ctx).If(cmps...).Then(clientv3.OpPut(st.DataKey("forged"), "x")).Commit()
			if err == nil && r.Succeeded {
				return fmt.Errorf("raw Txn guarded by %s committed", tok)
			}
			return token.ErrStale
		},
		"Put, batched": func(tok token.Token) error {
			var forgedErr, realErr error
			queueUp(t, st,
				func() { _, realErr = st.Put(ctx, real, "batched", []byte("real")) },
				func() { _, forgedErr = st.Put(ctx, tok, "forged", []byte("x")) },
			)
			require.NoError(t, realErr)
			return forgedErr
		},
	}
	_, err = st.Put(ctx, real, "kept", []byte("v"))
	require.NoError(t, err)
	for _, forged := range forgeries(real) {
		for name, call := range calls {
			t.Run(fmt.Sprintf("%s with %s", name, forged), func(t *testing.T) {
				err := call(forged)
				require.ErrorIs(t, err, token.ErrStale)
				var stale *token.StaleError
				if name != "Release" && name != "Guard in the caller's Txn" {
					require.ErrorAs(t, err, &stale)
					require.Equal(t, forged, stale.Token)
				}
			})
		}
	}
	_, found, err := st.Get(ctx, "forged")
	require.NoError(t, err)
	require.False(t, found, "a forged token wrote a data key")
	require.Equal(t, "v", get(t, st, "kept"), "a forged token deleted a data key")
	_, found, err = st.Fence(ctx, "forged")
	require.NoError(t, err)
	require.False(t, found, "a forged token advanced a fence")
	require.NoError(t, st.Check(ctx, real), "a forged token released the real holder")
	require.NoError(t, l.Err())

	// The real token passes every call.
	for _, name := range []string{"Check", "Put", "Txn", "Advance", "Guard in the caller's Txn", "Put, batched"} {
		err := calls[name](real)
		if name == "Guard in the caller's Txn" {
			require.ErrorContains(t, err, "committed", name)
			continue
		}
		require.NoError(t, err, name)
	}
	released, err := st.Release(ctx, real)
	require.NoError(t, err)
	require.True(t, released)
}

// TestReleasedAndReacquiredLeaseRefusesEveryOlderToken pins the
// acquisition across a release and a re-acquisition by another session:
// neither the released token nor a token with the new revision and the old
// epoch passes.
func TestReleasedAndReacquiredLeaseRefusesEveryOlderToken(t *testing.T) {
	ctx := fencertest.Context(t)
	st := fencertest.SharedStore(t)
	a, b := newSession(t, st), newSession(t, st)
	la, err := a.Acquire(ctx, "jobs")
	require.NoError(t, err)
	require.NoError(t, la.Release(ctx))
	require.ErrorIs(t, st.Check(ctx, la.Token()), token.ErrStale, "released, not re-acquired")
	lb, err := b.Acquire(ctx, "jobs")
	require.NoError(t, err)
	for _, tok := range []token.Token{
		la.Token(),
		{Lease: "jobs", Epoch: la.Token().Epoch, Revision: lb.Token().Revision},
		{Lease: "jobs", Epoch: lb.Token().Epoch, Revision: la.Token().Revision},
	} {
		require.ErrorIs(t, st.Check(ctx, tok), token.ErrStale, "%s", tok)
		_, err := st.Put(ctx, tok, "k", []byte("x"))
		require.ErrorIs(t, err, token.ErrStale, "%s", tok)
	}
	require.NoError(t, st.Check(ctx, lb.Token()))
}

// TestForgedTokenOfAnotherLeaseIsRefused moves a real token to another
// lease name, with and without that lease held.
func TestForgedTokenOfAnotherLeaseIsRefused(t *testing.T) {
	ctx := fencertest.Context(t)
	st := fencertest.SharedStore(t)
	s := newSession(t, st)
	la, err := s.Acquire(ctx, "a")
	require.NoError(t, err)
	lb, err := s.Acquire(ctx, "b")
	require.NoError(t, err)
	for _, tok := range []token.Token{
		{Lease: "b", Epoch: la.Token().Epoch, Revision: la.Token().Revision},
		{Lease: "free", Epoch: la.Token().Epoch, Revision: la.Token().Revision},
	} {
		require.ErrorIs(t, st.Check(ctx, tok), token.ErrStale, "%s", tok)
		_, err := st.Put(ctx, tok, "k", []byte("x"))
		require.ErrorIs(t, err, token.ErrStale, "%s", tok)
	}
	require.NoError(t, st.Check(ctx, lb.Token()))
}
