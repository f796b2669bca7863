package e2e_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/fencer-dev/fencer/kubeadapter"
	"github.com/fencer-dev/fencer/kubeadapter/fenced"
	"github.com/fencer-dev/fencer/kubeadapter/shard"
	"github.com/fencer-dev/fencer/token"
)

// Red-team attacks on the Sharder on the real API server with the
// admission policy installed: each drives the late write it is about
// explicitly, then checks that no superseded owner's write lands.

// heldWrites holds the first Update of a Lease whose name has prefix,
// once armed, until released: a write a paused process had in flight,
// which reaches the API server only after the world moved on.
type heldWrites struct {
	prefix   string
	armed    atomic.Bool
	captured chan struct{}
	resume   chan struct{}
	result   chan error
	once     sync.Once
}

func newHeldWrites(prefix string) *heldWrites {
	return &heldWrites{prefix: prefix, captured: make(chan struct{}), resume: make(chan struct{}), result: make(chan error, 1)}
}

// unblock lets a held write go, if there is one. Register it as a
// cleanup after the member's, so that it runs before the member stops.
func (h *heldWrites) unblock() { h.once.Do(func() { close(h.resume) }) }

func (h *heldWrites) wrap(g coordinationv1client.LeasesGetter) coordinationv1client.LeasesGetter {
	return heldGetter{g, h}
}

// waitCaptured waits until a write is held.
func (h *heldWrites) waitCaptured(t *testing.T) {
	t.Helper()
	select {
	case <-h.captured:
	case <-time.After(20 * time.Second):
		t.Fatal("no write was held")
	}
}

// release lets the held write reach the API server and returns its result.
func (h *heldWrites) release(t *testing.T) error {
	t.Helper()
	h.unblock()
	select {
	case err := <-h.result:
		return err
	case <-time.After(20 * time.Second):
		t.Fatal("the held write did not return")
		return nil
	}
}

type heldGetter struct {
	coordinationv1client.LeasesGetter
	h *heldWrites
}

func (g heldGetter) Leases(ns string) coordinationv1client.LeaseInterface {
	return heldLeases{g.LeasesGetter.Leases(ns), g.h}
}

type heldLeases struct {
	coordinationv1client.LeaseInterface
	h *heldWrites
}

func (l heldLeases) Update(ctx context.Context, lease *coordinationv1.Lease, opts metav1.UpdateOptions) (*coordinationv1.Lease, error) {
	if !strings.HasPrefix(lease.Name, l.h.prefix) || !l.h.armed.CompareAndSwap(true, false) {
		return l.LeaseInterface.Update(ctx, lease, opts)
	}
	close(l.h.captured)
	<-l.h.resume
	got, err := l.LeaseInterface.Update(context.WithoutCancel(ctx), lease, opts)
	l.h.result <- err
	return got, err
}

// jumpClock is the real clock plus an offset that the test moves: a
// member whose clock jumps.
type jumpClock struct {
	clock.RealClock
	off atomic.Int64
}

func (c *jumpClock) Now() time.Time                  { return c.RealClock.Now().Add(time.Duration(c.off.Load())) }
func (c *jumpClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

// writeRecord writes value into ConfigMap name through the fenced client
// of h, creating it if needed.
func writeRecord(ctx context.Context, k *kube, m *ringMember, h kubeadapter.Holder, name, value string) error {
	fc, err := fenced.NewClient(m.crc, h)
	if err != nil {
		return err
	}
	var cm corev1.ConfigMap
	err = m.crc.Get(ctx, client.ObjectKey{Namespace: k.ns, Name: name}, &cm)
	if apierrors.IsNotFound(err) {
		cm = corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: k.ns, Name: name}, Data: map[string]string{"by": value}}
		return fc.Create(ctx, &cm)
	}
	if err != nil {
		return err
	}
	cm.Data = map[string]string{"by": value}
	return fc.Update(ctx, &cm)
}

// requireFencedOut checks that writes of ConfigMap name with the
// superseded token old change nothing: the fenced client of a holder that
// has not noticed its loss gets token.ErrStale, and a raw PUT with old's
// stamp is denied by the admission policy.
func requireFencedOut(t *testing.T, k *kube, m *ringMember, old token.Token, name string) {
	t.Helper()
	ctx := t.Context()
	before := k.configMap(t, name)
	blind, err := fenced.NewClient(m.crc, staticHolder{Tok: old})
	require.NoError(t, err)
	late := before.DeepCopy()
	late.Data = map[string]string{"by": "superseded"}
	require.ErrorIs(t, blind.Update(ctx, late), token.ErrStale)
	raw := before.DeepCopy()
	raw.Annotations = old.Stamp(raw.Annotations)
	raw.Data = map[string]string{"by": "superseded-raw"}
	_, err = k.cs.CoreV1().ConfigMaps(k.ns).Update(ctx, raw, metav1.UpdateOptions{})
	require.True(t, apierrors.IsForbidden(err), "raw write with a superseded stamp: %v", err)
	require.Contains(t, err.Error(), "stale fencing token")
	require.Equal(t, before.ResourceVersion, k.configMap(t, name).ResourceVersion, "a superseded write landed")
}

