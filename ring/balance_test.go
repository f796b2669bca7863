package ring_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fencer-dev/fencer/fencertest"
	"github.com/fencer-dev/fencer/ring"
)

// TestBalanceAndMoves: 1,000 shards over 3 members, then a 4th joins and
// one leaves; each move is one release and one acquisition of exactly the
// shards whose rendezvous owner changed, and nothing else is written.
func TestBalanceAndMoves(t *testing.T) {
	st := fencertest.SharedStore(t)
	const r = "balance"
	shards := define(t, st, r, 1000)
	cfg := ring.Config{Drain: 200 * time.Millisecond}
	a := join(t, st, r, "a", false, cfg)
	b := join(t, st, r, "b", false, cfg)
	c := join(t, st, r, "c", false, cfg)
	three := []*tmember{a, b, c}
	rev3 := waitAssigned(t, st, r, shards, three, 20*time.Second)
	for _, m := range three {
		n := 0
		for _, s := range shards {
			if _, ok := m.Owns(s); ok {
				n++
			}
		}
		require.InDelta(t, 333, n, 60, "member %s owns %d", m.Name(), n)
	}

	d := join(t, st, r, "d", true, cfg)
	four := []*tmember{a, b, c, d}
	rev4 := waitAssigned(t, st, r, shards, four, 20*time.Second)
	before, after := owners(shards, []string{"a", "b", "c"}), owners(shards, []string{"a", "b", "c", "d"})
	var changed []string
	for _, s := range shards {
		if before[s] != after[s] {
			require.Equal(t, "d", after[s])
			changed = append(changed, s)
		}
	}
	require.GreaterOrEqual(t, len(changed), 180)
	require.LessOrEqual(t, len(changed), 320)
	puts, dels := holderEvents(t, st, r, rev3, rev4)
	require.Equal(t, changed, sortedKeys(puts), "the shards acquired")
	require.Equal(t, changed, sortedKeys(dels), "the shards released")
	for _, s := range changed {
		require.Equal(t, 1, puts[s], "acquisitions of %s", s)
		require.Equal(t, 1, dels[s], "releases of %s", s)
	}
	require.Len(t, d.changes(ring.Gained), len(changed))
	puts, dels = keyEvents(t, st, st.Prefix()+"ringmembers/"+r+"/", rev3, rev4)
	require.Equal(t, map[string]int{"d": 1}, puts, "the only member-key write is d's join")
	require.Empty(t, dels)

	// c leaves: only its shards move.
	require.NoError(t, c.Leave(fencertest.Context(t)))
	fencertest.WaitClosed(t, c.Done(), 20*time.Second, "c's leave")
	require.ErrorIs(t, c.Err(), ring.ErrLeft)
	<-c.read // Updates closed after the last Lost
	require.Len(t, c.changes(ring.Losing), len(c.changes(ring.Gained)))
	require.Len(t, c.changes(ring.Lost), len(c.changes(ring.Gained)))
	rev5 := waitAssigned(t, st, r, shards, []*tmember{a, b, d}, 20*time.Second)
	left := owners(shards, []string{"a", "b", "d"})
	var fromC []string
	for _, s := range shards {
		if after[s] == "c" {
			fromC = append(fromC, s)
		} else {
			require.Equal(t, after[s], left[s])
		}
	}
	puts, dels = holderEvents(t, st, r, rev4, rev5)
	require.Equal(t, fromC, sortedKeys(puts))
	require.Equal(t, fromC, sortedKeys(dels))
	st3, err := ring.ReadStatus(fencertest.Context(t), st, r)
	require.NoError(t, err)
	require.Equal(t, 0, st3.Unowned)
	require.Len(t, st3.Members, 3)
	for _, ms := range st3.Members {
		n := 0
		for _, s := range shards {
			if left[s] == ms.Member {
				n++
			}
		}
		require.Equal(t, n, ms.Owned, "shards %s owns", ms.Member)
		require.False(t, ms.Leaving)
		require.NotEmpty(t, ms.Holder)
	}
}
