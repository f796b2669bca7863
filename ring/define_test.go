package ring_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencer-dev/fencer/etcdstore"
	"github.com/fencer-dev/fencer/fencertest"
	"github.com/fencer-dev/fencer/ring"
	"github.com/fencer-dev/fencer/token"
)

// dump reads everything under st's prefix, and the store's revision.
func dump(t *testing.T, st *etcdstore.Store) ([]string, int64) {
	t.Helper()
	resp, err := st.Client().Get(fencertest.Context(t), st.Prefix(), clientv3.WithPrefix())
	require.NoError(t, err)
	var out []string
	for _, kv := range resp.Kvs {
		out = append(out, string(kv.Key)+"="+string(kv.Value))
	}
	return out, resp.Header.Revision
}

func TestDefine(t *testing.T) {
	ctx := fencertest.Context(t)
	st := fencertest.SharedStore(t)
	created, err := ring.Define(ctx, st, "orders", []string{"b", "a", "c"})
	require.NoError(t, err)
	require.True(t, created)
	created, err = ring.Define(ctx, st, "orders", []string{"c", "b", "a"})
	require.NoError(t, err)
	require.False(t, created, "the same shards again")
	got, err := ring.Shards(ctx, st, "orders")
	require.NoError(t, err)
	require.Equal(t, []string{"a", "b", "c"}, got)

	many := make([]string, ring.MaxShards)
	for i := range many {
		many[i] = fmt.Sprintf("shard-%06d", i) // 12 bytes
	}
	created, err = ring.Define(ctx, st, "many", many)
	require.NoError(t, err)
	require.True(t, created)
	got, err = ring.Shards(ctx, st, "many")
	require.NoError(t, err)
	require.Equal(t, many, got)
	long := slices.Clone(many)
	for i := range 1000 {
		long[i] = fmt.Sprintf("%0100d", i) // 88 bytes more each
	}
	_, err = ring.Define(ctx, st, "long", long)
	require.ErrorIs(t, err, token.ErrInvalidArgument, "over MaxRecordLen")

	s, err := ring.ReadStatus(ctx, st, "orders")
	require.NoError(t, err)
	require.Equal(t, 3, s.Shards)
	require.Equal(t, 3, s.Unowned)
	require.Empty(t, s.Members)
	require.Positive(t, s.Revision)
}

// TestBadInputChangesNothing: every refused call leaves etcd as it was.
func TestBadInputChangesNothing(t *testing.T) {
	ctx := fencertest.Context(t)
	st := fencertest.SharedStore(t)
	shards := define(t, st, "r", 10)
	taken := join(t, st, "r", "m", false, ring.Config{})
	waitAssigned(t, st, "r", shards, []*tmember{taken}, 10*time.Second)
	other := fencertest.Session(t, st)
	cfg := func(r, member string) ring.Config {
		return ring.Config{Ring: r, Member: member, Holder: other.Holder(), LeaseID: other.LeaseID()}
	}
	huge := strings.Repeat("x", 200)
	for _, tc := range []struct {
		name string
		call func() error
		want error
	}{
		{"define empty ring", func() error { _, err := ring.Define(ctx, st, "", []string{"a"}); return err }, token.ErrInvalidArgument},
		{"define huge ring", func() error { _, err := ring.Define(ctx, st, huge, []string{"a"}); return err }, token.ErrInvalidArgument},
		{"define ring with space", func() error { _, err := ring.Define(ctx, st, "a b", []string{"a"}); return err }, token.ErrInvalidArgument},
		{"define no shards", func() error { _, err := ring.Define(ctx, st, "x", nil); return err }, token.ErrInvalidArgument},
		{"define empty shard", func() error { _, err := ring.Define(ctx, st, "x", []string{""}); return err }, token.ErrInvalidArgument},
		{"define huge shard", func() error { _, err := ring.Define(ctx, st, "x", []string{huge}); return err }, token.ErrInvalidArgument},
		{"define shard with space", func() error { _, err := ring.Define(ctx, st, "x", []string{"a b"}); return err }, token.ErrInvalidArgument},
		{"define duplicate shards", func() error { _, err := ring.Define(ctx, st, "x", []string{"a", "a"}); return err }, token.ErrInvalidArgument},
		{"define too many shards", func() error { _, err := ring.Define(ctx, st, "x", shardNames(ring.MaxShards+1)); return err }, token.ErrInvalidArgument},
		{"define other shards", func() error { _, err := ring.Define(ctx, st, "r", shardNames(11)); return err }, ring.ErrRingConflict},
		{"shards of unknown ring", func() error { _, err := ring.Shards(ctx, st, "nope"); return err }, ring.ErrRingNotFound},
		{"status of unknown ring", func() error { _, err := ring.ReadStatus(ctx, st, "nope"); return err }, ring.ErrRingNotFound},
		{"join unknown ring", func() error { _, err := ring.Join(ctx, st, cfg("nope", "m2")); return err }, ring.ErrRingNotFound},
		{"join empty member", func() error { _, err := ring.Join(ctx, st, cfg("r", "")); return err }, token.ErrInvalidArgument},
		{"join huge member", func() error { _, err := ring.Join(ctx, st, cfg("r", huge)); return err }, token.ErrInvalidArgument},
		{"join member with space", func() error { _, err := ring.Join(ctx, st, cfg("r", "a b")); return err }, token.ErrInvalidArgument},
		{"join bad ring", func() error { _, err := ring.Join(ctx, st, cfg("R", "m2")); return err }, token.ErrInvalidArgument},
		{"join no lease", func() error { c := cfg("r", "m2"); c.LeaseID = 0; _, err := ring.Join(ctx, st, c); return err }, token.ErrInvalidArgument},
		{"join no holder", func() error { c := cfg("r", "m2"); c.Holder = ""; _, err := ring.Join(ctx, st, c); return err }, token.ErrInvalidArgument},
		{"join negative drain", func() error { c := cfg("r", "m2"); c.Drain = -1; _, err := ring.Join(ctx, st, c); return err }, token.ErrInvalidArgument},
		{"join huge holder", func() error {
			c := cfg("r", "m2")
			c.Holder = strings.Repeat("h", 513)
			_, err := ring.Join(ctx, st, c)
			return err
		}, token.ErrInvalidArgument},
		{"join taken member", func() error { _, err := ring.Join(ctx, st, cfg("r", taken.Name())); return err }, ring.ErrRingConflict},
		{"join on a dead lease", func() error {
			c := cfg("r", "m2")
			c.LeaseID = 12345
			_, err := ring.Join(ctx, st, c)
			return err
		}, token.ErrSessionExpired},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before, rev := dump(t, st)
			err := tc.call()
			require.ErrorIs(t, err, tc.want)
			after, rev2 := dump(t, st)
			require.Equal(t, before, after)
			require.Equal(t, rev, rev2, "a write reached etcd")
		})
	}
	_, err := ring.Define(context.Background(), st, "r", shardNames(10))
	require.NoError(t, err)
}
