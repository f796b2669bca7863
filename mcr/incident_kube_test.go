package mcr_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/multicluster-runtime/pkg/multicluster"

	"github.com/fencer-dev/fencer/kubeadapter/fenced"
	"github.com/fencer-dev/fencer/kubeadapter/kubefencertest"
	"github.com/fencer-dev/fencer/kubeadapter/shard"
	"github.com/fencer-dev/fencer/token"
)

var replicaNames = []string{"replica-0", "replica-1", "replica-2"}

// incidentProjects is how many projects (clusters) the incident runs.
const incidentProjects = 6

// TestIncidentWithMCR replays the sharded-controller incident with real
// multicluster-runtime v0.24.1 on a real API server with the admission
// policy installed, once with mcr's own sharded coordinator and once with
// fencer's, in the same run: three replicas, each with its own clients,
// share projects (namespaces, each a cluster of the provider); a
// controller watches each project's objects and, through a raw source on
// the local cluster, a shared downstream ConfigMap that maps to every
// project; its reconcile writes a DNS record downstream.
func TestIncidentWithMCR(t *testing.T) {
	start := time.Now()
	api := kubefencertest.APIServerForTest(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	require.NoError(t, kubefencertest.InstallPolicy(ctx, api.Admin()))
	t.Run(mcrSharded.String(), func(t *testing.T) {
		if raceEnabled {
			// mcr v0.24.1's sharded coordinator races with itself:
			// its Lease fence's held flag and cancel func are written
			// by the Release goroutines the coordinator starts and
			// read by TryAcquire under the coordinator's lock, with
			// no lock shared. Under -race that fails the test when
			// the timing hits it; scripts/test.sh runs this test
			// again without the race detector.
			t.Skip("mcr's sharded coordinator has data races of its own: run without -race")
		}
		incidentBaseline(t, api)
	})
	t.Run(fencerCoord.String(), func(t *testing.T) { incidentFenced(t, api) })
	t.Logf("wall time %v", time.Since(start).Round(time.Millisecond))
}

// incidentBaseline shows the incident with mcr's sharded coordinator:
// every replica reconciles every project on a downstream change, and a
// paused replica's late write lands after a fresh one.
func incidentBaseline(t *testing.T, api *kubefencertest.APIServer) {
	e := newEnv(t, api, "base", incidentProjects)
	var rs []*replica
	for _, n := range replicaNames {
		rs = append(rs, e.startReplica(t, mcrSharded, n))
	}
	owner := settle(t, rs, e.projects, 90*time.Second)

	// The per-project watch is gated by the coordinator's engagement,
	// but the raw source runs on every replica: all three reconcile
	// every project.
	e.setDownstream(t, "1")
	require.True(t, waitFor(20*time.Second, func() bool {
		for _, p := range e.projects {
			if len(e.log.by(p, "1")) < len(rs) {
				return false
			}
		}
		return true
	}), "the replicas did not all reconcile change 1")
	for _, p := range e.projects {
		require.Equal(t, replicaNames, e.log.by(p, "1"), "replicas that reconciled %s", p)
	}
	t.Logf("mcr-sharded: each of %d projects reconciled by %d replicas for one downstream change", len(e.projects), len(rs))

	// The owner of p pauses mid-reconcile, after reading value 2; the
	// value moves on to 3, which the other replicas write; the owner
	// resumes and writes 2 over 3.
	p, o := e.projects[0], owner[e.projects[0]]
	paused, resume := o.pause.arm(p, "2")
	e.setDownstream(t, "2")
	select {
	case v := <-paused:
		require.Equal(t, "2", v)
	case <-time.After(20 * time.Second):
		t.Fatal("the owner did not reconcile change 2")
	}
	e.setDownstream(t, "3")
	var fresh int64
	require.True(t, waitFor(20*time.Second, func() bool {
		n := 0
		for _, w := range e.log.all() {
			if w.project == p && w.value == "3" && w.err == nil && w.replica != o.name {
				n++
				fresh = max(fresh, w.rv)
			}
		}
		return n >= len(rs)-1
	}), "the other replicas did not write the fresh value")
	close(resume)
	var late write
	require.True(t, waitFor(20*time.Second, func() bool {
		for _, w := range e.log.all() {
			if w.replica == o.name && w.project == p && w.value == "2" && w.err == nil && w.rv > fresh {
				late = w
				return true
			}
		}
		return false
	}), "the paused owner's late write did not land")
	t.Logf("mcr-sharded: %s's stale value %q landed at resourceVersion %d, after the fresh one at %d", o.name, late.value, late.rv, fresh)
}

// incidentFenced replays the incident with fencer's Coordinator, Gate and
// a fenced client: exactly one replica reconciles each change, the others
// skip and count, and the paused former owner's late write is refused.
func incidentFenced(t *testing.T, api *kubefencertest.APIServer) {
	ctx := t.Context()
	e := newEnv(t, api, "fenc", incidentProjects)
	var rs []*replica
	for _, n := range replicaNames {
		rs = append(rs, e.startReplica(t, fencerCoord, n))
	}
	owner := settle(t, rs, e.projects, 60*time.Second)
	// The engagement (each project's own watch) and the AcquiredSource
	// had each owner write its projects' records.
	require.True(t, waitFor(20*time.Second, func() bool {
		for _, p := range e.projects {
			if len(e.log.by(p, "0")) == 0 {
				return false
			}
		}
		return true
	}), "the owners did not reconcile their projects")

	// Each change is reconciled once per project, by its owner; the two
	// other replicas skip it at dispatch and count it. The start's own
	// requests (each replica's raw source lists the downstream object
	// once) may still be reaching dispatch: count from when they stop.
	require.True(t, quiet(rs, time.Second, 20*time.Second), "the replicas kept skipping requests with nothing changing")
	skipped0 := map[string]int64{}
	for _, r := range rs {
		skipped0[r.name] = r.gated.Skipped()
	}
	e.setDownstream(t, "1")
	skippedSince := func() int64 {
		var n int64
		for _, r := range rs {
			n += r.gated.Skipped() - skipped0[r.name]
		}
		return n
	}
	require.True(t, waitFor(20*time.Second, func() bool {
		for _, p := range e.projects {
			if len(e.log.by(p, "1")) == 0 {
				return false
			}
		}
		return skippedSince() >= int64(2*len(e.projects))
	}), "change 1 was not reconciled and skipped everywhere")
	time.Sleep(300 * time.Millisecond)
	for _, p := range e.projects {
		require.Equal(t, []string{owner[p].name}, e.log.by(p, "1"), "replicas that reconciled %s", p)
		rec := e.record(t, p)
		require.Equal(t, "1", rec.Data["v"])
		require.Equal(t, owner[p].name, rec.Data["by"])
	}
	for _, r := range rs {
		owned := 0
		for _, p := range e.projects {
			if owner[p] == r {
				owned++
			}
		}
		require.Equal(t, int64(len(e.projects)-owned), r.gated.Skipped()-skipped0[r.name], "%s skipped", r.name)
	}
	t.Logf("fencer: each of %d projects reconciled by 1 replica; %d requests skipped at dispatch", len(e.projects), skippedSince())

	// A replica that does not own p refuses it: GetCluster and Shard.
	p, o := e.projects[0], owner[e.projects[0]]
	for _, r := range rs {
		if r == o {
			continue
		}
		_, err := r.mgr.GetCluster(ctx, multicluster.ClusterName(p))
		require.ErrorIs(t, err, shard.ErrNotOwner)
		require.ErrorIs(t, err, token.ErrNotHeld)
		_, err = r.coord.Shard(multicluster.ClusterName(p))
		require.ErrorIs(t, err, shard.ErrNotOwner)
	}

	// The incident: the owner of p is paused mid-reconcile, after reading
	// value 2; it does not see its Lease change (its watch of p's shard
	// Lease is frozen, as a paused process sees nothing). Meanwhile p is
	// taken over and the new owner writes fresh state with a greater
	// token.
	hOld, err := o.coord.Shard(multicluster.ClusterName(p))
	require.NoError(t, err)
	o.leases.freeze(shard.LeaseName("mcr", p))
	paused, resume := o.pause.arm(p, "2")
	e.setDownstream(t, "2")
	select {
	case v := <-paused:
		require.Equal(t, "2", v)
	case <-time.After(20 * time.Second):
		t.Fatal("the owner did not reconcile change 2")
	}
	taken := kubefencertest.Supersede(t, api.Admin(), hOld)
	requireGreater(t, taken.Token(), hOld.Token())
	fc, err := fenced.NewClient(e.admin, taken)
	require.NoError(t, err)
	fresh := e.record(t, p)
	fresh.Data = map[string]string{"v": "fresh", "by": "new-owner"}
	require.NoError(t, fc.Update(ctx, fresh))
	// In its own eyes the paused replica still owns p.
	require.NoError(t, hOld.Err())
	require.True(t, o.engaged.isLive(multicluster.ClusterName(p)))

	// It resumes: its late write, through the fenced client of its Held,
	// fails with the typed stale error.
	close(resume)
	late := e.log.await(t, 20*time.Second, o.name, p, "2", "the paused owner did not attempt its late write")
	require.ErrorIs(t, late.err, token.ErrStale, "late write: %v", late.err)
	// Its raw write with the old stamp is denied by the API server.
	raw := e.record(t, p)
	raw.Annotations = hOld.Token().Stamp(raw.Annotations)
	raw.Data = map[string]string{"v": "stale", "by": o.name + "-raw"}
	_, err = e.cs.CoreV1().ConfigMaps(e.down).Update(ctx, raw, metav1.UpdateOptions{})
	require.True(t, apierrors.IsForbidden(err), "raw stale update: %v", err)
	require.Contains(t, err.Error(), "stale fencing token")
	final := e.record(t, p)
	require.Equal(t, fresh.ResourceVersion, final.ResourceVersion, "a stale write landed")
	require.Equal(t, "fresh", final.Data["v"])
	t.Logf("fencer: %s's late write refused: %v", o.name, late.err)

	// The paused replica learns of the takeover: its Held ends, then its
	// engagement of p. The orphaned project is taken back by its
	// rendezvous owner with a greater token and engaged again, and the
	// re-engaged controller writes the current value.
	_, engagedBefore := o.engaged.count(multicluster.ClusterName(p))
	o.leases.thaw()
	select {
	case <-hOld.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the former owner's Held did not end")
	}
	require.ErrorIs(t, hOld.Err(), shard.ErrMoved)
	require.True(t, waitFor(10*time.Second, func() bool {
		for _, cause := range o.engaged.endings(multicluster.ClusterName(p)) {
			if errors.Is(cause, shard.ErrMoved) {
				return true
			}
		}
		return false
	}), "the former owner's engagement of %s did not end with its Held", p)
	var now token.Token
	require.True(t, waitFor(20*time.Second, func() bool {
		rec := e.record(t, p)
		tok, stamped, err := token.FromAnnotations(rec.Annotations)
		if err != nil || !stamped || rec.Data["v"] != "2" {
			return false
		}
		now = tok
		return true
	}), "no owner re-engaged %s and wrote it", p)
	requireGreater(t, now, taken.Token())
	var reengaged bool
	for _, r := range rs {
		if tok, ok := r.coord.Owns(multicluster.ClusterName(p)); ok && tok == now {
			live, total := r.engaged.count(multicluster.ClusterName(p))
			reengaged = live == 1 && (r != o || total > engagedBefore)
		}
	}
	require.True(t, reengaged, "the new owner of %s is not engaged anew", p)
}

// requireGreater fails t unless a is greater than b.
func requireGreater(t *testing.T, a, b token.Token) {
	t.Helper()
	c, err := a.Compare(b)
	require.NoError(t, err)
	require.Equal(t, 1, c, fmt.Sprintf("%s is not greater than %s", a, b))
}
