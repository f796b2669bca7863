package mcr_test

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/multicluster-runtime/pkg/multicluster"

	"github.com/fencer-dev/fencer/kubeadapter/kubefencertest"
	"github.com/fencer-dev/fencer/kubeadapter/shard"
	"github.com/fencer-dev/fencer/mcr"
	"github.com/fencer-dev/fencer/token"
)

// sampler samples, every few milliseconds, which replicas have each
// project's runnables engaged, and records every sample in which two did.
type sampler struct {
	mu      sync.Mutex
	samples int
	doubles []string
	stop    chan struct{}
	done    chan struct{}
}

func startSampler(rs func() []*replica, projects []string) *sampler {
	s := &sampler{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-s.stop:
				return
			case <-t.C:
			}
			cur := rs()
			s.mu.Lock()
			s.samples++
			for _, p := range projects {
				if by := engagedBy(cur, p); len(by) > 1 {
					s.doubles = append(s.doubles, fmt.Sprintf("%s engaged by %s and %s", p, by[0].name, by[1].name))
				}
			}
			s.mu.Unlock()
		}
	}()
	return s
}

func (s *sampler) finish(t *testing.T) {
	t.Helper()
	close(s.stop)
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	require.Empty(t, s.doubles, "a project was engaged by two replicas at once (%d samples)", s.samples)
	t.Logf("%d samples, none with a project engaged twice", s.samples)
}