// holderOfLease returns the holderIdentity of Lease name.
func holderOfLease(t *testing.T, k *kube, name string) string {
	t.Helper()
	l, err := k.cs.CoordinationV1().Leases(k.ns).Get(t.Context(), name, metav1.GetOptions{})
	require.NoError(t, err)
	return *l.Spec.HolderIdentity
}

// TestShardRedTeamLateHandoff: x-0 owns two shards. It starts handing one
// to the joining x-1, and the handoff write stays in flight (x-0 is
// paused); its heartbeat stops; x-1's clock jumps by a lease duration, so
// x-1 declares x-0 dead at once and takes both shards as orphans while
// x-0's own renew deadline has not passed. x-1 writes a record; x-0's
// superseded writes to it are refused, and its late handoff, racing the
// orphan takeover, conflicts and changes nothing.
func TestShardRedTeamLateHandoff(t *testing.T) {
	t.Parallel()
	k := newKube(t)
	shared.InstallPolicy(t)
	ctx := t.Context()
	ids := []string{"x-0", "x-1"}
	moving := shardsOwnedBy("late-", "x-1", 1, ids...)[0]
	staying := shardsOwnedBy("late-", "x-0", 1, ids...)[0]
	shards := []string{moving, staying}
	held := newHeldWrites("late-s-")
	x0 := k.startMemberVia(t, fastShardConfig(k.ns, "late", "x-0"), shards, held.wrap)
	t.Cleanup(held.unblock)
	settled(t, []*ringMember{x0}, shards)
	hStay, err := x0.s.Shard(staying)
	require.NoError(t, err)
	require.NoError(t, writeRecord(ctx, k, x0, hStay, "record", "x-0"))

	held.armed.Store(true)
	clk := &jumpClock{}
	cfg := fastShardConfig(k.ns, "late", "x-1")
	cfg.Clock = clk
	x1 := k.startMemberWith(t, cfg, shards)
	held.waitCaptured(t)
	movingLease := shard.LeaseName("late", moving)
	require.NotEqual(t, holderOfLease(t, k, "late-m-x-1"), holderOfLease(t, k, movingLease), "the handoff landed")

	x0.leases.Stalled.Store(true)
	clk.off.Add(int64(cfg.LeaseDuration))
	require.True(t, waitFor(20*time.Second, func() bool {
		_, a := x1.s.Owns(moving)
		_, b := x1.s.Owns(staying)
		return a && b
	}), "x-1 did not take x-0's shards")
	require.Error(t, hStay.Err(), "x-0's ShardHeld outlived its tombstone")
	tStay, _ := x1.s.Owns(staying)
	requireGreater(t, tStay, hStay.Token())
	hNew, err := x1.s.Shard(staying)
	require.NoError(t, err)
	require.NoError(t, writeRecord(ctx, k, x1, hNew, "record", "x-1"))
	requireFencedOut(t, k, x0, hStay.Token(), "record")

	before, err := k.cs.CoordinationV1().Leases(k.ns).Get(ctx, movingLease, metav1.GetOptions{})
	require.NoError(t, err)
	// x-0 resumes: its Lease client works again, and the handoff it had
	// in flight reaches the API server.
	lost := x0.s.Member()
	x0.leases.Stalled.Store(false)
	err = held.release(t)
	require.True(t, apierrors.IsConflict(err), "the late handoff was not refused: %v", err)
	_, owns := x0.s.Owns(moving)
	require.False(t, owns)
	// x-0 joins again as a new incarnation only once the pass that made
	// the late write is over.
	require.True(t, waitFor(20*time.Second, func() bool { m := x0.s.Member(); return m != lost && m.Err() == nil }), "x-0 did not join again")
	x0.stop()
	after, err := k.cs.CoordinationV1().Leases(k.ns).Get(ctx, movingLease, metav1.GetOptions{})
	require.NoError(t, err)
	require.Equal(t, before.ResourceVersion, after.ResourceVersion, "a late write of x-0 changed the shard Lease")
}

