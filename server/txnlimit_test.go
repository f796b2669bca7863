package server_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fencer-dev/fencer/client"
	"github.com/fencer-dev/fencer/fencertest"
	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
	"github.com/fencer-dev/fencer/server"
)

// TestTxnAtItsDocumentedLimits runs Txns at the documented limits on the
// embedded etcd as fencer serve configures it: MaxTxnCompares compares and
// MaxTxnOps puts in each branch, of fresh keys (claimed, the most etcd ops
// per op), then with the success branch's keys owned, then with the
// failure branch running. Each commits; none is refused as too many ops.
func TestTxnAtItsDocumentedLimits(t *testing.T) {
	ctx := fencertest.Context(t)
	addr, _ := startServer(t, fencertest.SharedStore(t))
	c := client.New(dial(t, alice, addr))
	l, err := newSession(t, c).Acquire(ctx, "limits")
	require.NoError(t, err)
	puts := func(branch string) []*fencerv1.Op {
		ops := make([]*fencerv1.Op, server.MaxTxnOps)
		for i := range ops {
			ops[i] = &fencerv1.Op{Op: &fencerv1.Op_Put{Put: &fencerv1.PutOp{Key: fmt.Sprintf("%s/%d", branch, i), Value: []byte("v")}}}
		}
		return ops
	}
	compares := func(key string) []*fencerv1.Compare {
		cmps := make([]*fencerv1.Compare, server.MaxTxnCompares)
		for i := range cmps {
			cmps[i] = &fencerv1.Compare{Key: key, Target: fencerv1.Compare_TARGET_VERSION, Result: fencerv1.Compare_RESULT_EQUAL}
		}
		return cmps
	}
	for i, round := range []struct {
		name, compared string
		succeeded      bool
	}{
		{"fresh keys in both branches", "absent", true},
		{"owned keys in success, fresh in failure", "absent", true},
		{"the failure branch, of fresh keys", "success/0", false},
	} {
		resp, err := c.Txn(ctx, l.Token(), compares(round.compared), puts("success"), puts(fmt.Sprintf("failure%d", i)))
		require.NoError(t, err, round.name)
		require.Equal(t, round.succeeded, resp.GetSucceeded(), round.name)
	}
}