// TestHandover kills a replica (its network is cut: nothing is released)
// and then has a new one join, while the downstream value keeps changing:
// no project is ever engaged by two replicas at once (sampled every 5ms),
// every project ends engaged by exactly one, and the tokens stamped on
// each downstream record never go backwards. It reports the time from the
// loss to the re-engagement of the lost replica's projects.
func TestHandover(t *testing.T) {
	start := time.Now()
	api := kubefencertest.APIServerForTest(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	require.NoError(t, kubefencertest.InstallPolicy(ctx, api.Admin()))
	e := newEnv(t, api, "hand", 12)

	var mu sync.Mutex
	var rs []*replica
	current := func() []*replica {
		mu.Lock()
		defer mu.Unlock()
		return append([]*replica(nil), rs...)
	}
	for _, n := range replicaNames {
		r := e.startReplica(t, fencerCoord, n)
		mu.Lock()
		rs = append(rs, r)
		mu.Unlock()
	}
	owner := settle(t, current(), e.projects, 60*time.Second)
	smp := startSampler(current, e.projects)

	// The downstream value changes every 100ms, so that the owners keep
	// writing the records throughout.
	churnCtx, stopChurn := context.WithCancel(t.Context())
	churned := make(chan struct{})
	go func() {
		defer close(churned)
		for i := 1; churnCtx.Err() == nil; i++ {
			cm, err := e.cs.CoreV1().ConfigMaps(e.down).Get(churnCtx, "downstream", metav1.GetOptions{})
			if err != nil {
				return
			}
			cm.Data = map[string]string{"v": fmt.Sprint(i)}
			_, _ = e.cs.CoreV1().ConfigMaps(e.down).Update(churnCtx, cm, metav1.UpdateOptions{})
			select {
			case <-churnCtx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	defer func() { stopChurn(); <-churned }()

	// Kill replica-0: its network is cut, nothing is released.
	dead := rs[0]
	var lost []string
	for _, p := range e.projects {
		if owner[p] == dead {
			lost = append(lost, p)
		}
	}
	require.NotEmpty(t, lost)
	cut := time.Now()
	dead.net.set(true)
	reengaged := map[string]time.Duration{}
	require.True(t, waitFor(30*time.Second, func() bool {
		for _, p := range lost {
			if _, ok := reengaged[p]; ok {
				continue
			}
			for _, r := range rs[1:] {
				if r.engaged.isLive(multicluster.ClusterName(p)) {
					reengaged[p] = time.Since(cut)
				}
			}
		}
		return len(reengaged) == len(lost)
	}), "the dead replica's projects were not all engaged elsewhere")
	var worst time.Duration
	for _, d := range reengaged {
		worst = max(worst, d)
	}
	t.Logf("loss to re-engagement of %d projects: max %v (shard.Config LeaseDuration 2s, RenewDeadline 1.5s, RetryPeriod 250ms)", len(lost), worst.Round(time.Millisecond))
	for _, p := range lost {
		require.False(t, dead.engaged.isLive(multicluster.ClusterName(p)), "the dead replica still has %s engaged", p)
	}
	mu.Lock()
	rs = rs[1:]
	mu.Unlock()
	dead.stop()

	// A new replica joins and takes its share by handoffs.
	joined := e.startReplica(t, fencerCoord, "replica-3")
	mu.Lock()
	rs = append(rs, joined)
	mu.Unlock()
	require.True(t, waitFor(30*time.Second, func() bool {
		for _, p := range e.projects {
			if joined.engaged.isLive(multicluster.ClusterName(p)) {
				return true
			}
		}
		return false
	}), "the joining replica got no project")
	owner = settle(t, current(), e.projects, 60*time.Second)
	n := 0
	for _, p := range e.projects {
		if owner[p] == joined {
			n++
		}
	}
	require.NotZero(t, n, "the joining replica got no project")
	time.Sleep(500 * time.Millisecond)
	smp.finish(t)
	stopChurn()
	<-churned

	// The tokens stamped on each record never went backwards.
	byProject := map[string][]write{}
	for _, w := range e.log.all() {
		if w.err == nil {
			byProject[w.project] = append(byProject[w.project], w)
		}
	}
	for p, ws := range byProject {
		sort.Slice(ws, func(i, j int) bool { return ws[i].rv < ws[j].rv })
		for i := 1; i < len(ws); i++ {
			c, err := ws[i].tok.Compare(ws[i-1].tok)
			require.NoError(t, err)
			require.GreaterOrEqual(t, c, 0, "%s: %s wrote %s at %d after %s at %d", p, ws[i].replica, ws[i].tok, ws[i].rv, ws[i-1].tok, ws[i-1].rv)
		}
	}
	t.Logf("%d projects, %d writes, tokens never backwards; joined replica owns %d; wall time %v", len(byProject), len(e.log.all()), n, time.Since(start).Round(time.Millisecond))
}

// TestBadInput checks the Coordinator's answers to an unknown cluster, a
// cluster the provider removes while it is engaged, GetCluster during a
// handoff, and clusters it cannot shard: each a clear error, and nothing
// written.
func TestBadInput(t *testing.T) {
	start := time.Now()
	api := kubefencertest.APIServerForTest(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	require.NoError(t, kubefencertest.InstallPolicy(ctx, api.Admin()))
	e := newEnv(t, api, "bad", 4)
	e.handoff = 10 * time.Second
	rs := []*replica{e.startReplica(t, fencerCoord, "replica-0"), e.startReplica(t, fencerCoord, "replica-1")}
	owner := settle(t, rs, e.projects, 60*time.Second)
	require.True(t, waitFor(20*time.Second, func() bool {
		for _, p := range e.projects {
			if len(e.log.by(p, "0")) == 0 {
				return false
			}
		}
		return true
	}), "the owners did not write the records")
	leases := func() []string {
		l, err := e.cs.CoordinationV1().Leases(e.ring).List(ctx, metav1.ListOptions{})
		require.NoError(t, err)
		var out []string
		for _, x := range l.Items {
			if strings.HasPrefix(x.Name, "mcr-s-") { // shard Leases; heartbeats renew
				out = append(out, x.Name+"@"+x.ResourceVersion)
			}
		}
		sort.Strings(out)
		return out
	}

	t.Run("unknown cluster", func(t *testing.T) {
		for _, r := range rs {
			_, err := r.mgr.GetCluster(ctx, "no-such-cluster")
			require.ErrorIs(t, err, mcr.ErrNotOwner)
			require.ErrorIs(t, err, multicluster.ErrClusterNotFound)
			_, err = r.mgr.GetManager(ctx, "no-such-cluster")
			require.ErrorIs(t, err, mcr.ErrNotOwner)
			_, err = r.coord.Shard("no-such-cluster")
			require.ErrorIs(t, err, mcr.ErrNotOwner)
			require.ErrorIs(t, err, token.ErrNotHeld)
			_, ok := r.coord.Owns("no-such-cluster")
			require.False(t, ok)
		}
		_, err := e.cs.CoordinationV1().Leases(e.ring).Get(ctx, shard.LeaseName("mcr", "no-such-cluster"), metav1.GetOptions{})
		require.Error(t, err, "a Lease was written for an unknown cluster")
	})

	t.Run("unshardable", func(t *testing.T) {
		before := leases()
		c := rs[0].coord
		cl, err := rs[0].mgr.GetCluster(ctx, multicluster.ClusterName(e.projects[0]))
		if err != nil { // replica-0 does not own it: any cluster will do
			cl, err = rs[1].mgr.GetCluster(ctx, multicluster.ClusterName(e.projects[0]))
		}
		require.NoError(t, err)
		require.ErrorIs(t, c.Engage(ctx, "", cl), mcr.ErrBadCluster)
		require.ErrorIs(t, c.Engage(ctx, "nil-cluster", nil), mcr.ErrBadCluster)
		done, cancelDone := context.WithCancel(ctx)
		cancelDone()
		require.ErrorIs(t, c.Engage(done, "done-cluster", cl), context.Canceled)
		for _, name := range []multicluster.ClusterName{"", "nil-cluster", "done-cluster"} {
			_, err := rs[0].mgr.GetCluster(ctx, name)
			if name == "" {
				require.NoError(t, err, "the local cluster is passed through")
				continue
			}
			require.ErrorIs(t, err, mcr.ErrNotOwner)
		}
		time.Sleep(500 * time.Millisecond)
		require.Equal(t, before, leases(), "a Lease was written for a cluster that cannot be sharded")
	})

	t.Run("removed while engaged", func(t *testing.T) {
		p := e.projects[1]
		o := owner[p]
		for _, r := range rs {
			r.prov.Remove(multicluster.ClusterName(p))
		}
		require.True(t, waitFor(10*time.Second, func() bool {
			return len(engagedBy(rs, p)) == 0
		}), "the removed cluster is still engaged")
		require.True(t, waitFor(5*time.Second, func() bool { return len(o.engaged.endings(multicluster.ClusterName(p))) > 0 }))
		for _, r := range rs {
			_, err := r.mgr.GetCluster(ctx, multicluster.ClusterName(p))
			require.ErrorIs(t, err, mcr.ErrNotOwner)
			require.ErrorIs(t, err, multicluster.ErrClusterNotFound)
			require.True(t, waitFor(5*time.Second, func() bool { _, ok := r.coord.Owns(multicluster.ClusterName(p)); return !ok }))
		}
		// A downstream change is skipped for it everywhere: nothing written.
		rec := e.record(t, p)
		e.setDownstream(t, "removed")
		require.True(t, waitFor(10*time.Second, func() bool {
			for _, q := range e.projects {
				if q != p && len(e.log.by(q, "removed")) == 0 {
					return false
				}
			}
			return true
		}))
		time.Sleep(300 * time.Millisecond)
		require.Empty(t, e.log.by(p, "removed"), "a removed cluster was reconciled")
		require.Equal(t, rec.ResourceVersion, e.record(t, p).ResourceVersion, "a removed cluster's record was written")
	})

	t.Run("GetCluster during a handoff", func(t *testing.T) {
		// The owner of p leaves while a reconcile of p is in flight: its
		// Held ends first, and the handoff waits for the reconcile.
		p := e.projects[2]
		o := owner[p]
		var other *replica
		for _, r := range rs {
			if r != o {
				other = r
			}
		}
		h, err := o.coord.Shard(multicluster.ClusterName(p))
		require.NoError(t, err)
		paused, resume := o.pause.armStubborn(p, "handoff")
		e.setDownstream(t, "handoff")
		select {
		case <-paused:
		case <-time.After(20 * time.Second):
			t.Fatal("the owner did not reconcile the change")
		}
		before := e.record(t, p)
		go o.stop()
		select {
		case <-h.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("the leaving owner's Held did not end")
		}
		for _, r := range []*replica{o, other} {
			_, err := r.mgr.GetCluster(ctx, multicluster.ClusterName(p))
			require.ErrorIs(t, err, mcr.ErrNotOwner, "%s during the handoff", r.name)
			require.ErrorIs(t, err, token.ErrNotHeld)
		}
		require.True(t, waitFor(2*time.Second, func() bool {
			return !o.engaged.isLive(multicluster.ClusterName(p))
		}), "the leaving owner is still engaged")
		close(resume)
		late := e.log.await(t, 10*time.Second, o.name, p, "handoff", "the in-flight reconcile did not attempt its write")
		require.ErrorIs(t, late.err, token.ErrNotHeld, "the in-flight reconcile's write: %v", late.err)
		// The other replica gets p by the handoff and writes it with a
		// greater token.
		require.True(t, waitFor(20*time.Second, func() bool {
			rec := e.record(t, p)
			return rec.Data["by"] == other.name && rec.Data["v"] == "handoff"
		}), "the handoff did not complete")
		now, _, err := token.FromAnnotations(e.record(t, p).Annotations)
		require.NoError(t, err)
		requireGreater(t, now, h.Token())
		require.NotEqual(t, before.ResourceVersion, e.record(t, p).ResourceVersion)
	})
	t.Logf("wall time %v", time.Since(start).Round(time.Millisecond))
}
