package rendezvous

import (
	"fmt"
	"hash/fnv"
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

// peerOwner is the formula of multicluster-runtime's sharded coordinator:
// the highest fnv64a(shard+"|"+peer)*weight wins.
func peerOwner(key string, peers []string) string {
	var best string
	var bestScore uint64
	for _, p := range peers {
		h := fnv.New64a()
		h.Write([]byte(key + "|" + p))
		if s := h.Sum64(); best == "" || s > bestScore {
			best, bestScore = p, s
		}
	}
	return best
}

func members(names ...string) []Member {
	out := make([]Member, len(names))
	for i, n := range names {
		out[i] = Member{Name: n, Weight: 1}
	}
	return out
}

func shards(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("project-%d", i)
	}
	return out
}

// shares counts the keys each member owns under owner.
func shares(keys []string, owner func(string) string) map[string]int {
	got := map[string]int{}
	for _, k := range keys {
		got[owner(k)]++
	}
	return got
}

// maxDeviation is the largest |share - fair| / fair over names.
func maxDeviation(got map[string]int, names []string, total int) float64 {
	fair := float64(total) / float64(len(names))
	worst := 0.0
	for _, n := range names {
		worst = max(worst, math.Abs(float64(got[n])-fair)/fair)
	}
	return worst
}

// TestRendezvousBalanced: StatefulSet-style members x-0, x-1 and x-2 each
// get within 10% of an equal share of 10,000 shards. The same check fails
// for the peer's formula, so it is a check the hash can fail.
func TestRendezvousBalanced(t *testing.T) {
	names := []string{"x-0", "x-1", "x-2"}
	keys := shards(10000)
	ms := members(names...)
	got := shares(keys, func(k string) string { o, _ := Owner(k, ms); return o })
	t.Logf("fencer: %v", got)
	require.LessOrEqual(t, maxDeviation(got, names, len(keys)), 0.10, "shares %v", got)

	peer := shares(keys, func(k string) string { return peerOwner(k, names) })
	t.Logf("fnv64a(shard|peer): %v", peer)
	require.Greater(t, maxDeviation(peer, names, len(keys)), 0.10, "the peer's formula must fail the same check, or the check does not bite: %v", peer)
}

// TestRendezvousJoinMovesQuarter: a fourth member takes about a quarter of
// the shards, and every moved shard moves to it.
func TestRendezvousJoinMovesQuarter(t *testing.T) {
	keys := shards(10000)
	before, after := members("x-0", "x-1", "x-2"), members("x-0", "x-1", "x-2", "x-3")
	moved := 0
	for _, k := range keys {
		a, _ := Owner(k, before)
		b, _ := Owner(k, after)
		if a != b {
			require.Equal(t, "x-3", b, "shard %s moved between old members", k)
			moved++
		}
	}
	share := float64(moved) / float64(len(keys))
	t.Logf("moved %d of %d (%.3f)", moved, len(keys), share)
	require.InDelta(t, 0.25, share, 0.02)
}

// TestRendezvousWeights: a member of weight 2 gets about twice the share
// of a member of weight 1.
func TestRendezvousWeights(t *testing.T) {
	keys := shards(10000)
	ms := []Member{{Name: "x-0", Weight: 1}, {Name: "x-1", Weight: 1}, {Name: "x-2", Weight: 2}}
	got := shares(keys, func(k string) string { o, _ := Owner(k, ms); return o })
	t.Logf("weights 1/1/2: %v", got)
	require.InDelta(t, 0.5, float64(got["x-2"])/float64(len(keys)), 0.025)
}

// TestOwnerOrderIndependent: the owner depends on the set of members, not
// their order, and there is none without members.
func TestOwnerOrderIndependent(t *testing.T) {
	a := members("x-0", "x-1", "x-2")
	b := members("x-2", "x-0", "x-1")
	for _, k := range shards(1000) {
		oa, _ := Owner(k, a)
		ob, _ := Owner(k, b)
		require.Equal(t, oa, ob, k)
	}
	_, ok := Owner("k", nil)
	require.False(t, ok)
}
