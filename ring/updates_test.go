package ring_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fencer-dev/fencer/fencertest"
	"github.com/fencer-dev/fencer/ring"
)

// TestUpdatesAndRejoin: a member whose Updates nobody reads still
// acquires every shard, and the changes wait merged in one batch; Close
// keeps the shards on the session, and joining again on it takes them over
// without a write, reported in one 10,000-shard snapshot.
func TestUpdatesAndRejoin(t *testing.T) {
	st := fencertest.SharedStore(t)
	const r = "updates"
	shards := define(t, st, r, 10000)
	sess := fencertest.Session(t, st)
	cfg := ring.Config{Ring: r, Member: "a", Holder: sess.Holder(), LeaseID: sess.LeaseID()}
	m, err := ring.Join(fencertest.Context(t), st, cfg)
	require.NoError(t, err)
	defer m.Close()
	tm := &tmember{Member: m, lease: sess.LeaseID()}
	rev := waitAssigned(t, st, r, shards, []*tmember{tm}, 2*time.Minute)

	first := <-m.Updates()
	require.True(t, first.Snapshot)
	require.Empty(t, first.Changes)
	second := <-m.Updates()
	require.False(t, second.Snapshot)
	require.Len(t, second.Changes, len(shards), "every gain since, in one batch")
	toks := map[string]ring.Change{}
	for _, c := range second.Changes {
		require.Equal(t, ring.Gained, c.Kind)
		toks[c.Shard] = c
	}
	require.Len(t, toks, len(shards))

	m.Close()
	_, open := <-m.Updates()
	require.False(t, open)
	require.ErrorIs(t, m.Err(), ring.ErrClosed)
	_, owns := m.Owns(shards[0])
	require.False(t, owns)

	again, err := ring.Join(fencertest.Context(t), st, cfg)
	require.NoError(t, err)
	defer again.Close()
	snap := <-again.Updates()
	require.True(t, snap.Snapshot)
	require.Len(t, snap.Changes, len(shards))
	for _, c := range snap.Changes {
		require.Equal(t, ring.Gained, c.Kind)
		require.Equal(t, toks[c.Shard].Token, c.Token)
		tok, ok := again.Owns(c.Shard)
		require.True(t, ok)
		require.Equal(t, c.Token, tok)
	}
	time.Sleep(100 * time.Millisecond)
	_, rev2 := holders(t, st, r)
	puts, dels := holderEvents(t, st, r, rev, rev2)
	require.Empty(t, puts)
	require.Empty(t, dels)
}
