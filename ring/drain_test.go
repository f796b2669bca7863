package ring_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/fencer-dev/fencer/fencertest"
	"github.com/fencer-dev/fencer/ring"
)

// TestDrain: a member reports the shards a newcomer should own Losing
// with the drain; Release hands one off at once; the rest go when the
// (fake) drain time has passed; Release of a shard it keeps is refused.
func TestDrain(t *testing.T) {
	ctx := fencertest.Context(t)
	st := fencertest.SharedStore(t)
	const r = "drain"
	shards := define(t, st, r, 100)
	clk := clocktesting.NewFakeClock(time.Unix(1e9, 0))
	cfg := ring.Config{Drain: 10 * time.Second, MovesPerSecond: 1e6, Clock: clk}
	a := join(t, st, r, "a", false, cfg)
	waitAssigned(t, st, r, shards, []*tmember{a}, 10*time.Second)
	b := join(t, st, r, "b", false, cfg)

	want := owners(shards, []string{"a", "b"})
	var moving, kept []string
	for _, s := range shards {
		if want[s] == "b" {
			moving = append(moving, s)
		} else {
			kept = append(kept, s)
		}
	}
	require.Eventually(t, func() bool { return len(a.changes(ring.Losing)) == len(moving) }, 10*time.Second, 10*time.Millisecond)
	for _, c := range a.changes(ring.Losing) {
		require.Equal(t, "b", want[c.Shard])
		require.Equal(t, 10*time.Second, c.Drain)
		tok, ok := a.Owns(c.Shard)
		require.True(t, ok, "a still owns %s while it drains", c.Shard)
		require.Equal(t, c.Token, tok)
	}

	_, err := a.Release(ctx, kept[0])
	require.ErrorIs(t, err, ring.ErrNotLosing)
	_, ok := a.Owns(kept[0])
	require.True(t, ok)

	old, _ := a.Owns(moving[0])
	n, err := a.Release(ctx, moving[0])
	require.NoError(t, err)
	require.Equal(t, 1, n)
	_, ok = a.Owns(moving[0])
	require.False(t, ok)
	require.Eventually(t, func() bool {
		tok, ok := b.Owns(moving[0])
		return ok && tok.Revision > old.Revision
	}, 10*time.Second, 10*time.Millisecond, "b gains the released shard at once")
	n, err = a.Release(ctx, moving[0])
	require.NoError(t, err)
	require.Zero(t, n, "a shard no longer held is skipped")

	// Nothing else moves until the drain has passed.
	time.Sleep(200 * time.Millisecond)
	got, _ := holders(t, st, r)
	for _, s := range moving[1:] {
		require.Equal(t, a.lease, got[s], "%s moved before its drain", s)
	}
	clk.Step(9 * time.Second)
	time.Sleep(100 * time.Millisecond)
	got, _ = holders(t, st, r)
	require.Equal(t, a.lease, got[moving[1]])
	clk.Step(time.Second)
	waitAssigned(t, st, r, shards, []*tmember{a, b}, 10*time.Second)
	require.Eventually(t, func() bool { return len(a.changes(ring.Lost)) == len(moving) }, 10*time.Second, 10*time.Millisecond)
}

// TestMovesLimit: a join that moves N > burst shards starts at most
// burst + R·t hand-offs by fake time t.
func TestMovesLimit(t *testing.T) {
	st := fencertest.SharedStore(t)
	const r = "limit"
	const rate = 5.0
	burst := 5
	shards := define(t, st, r, 200)
	clk := clocktesting.NewFakeClock(time.Unix(1e9, 0))
	cfg := ring.Config{Drain: time.Hour, MovesPerSecond: rate, Clock: clk}
	a := join(t, st, r, "a", false, cfg)
	waitAssigned(t, st, r, shards, []*tmember{a}, 10*time.Second)
	join(t, st, r, "b", false, cfg)
	n := 0
	for _, o := range owners(shards, []string{"a", "b"}) {
		if o == "b" {
			n++
		}
	}
	require.Greater(t, n, burst+int(rate)*5)
	for step := 0; step <= 5; step++ {
		want := min(n, burst+int(rate)*step)
		require.Eventually(t, func() bool { return len(a.changes(ring.Losing)) >= want }, 10*time.Second, 10*time.Millisecond)
		time.Sleep(100 * time.Millisecond) // room for a hand-off too many
		require.Len(t, a.changes(ring.Losing), want, "hand-offs started by fake time %ds", step)
		clk.Step(time.Second)
	}
}
