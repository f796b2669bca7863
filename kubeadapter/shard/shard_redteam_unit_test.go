package shard

import (
	"context"
	"testing"
	"time"

	"github.com/fencer-dev/fencer/kubeadapter"
	"github.com/fencer-dev/fencer/kubeadapter/internal/leaserecord"
	"github.com/stretchr/testify/require"
)

// Red-team attacks on the Sharder's decisions, driven pass by pass on a
// fake clock so that each late event happens exactly where the attack
// needs it. The attacks on the real API server are in
// shard_redteam_kube_test.go.

// TestShardRedTeamStaleIncarnation: a member restarted under the same
// identity (a new incarnation) takes the heartbeat Lease while the old
// incarnation's goroutines still run and its kubeadapter.Held has not yet noticed (the
// Watcher ends it a moment after it updates its cache, and a paused
// process notices later still). The old incarnation's pass sees its
// heartbeat naming another incarnation: it must stop owning its shards at
// once, adopt none handed to it from a stale view, and write no takeover
// naming itself.
func TestShardRedTeamStaleIncarnation(t *testing.T) {
	clk := newUnitClock()
	f := newFakeLeases(t)
	a := newUnitSharder(t, f, clk, "a")
	mine := shardOwnedBy(t, "a", "a", "c")
	handed := shardOwnedBy(t, "c", "a", "c")
	a.Track(mine, handed)
	a.step()
	_, owns := a.Owns(mine)
	require.True(t, owns)
	h, err := a.Shard(mine)
	require.NoError(t, err)
	old := a.elector.Identity()

	// The new incarnation of "a" takes the heartbeat Lease.
	hb := f.lease(t, memberLeaseName(unitRing, "a"))
	hb.Spec = leaserecord.Acquired(&hb.Spec, "a_reborn", time.Minute, clk.Now())
	f.put(t, hb)
	// c, from a view where the old incarnation is still live, hands it a
	// shard.
	f.put(t, otherMember("c", "c_1", clk.Now()))
	f.put(t, assigned("ns", unitRing, handed, nil, incarnation{identity: "a", holder: old, lease: "r-m-a"}, time.Minute, clk.Now()))
	mineBefore := f.lease(t, LeaseName(unitRing, mine))
	require.NoError(t, a.member.Err(), "the attack needs a kubeadapter.Held that has not noticed yet")

	a.step()
	_, owns = a.Owns(mine)
	require.False(t, owns, "an incarnation whose heartbeat names another still owns its shard")
	require.Error(t, h.Err(), "the stale incarnation's Held did not end")
	_, owns = a.Owns(handed)
	require.False(t, owns, "a stale incarnation adopted a shard handed to it")
	after := f.lease(t, LeaseName(unitRing, mine))
	require.Equal(t, mineBefore.ResourceVersion, after.ResourceVersion, "the stale incarnation wrote its shard Lease (a takeover naming itself)")
	require.Equal(t, old, leaserecord.Holder(&after.Spec))
}

// TestShardLeaveDrainsThenHandsOff: a leaving member marks its heartbeat
// first (so the others assign it nothing), ends its Held at once,
// writes nothing while work is in flight, then makes one conditional
// write naming the shard's new owner, and only then releases its
// heartbeat. A release-first leave would orphan the shard instead, for
// the survivors to race for it.
func TestShardLeaveDrainsThenHandsOff(t *testing.T) {
	clk := newUnitClock()
	f := newFakeLeases(t)
	a := newUnitSharder(t, f, clk, "a")
	shard := shardOwnedBy(t, "a", "a", "d")
	a.Track(shard)
	a.step()
	h, err := a.Shard(shard)
	require.NoError(t, err)
	require.True(t, h.enter(), "a reconcile in flight")
	f.put(t, otherMember("d", "d_1", clk.Now()))
	name := LeaseName(unitRing, shard)
	before := f.lease(t, name)

	done := make(chan struct{})
	go func() { a.leave(context.Background(), a.member); close(done) }()
	select {
	case <-h.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the leave did not end the Held first")
	}
	require.ErrorIs(t, h.Err(), kubeadapter.ErrReleased)
	hb := f.lease(t, memberLeaseName(unitRing, "a"))
	require.Equal(t, a.elector.Identity(), hb.Annotations[LeavingAnnotation], "the heartbeat was not marked as leaving first")
	require.Equal(t, a.elector.Identity(), leaserecord.Holder(&hb.Spec), "the heartbeat was released before the handoff")
	require.Equal(t, before.ResourceVersion, f.lease(t, name).ResourceVersion, "the leave wrote while work was in flight")

	h.exit()
	<-done
	after := f.lease(t, name)
	require.Equal(t, "d_1", leaserecord.Holder(&after.Spec), "the leave did not hand the shard to its new owner")
	require.Equal(t, "r-m-d", after.Annotations[MemberAnnotation])
	require.Equal(t, leaserecord.Transitions(&before.Spec)+1, leaserecord.Transitions(&after.Spec), "more than one write, or none")
	require.Empty(t, leaserecord.Holder(&f.lease(t, memberLeaseName(unitRing, "a")).Spec), "the heartbeat was not released")

	// The same identity joins again: its heartbeat keeps the annotation
	// of the incarnation that left, yet the others count it live.
	again := newUnitSharder(t, f, clk, "a")
	e := newUnitSharder(t, f, clk, "e")
	live, _ := e.observe(newRingView(unitRing, e.ring.current()), clk.Now(), e.me())
	require.Contains(t, live, again.me(), "a member that joins again under a left identity takes no shards")
}

func TestShardViewConfigValidate(t *testing.T) {
	w, err := kubeadapter.NewWatcher(newFakeLeases(t).CoordinationV1())
	require.NoError(t, err)
	valid := ViewConfig{Namespace: "ns", Ring: "r", Operator: "x-0", RenewDeadline: time.Second, Watcher: w}
	build := func(c ViewConfig) error { _, err := NewView(c); return err }
	requireConfigErrors(t, valid, build, []configCase[ViewConfig]{
		{"Namespace", func(c *ViewConfig) { c.Namespace = "" }},
		{"Ring", func(c *ViewConfig) { c.Ring = "" }},
		{"Operator", func(c *ViewConfig) { c.Operator = "" }},
		{"RenewDeadline", func(c *ViewConfig) { c.RenewDeadline = 0 }},
		{"Watcher", func(c *ViewConfig) { c.Watcher = nil }},
	})
}
