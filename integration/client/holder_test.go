package client_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fencer-dev/fencer/fencertest"
	"github.com/fencer-dev/fencer/token"
)

// TestHolderContractAcrossLeaseKinds holds one lease through the library
// (etcdstore.Lease) and one through the service (client.Lease), has each
// superseded, and checks both through token.Holder alone: the token is the
// one superseded, Context ends with a cause that matches token.ErrLeaseLost
// and token.ErrNotHeld, and Err returns that cause.
func TestHolderContractAcrossLeaseKinds(t *testing.T) {
	st, c := service(t)
	ctx := t.Context()
	lib, err := fencertest.Session(t, st).Acquire(ctx, "holder-lib")
	require.NoError(t, err)
	remote, err := newSession(t, c).Acquire(ctx, "holder-remote")
	require.NoError(t, err)
	for name, h := range map[string]token.Holder{"etcdstore.Lease": lib, "client.Lease": remote} {
		t.Run(name, func(t *testing.T) {
			tok := h.Token()
			require.NoError(t, h.Err())
			require.NoError(t, h.Context().Err())
			newer := fencertest.Supersede(t, st, h)
			select {
			case <-h.Context().Done():
			case <-time.After(fencertest.Timeout):
				t.Fatalf("%s: Context not done %s after being superseded", tok, fencertest.Timeout)
			}
			cause := context.Cause(h.Context())
			require.ErrorIs(t, cause, token.ErrLeaseLost)
			require.ErrorIs(t, cause, token.ErrNotHeld)
			require.Equal(t, cause, h.Err())
			require.Equal(t, tok, h.Token(), "the token changed")
			order, err := newer.Token().Compare(tok)
			require.NoError(t, err)
			require.Positive(t, order)
		})
	}
}