// TestShardRedTeamForcedHandoff: a reconcile of x-0 is still running when
// the shard is handed to x-1 and outlives HandoffTimeout, so the handoff
// is written anyway (and counted). x-1 writes the record; then x-0's
// reconcile resumes and writes: its fenced client refuses (the ShardHeld
// ended), a blind one gets token.ErrStale, and a raw PUT is denied.
func TestShardRedTeamForcedHandoff(t *testing.T) {
	t.Parallel()
	k := newKube(t)
	shared.InstallPolicy(t)
	ctx := t.Context()
	moving := shardsOwnedBy("forced-", "x-1", 1, "x-0", "x-1")[0]
	x0 := k.startMember(t, "forced", "x-0", []string{moving})
	settled(t, []*ringMember{x0}, []string{moving})
	entered := make(chan *shard.Held, 1)
	resume := make(chan struct{})
	result := make(chan error, 1)
	gate := shard.Gate(x0.s, func(s string) string { return s }, shard.ReconcilerFunc[string](
		func(ctx context.Context, _ string, h *shard.Held) (reconcile.Result, error) {
			entered <- h
			<-resume
			// A paused goroutine does not look at its context.
			result <- writeRecord(context.WithoutCancel(ctx), k, x0, h, "record", "x-0-late")
			return reconcile.Result{}, nil
		}))
	go func() { _, _ = gate.Reconcile(ctx, moving) }()
	h := <-entered

	x1 := k.startMember(t, "forced", "x-1", []string{moving})
	settled(t, []*ringMember{x0, x1}, []string{moving})
	require.ErrorIs(t, h.Err(), shard.ErrMoved)
	require.Equal(t, 1.0, x0.metric(t, shard.MetricHandoffForced))
	hNew, err := x1.s.Shard(moving)
	require.NoError(t, err)
	requireGreater(t, hNew.Token(), h.Token())
	require.NoError(t, writeRecord(ctx, k, x1, hNew, "record", "x-1"))

	close(resume)
	require.ErrorIs(t, <-result, token.ErrNotHeld)
	requireFencedOut(t, k, x0, h.Token(), "record")
	require.Equal(t, "x-1", k.configMap(t, "record").Data["by"])
}

// TestShardRedTeamRawLeaseWriters: someone edits the ring's Leases by
// hand (kubectl patch, delete, server-side apply), including edits that
// make the shard's Lease no longer look like one (its annotation or ring
// labels stripped or rewritten). Whatever the edit, the owner's ShardHeld
// ends, the ring settles on one owner whose token is greater, and writes
// with the superseded token are refused.
func TestShardRedTeamRawLeaseWriters(t *testing.T) {
	t.Parallel()
	k := newKube(t)
	shared.InstallPolicy(t)
	ctx := t.Context()
	ids := []string{"x-0", "x-1"}
	cases := []struct {
		name string
		edit func(t *testing.T, lease string)
	}{
		{"merge patch names the other member", func(t *testing.T, lease string) {
			patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:"raw-m-x-1"}},"spec":{"holderIdentity":%q}}`, shard.MemberAnnotation, holderOfLease(t, k, "raw-m-x-1"))
			_, err := k.cs.CoordinationV1().Leases(k.ns).Patch(ctx, lease, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
			require.NoError(t, err)
		}},
		{"json patch rewrites leaseTransitions", func(t *testing.T, lease string) {
			cur, err := k.cs.CoordinationV1().Leases(k.ns).Get(ctx, lease, metav1.GetOptions{})
			require.NoError(t, err)
			// Back to 0, or forward when it is 0 (a patch that changes
			// nothing is not written).
			to := 0
			if *cur.Spec.LeaseTransitions == 0 {
				to = 7
			}
			patch := fmt.Sprintf(`[{"op":"replace","path":"/spec/leaseTransitions","value":%d}]`, to)
			_, err = k.cs.CoordinationV1().Leases(k.ns).Patch(ctx, lease, types.JSONPatchType, []byte(patch), metav1.PatchOptions{})
			require.NoError(t, err)
		}},
		{"delete", func(t *testing.T, lease string) {
			require.NoError(t, k.cs.CoordinationV1().Leases(k.ns).Delete(ctx, lease, metav1.DeleteOptions{}))
		}},
		{"server-side apply names an intruder", func(t *testing.T, lease string) {
			force := true
			body := fmt.Sprintf(`{"apiVersion":"coordination.k8s.io/v1","kind":"Lease","metadata":{"name":%q},"spec":{"holderIdentity":"intruder"}}`, lease)
			_, err := k.cs.CoordinationV1().Leases(k.ns).Patch(ctx, lease, types.ApplyPatchType, []byte(body), metav1.PatchOptions{FieldManager: "kubectl", Force: &force})
			require.NoError(t, err)
		}},
		{"json patch strips the shard annotation", func(t *testing.T, lease string) {
			patch := fmt.Sprintf(`[{"op":"remove","path":"/metadata/annotations/%s"}]`, strings.ReplaceAll(shard.NameAnnotation, "/", "~1"))
			_, err := k.cs.CoordinationV1().Leases(k.ns).Patch(ctx, lease, types.JSONPatchType, []byte(patch), metav1.PatchOptions{})
			require.NoError(t, err)
		}},
		{"merge patch strips the ring labels", func(t *testing.T, lease string) {
			patch := fmt.Sprintf(`{"metadata":{"labels":{%q:null,%q:null}}}`, shard.RingLabel, shard.RoleLabel)
			_, err := k.cs.CoordinationV1().Leases(k.ns).Patch(ctx, lease, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
			require.NoError(t, err)
		}},
		{"merge patch names another shard", func(t *testing.T, lease string) {
			patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:"someone-else"}}}`, shard.NameAnnotation)
			_, err := k.cs.CoordinationV1().Leases(k.ns).Patch(ctx, lease, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
			require.NoError(t, err)
		}},
		{"delete the owner's heartbeat", func(t *testing.T, _ string) {
			require.NoError(t, k.cs.CoordinationV1().Leases(k.ns).Delete(ctx, "raw-m-x-0", metav1.DeleteOptions{}))
		}},
	}
	shards := shardsOwnedBy("raw-", "x-0", len(cases), ids...)
	x0 := k.startMember(t, "raw", "x-0", shards)
	x1 := k.startMember(t, "raw", "x-1", shards)
	members := []*ringMember{x0, x1}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sh, record := shards[i], fmt.Sprintf("record-%d", i)
			settled(t, members, shards)
			old, err := x0.s.Shard(sh)
			require.NoError(t, err)
			require.NoError(t, writeRecord(ctx, k, x0, old, record, "before"))

			tc.edit(t, shard.LeaseName("raw", sh))
			select {
			case <-old.Done():
			case <-time.After(20 * time.Second):
				t.Fatal("the owner's ShardHeld survived the edit")
			}
			settled(t, members, shards)
			h, err := x0.s.Shard(sh)
			require.NoError(t, err)
			requireGreater(t, h.Token(), old.Token())
			require.NoError(t, writeRecord(ctx, k, x0, h, record, "after"))
			requireFencedOut(t, k, x0, old.Token(), record)
		})
	}
}

