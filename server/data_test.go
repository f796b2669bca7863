package server_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fencer-dev/fencer/client"
	"github.com/fencer-dev/fencer/internal/etcdtest"
	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
	"github.com/fencer-dev/fencer/token"
)

// TestServiceRefusesForgedTokens is the exact-token attack through the
// service: a token with the current lease and revision but another epoch
// (or the current epoch and another revision) was never issued, and every
// guarded call refuses it with STALE_TOKEN and writes nothing.
func TestServiceRefusesForgedTokens(t *testing.T) {
	ctx := etcdtest.Context(t)
	st := etcdtest.Store(t)
	addr, _ := startServer(t, st)
	c := client.New(dial(t, alice, addr))
	raw := fencerv1.NewFencerServiceClient(dial(t, alice, addr))
	s := newSession(t, c)
	first, err := s.Acquire(ctx, "exact")
	require.NoError(t, err)
	require.NoError(t, first.Release(ctx))
	l, err := s.Acquire(ctx, "exact")
	require.NoError(t, err)
	real := l.Token()
	_, err = c.Put(ctx, real, "kept", []byte("v"))
	require.NoError(t, err)

	put := []*fencerv1.Op{{Op: &fencerv1.Op_Put{Put: &fencerv1.PutOp{Key: "forged", Value: []byte("x")}}}}
	calls := map[string]func(tok token.Token) error{
		"Check":   func(tok token.Token) error { return c.Check(ctx, tok) },
		"Advance": func(tok token.Token) error { return c.Advance(ctx, "forged", tok) },
		"Put": func(tok token.Token) error {
			_, err := c.Put(ctx, tok, "forged", []byte("x"))
			return err
		},
		"Delete": func(tok token.Token) error {
			_, err := c.Delete(ctx, tok, "kept")
			return err
		},
		"Txn": func(tok token.Token) error {
			_, err := c.Txn(ctx, tok, nil, put, nil)
			return err
		},
		"Release": func(tok token.Token) error {
			resp, err := raw.Release(ctx, &fencerv1.ReleaseRequest{Target: &fencerv1.ReleaseRequest_Token{Token: tok.String()}})
			if err == nil && resp.GetReleased() {
				return fmt.Errorf("released with %s", tok)
			}
			return err
		},
	}
	for _, forged := range []token.Token{
		{Lease: real.Lease, Epoch: real.Epoch + 1, Revision: real.Revision},
		{Lease: real.Lease, Epoch: real.Epoch - 1, Revision: real.Revision},
		{Lease: real.Lease, Epoch: 0, Revision: real.Revision},
		{Lease: real.Lease, Epoch: real.Epoch, Revision: real.Revision + 1},
	} {
		for name, call := range calls {
			t.Run(fmt.Sprintf("%s with %s", name, forged), func(t *testing.T) {
				err := call(forged)
				if name == "Release" {
					require.NoError(t, err, "a release that releases nothing succeeds")
					return
				}
				require.ErrorIs(t, err, token.ErrStale)
			})
		}
	}
	_, found, err := c.Get(ctx, "forged")
	require.NoError(t, err)
	require.False(t, found, "a forged token wrote a data key")
	_, found, err = c.Get(ctx, "kept")
	require.NoError(t, err)
	require.True(t, found, "a forged token deleted a data key")
	_, found, err = st.Fence(ctx, "forged")
	require.NoError(t, err)
	require.False(t, found, "a forged token advanced a fence")
	require.NoError(t, c.Check(ctx, real), "a forged token released the real holder")
	require.NoError(t, l.Err())
}
