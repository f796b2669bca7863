package e2e_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/fencer-dev/fencer/kubeadapter"
	"github.com/fencer-dev/fencer/kubeadapter/fenced"
	"github.com/fencer-dev/fencer/kubeadapter/shard"
	"github.com/fencer-dev/fencer/token"
)

// createNamespaces creates n namespaces named after k.ns and prefix whose
// rendezvous owner among ids is want, and returns their names.
func (k *kube) createNamespaces(t *testing.T, prefix string, n int, want string, ids ...string) []string {
	t.Helper()
	names := shardsOwnedBy(k.ns+"-"+prefix, want, n, ids...)
	for _, ns := range names {
		_, err := k.cs.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	return names
}

// runScopeManager runs a namespace-mode manager: every 100ms it
// dispatches every namespace through Gate, and the reconciler writes the
// namespace's "state" ConfigMap through the fenced client. It returns a
// function that stops it, and counts the writes that landed.
func runScopeManager(t *testing.T, m *ringMember, namespaces []string, landed *sync.Map) func() {
	t.Helper()
	gate := shard.Gate(m.s, func(ns string) string { return ns }, shard.ReconcilerFunc[string](
		func(ctx context.Context, ns string, h *shard.Held) (reconcile.Result, error) {
			fc, err := fenced.NewClient(m.crc, h)
			if err != nil {
				return reconcile.Result{}, err
			}
			var cm corev1.ConfigMap
			err = m.crc.Get(ctx, client.ObjectKey{Namespace: ns, Name: "state"}, &cm)
			switch {
			case apierrors.IsNotFound(err):
				cm = corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "state"}, Data: map[string]string{"by": m.name}}
				err = fc.Create(ctx, &cm)
			case err == nil:
				cm.Data = map[string]string{"by": m.name}
				err = fc.Update(ctx, &cm)
			}
			if err == nil {
				n, _ := landed.LoadOrStore(m.name+"/"+ns, new(int))
				*(n.(*int))++
			}
			return reconcile.Result{}, err
		}))
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			for _, ns := range namespaces {
				_, _ = gate.Reconcile(ctx, ns)
			}
		}
	})
	stop := func() { cancel(); wg.Wait() }
	t.Cleanup(stop)
	return stop
}

// steadyWrites returns the Lease writes the API server accepts over 8
// renewal periods of member m, from just after one of its renewals to
// just after the eighth next, so that the window's phase cannot add or
// drop one of m's renewals.
func steadyWrites(t *testing.T, k *kube, m *ringMember) float64 {
	t.Helper()
	renewed := func(after float64) float64 {
		var n float64
		require.True(t, waitFor(5*time.Second, func() bool {
			n = m.metric(t, kubeadapter.MetricLeaseWrites, "kind", kubeadapter.WriteRenew)
			return n > after
		}))
		return n
	}
	n := renewed(m.metric(t, kubeadapter.MetricLeaseWrites, "kind", kubeadapter.WriteRenew))
	w0 := apiLeaseWrites(t, k)
	for range 8 {
		n = renewed(n)
	}
	return apiLeaseWrites(t, k) - w0
}

// TestShardScopesOneActive runs namespace mode: every namespace is a
// scope, and two cluster managers share them. cluster-1 is the
// rendezvous owner of every namespace, cluster-2 is passive.
func TestShardScopesOneActive(t *testing.T) {
	// Not parallel: it counts every Lease write the API server accepts.
	k := newKube(t)
	ids := []string{"cluster-1", "cluster-2"}
	namespaces := k.createNamespaces(t, "a", 3, "cluster-1", ids...)
	// cluster-2 joins a ring that has settled, as a passive manager does.
	c1 := k.startMember(t, "scopes", "cluster-1", namespaces)
	settled(t, []*ringMember{c1}, namespaces)
	c2 := k.startMember(t, "scopes", "cluster-2", namespaces)
	members := []*ringMember{c1, c2}
	settled(t, members, namespaces)
	var landed sync.Map
	stop1 := runScopeManager(t, c1, namespaces, &landed)
	runScopeManager(t, c2, namespaces, &landed)

	// Sampled every 50ms for 1s: exactly one owner per namespace.
	for range 20 {
		for ns, o := range owners(members, namespaces) {
			require.Equal(t, []string{"cluster-1"}, o, "owners of %s", ns)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The passive member made no Lease write but its heartbeat's
	// acquisition and renewals, and no object write at all.
	require.Equal(t, 1.0, c2.metric(t, kubeadapter.MetricLeaseWrites, "kind", kubeadapter.WriteAssign), "passive member's assign writes")
	require.Equal(t, 0.0, c2.metric(t, kubeadapter.MetricLeaseWrites, "kind", kubeadapter.WriteTombstone), "passive member's tombstones")
	require.Equal(t, 0.0, c2.metric(t, shard.MetricMoves), "passive member's shard moves")
	for _, ns := range namespaces {
		_, wrote := landed.Load("cluster-2/" + ns)
		require.False(t, wrote, "the passive member wrote in %s", ns)
		n, _ := landed.Load("cluster-1/" + ns)
		require.NotNil(t, n, "the active member never wrote in %s", ns)
	}
	w3 := steadyWrites(t, k, c2)

	// Kill cluster-1 without release: cluster-2 takes every namespace
	// with a greater token, and cluster-1's writes fail.
	old := map[string]token.Token{}
	for _, ns := range namespaces {
		tok, ok := c1.s.Owns(ns)
		require.True(t, ok)
		old[ns] = tok
	}
	stop1()
	c1.leases.Killed.Store(true)
	require.True(t, waitFor(15*time.Second, func() bool {
		for _, ns := range namespaces {
			if _, ok := c2.s.Owns(ns); !ok {
				return false
			}
			var cm corev1.ConfigMap
			if err := k.crc.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "state"}, &cm); err != nil || cm.Data["by"] != "cluster-2" {
				return false
			}
		}
		return true
	}), "cluster-2 did not take every namespace")
	for _, ns := range namespaces {
		tok, _ := c2.s.Owns(ns)
		requireGreater(t, tok, old[ns])
		stale, err := fenced.NewClient(c1.crc, staticHolder{Tok: old[ns]})
		require.NoError(t, err)
		var cm corev1.ConfigMap
		require.NoError(t, k.crc.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: "state"}, &cm))
		cm.Data = map[string]string{"by": "cluster-1-late"}
		require.ErrorIs(t, stale.Update(t.Context(), &cm), token.ErrStale, "cluster-1's late write in %s", ns)
	}
	c2.stop()

	// Steady-state Lease writes do not grow with scopes: a ring of two
	// members over 30 namespaces costs what it costs over 3.
	many := k.createNamespaces(t, "b", 30, "cluster-1", ids...)
	d1 := k.startMember(t, "scopes30", "cluster-1", many)
	d2 := k.startMember(t, "scopes30", "cluster-2", many)
	settled(t, []*ringMember{d1, d2}, many)
	w30 := steadyWrites(t, k, d2)
	t.Logf("steady-state Lease writes over 8 renewal periods: %.0f for 3 namespaces, %.0f for 30", w3, w30)
	// A window of 8 periods may catch a renewal more or less per member, and
	// a retried renewal on a loaded machine one more; renewing per scope
	// would cost at least 24 more writes over 3 namespaces and 240 over 30.
	require.InDelta(t, w3, w30, 4, "steady-state Lease writes grew with the namespaces")
	require.InDelta(t, 16, w3, 4, "two members renewing every period")
}