// TestShardRedTeamMoveRateUnderChurn: members join, leave and crash
// while the ring is still settling, each limited to MovesPerSecond. At
// every sample, no member has made more shard moves than its burst plus
// the rate times its age, whatever the churn asks of it (creates, orphan
// takeovers, handoffs on join and on leave).
func TestShardRedTeamMoveRateUnderChurn(t *testing.T) {
	t.Parallel()
	k := newKube(t)
	const rate = 10.0
	shards := make([]string, 60)
	for i := range shards {
		shards[i] = fmt.Sprintf("churn-%d", i)
	}
	type run struct {
		m     *ringMember
		start time.Time
	}
	var runs []run
	start := func(id string) *ringMember {
		cfg := fastShardConfig(k.ns, "churn", id)
		cfg.MovesPerSecond = rate
		at := time.Now()
		m := k.startMemberWith(t, cfg, shards)
		runs = append(runs, run{m, at})
		return m
	}
	sampleOnce := func() {
		for _, r := range runs {
			n := r.m.metric(t, shard.MetricMoves)
			// The burst is MovesPerSecond; the age is read after the count.
			bound := rate + rate*time.Since(r.start).Seconds()
			require.LessOrEqual(t, n, bound, "%s made %.0f moves, over its rate limit", r.m.name, n)
		}
	}
	sample := func(d time.Duration) {
		for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
			sampleOnce()
		}
	}
	x0 := start("x-0")
	sample(time.Second)
	require.Less(t, x0.metric(t, shard.MetricMoves), float64(len(shards)), "the limit did not hold back the creates")
	x1 := start("x-1")
	sample(time.Second)
	x2 := start("x-2")
	sample(time.Second)
	x1.stop()
	sample(time.Second)
	x2.leases.Killed.Store(true)
	require.True(t, waitFor(time.Minute, func() bool {
		sampleOnce()
		return len(owners([]*ringMember{x0}, shards)) == len(shards)
	}), "x-0 never owned every shard")
	sampleOnce()
	t.Logf("moves: x-0 %.0f, x-1 %.0f, x-2 %.0f", x0.metric(t, shard.MetricMoves), x1.metric(t, shard.MetricMoves), x2.metric(t, shard.MetricMoves))
}
