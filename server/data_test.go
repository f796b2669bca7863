package server_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fencer-dev/fencer/client"
	"github.com/fencer-dev/fencer/fencertest"
	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
	"github.com/fencer-dev/fencer/token"
)

// TestServiceRefusesForgedTokens is the exact-token attack through the
// service: a token with the current lease and revision but another epoch
// (or the current epoch and another revision) was never issued, and every
// guarded call refuses it with STALE_TOKEN and writes nothing.
func TestServiceRefusesForgedTokens(t *testing.T) {
	ctx := fencertest.Context(t)
	st := fencertest.SharedStore(t)
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

// TestServiceKeysBelongToLeases: bob, with a current token of his own
// lease, can neither overwrite nor delete alice's key nor advance her
// resource, and is told FOREIGN_LEASE; an explicit take_over with his
// current token works, after which alice is the one refused; stale tokens
// are refused either way.
func TestServiceKeysBelongToLeases(t *testing.T) {
	ctx := fencertest.Context(t)
	st := fencertest.SharedStore(t)
	addr, _ := startServer(t, st)
	ac, bc := client.New(dial(t, alice, addr)), client.New(dial(t, bob, addr))
	rawBob := fencerv1.NewFencerServiceClient(dial(t, bob, addr))
	la, err := newSession(t, ac).Acquire(ctx, "orders")
	require.NoError(t, err)
	bs := newSession(t, bc)
	lbOld, err := bs.Acquire(ctx, "billing")
	require.NoError(t, err)
	require.NoError(t, lbOld.Release(ctx))
	lb, err := bs.Acquire(ctx, "billing")
	require.NoError(t, err)
	_, err = ac.Put(ctx, la.Token(), "orders/total", []byte("100"))
	require.NoError(t, err)
	require.NoError(t, ac.Advance(ctx, "orders-db", la.Token()))

	putOp := func(key, value string) []*fencerv1.Op {
		return []*fencerv1.Op{{Op: &fencerv1.Op_Put{Put: &fencerv1.PutOp{Key: key, Value: []byte(value)}}}}
	}
	writes := func(c *client.Client, tok token.Token, opts ...client.WriteOption) map[string]func() error {
		return map[string]func() error{
			"Put": func() error { _, err := c.Put(ctx, tok, "orders/total", []byte("x"), opts...); return err },
			"Delete": func() error {
				_, err := c.Delete(ctx, tok, "orders/total", opts...)
				return err
			},
			"Txn": func() error {
				_, err := c.Txn(ctx, tok, nil, putOp("fresh", "x"), putOp("orders/total", "x"), opts...)
				return err
			},
			"Advance": func() error { return c.Advance(ctx, "orders-db", tok, opts...) },
		}
	}
	for name, w := range writes(bc, lb.Token()) {
		err := w()
		var fe *token.ForeignLeaseError
		require.ErrorAs(t, err, &fe, name)
		require.Equal(t, &token.ForeignLeaseError{Want: "billing", Got: "orders"}, fe, name)
	}
	// On the wire: FAILED_PRECONDITION with reason FOREIGN_LEASE.
	_, err = rawBob.Put(ctx, &fencerv1.PutRequest{Token: lb.Token().String(), Key: "orders/total", Value: []byte("x")})
	require.Equal(t, codes.FailedPrecondition, status.Code(err))
	info := errorInfo(t, err)
	require.Equal(t, fencerv1.ErrorReason_ERROR_REASON_FOREIGN_LEASE.Reason(), info.GetReason())
	require.Equal(t, map[string]string{"want": "billing", "got": "orders"}, info.GetMetadata())

	// Stale and forged takeovers are refused and change nothing.
	forged := lb.Token()
	forged.Epoch += 3
	for _, tok := range []token.Token{lbOld.Token(), forged} {
		for name, w := range writes(bc, tok, client.TakeOver()) {
			require.ErrorIs(t, w(), token.ErrStale, "%s with %s", name, tok)
		}
	}
	v, _, err := ac.Get(ctx, "orders/total")
	require.NoError(t, err)
	require.Equal(t, "100", string(v.Data))
	_, err = ac.Put(ctx, la.Token(), "orders/total", []byte("150"))
	require.NoError(t, err, "bob's refused writes left alice's key hers")
	require.NoError(t, ac.Advance(ctx, "orders-db", la.Token()))

	// Bob's explicit takeover with his current token.
	_, err = rawBob.Put(ctx, &fencerv1.PutRequest{Token: lb.Token().String(), Key: "orders/total", Value: []byte("0"), TakeOver: true})
	require.NoError(t, err)
	require.NoError(t, bc.Advance(ctx, "orders-db", lb.Token(), client.TakeOver()))
	for name, w := range writes(ac, la.Token()) {
		var fe *token.ForeignLeaseError
		require.ErrorAs(t, w(), &fe, name)
		require.Equal(t, &token.ForeignLeaseError{Want: "orders", Got: "billing"}, fe, name)
	}
	v, _, err = ac.Get(ctx, "orders/total")
	require.NoError(t, err)
	require.Equal(t, "0", string(v.Data))

	// A stale alice token is refused with or without take_over.
	old := la.Token()
	require.NoError(t, la.Release(ctx))
	for _, opts := range [][]client.WriteOption{nil, {client.TakeOver()}} {
		for name, w := range writes(ac, old, opts...) {
			require.ErrorIs(t, w(), token.ErrStale, name)
		}
	}
	owner, _, err := st.Owner(ctx, "orders/total")
	require.NoError(t, err)
	require.Equal(t, "billing", owner.Lease)
}

// errorInfo returns the fencer.dev ErrorInfo of a status error.
func errorInfo(t *testing.T, err error) *errdetails.ErrorInfo {
	t.Helper()
	for _, d := range status.Convert(err).Details() {
		if ei, ok := d.(*errdetails.ErrorInfo); ok && ei.GetDomain() == fencerv1.ErrorDomain {
			return ei
		}
	}
	t.Fatalf("no ErrorInfo in %v", err)
	return nil
}
