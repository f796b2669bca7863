package kubeadapter_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/fencer-dev/fencer/kubeadapter"
	"github.com/fencer-dev/fencer/kubeadapter/deploy"
	"github.com/fencer-dev/fencer/token"
)

// startWatcher runs a Watcher over k's namespace (or all namespaces) until
// the test ends, and returns it with the registry of its metrics.
func startWatcher(k *kube, tb testing.TB, allNamespaces bool) (*kubeadapter.Watcher, *prometheus.Registry) {
	tb.Helper()
	reg := prometheus.NewPedanticRegistry()
	opts := []kubeadapter.WatcherOption{kubeadapter.WithRegisterer(reg)}
	if !allNamespaces {
		opts = append(opts, kubeadapter.WatchNamespaces(k.NS))
	}
	w, err := kubeadapter.NewWatcher(k.CS.CoordinationV1(), opts...)
	require.NoError(tb, err)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { assert.NoError(tb, w.Start(ctx)) })
	tb.Cleanup(func() { cancel(); wg.Wait() })
	return w, reg
}

// slow is a Config whose renewals are 20s apart, so that a loss noticed
// within a few seconds of acquiring was noticed by the Watcher.
func slow(k *kube, identity string, w *kubeadapter.Watcher) kubeadapter.Config {
	return kubeadapter.Config{
		Namespace: k.NS, Name: "fence", Identity: identity,
		LeaseDuration: 60 * time.Second, RenewDeadline: 40 * time.Second, RetryPeriod: 20 * time.Second,
		Watcher: w,
	}
}

// requireFenced waits briefly for h to end for reason: far less than a
// renewal period, so only the Watcher can have ended it.
func requireFenced(t *testing.T, h *kubeadapter.Held, reason error) {
	t.Helper()
	select {
	case <-h.Context().Done():
	case <-time.After(3 * time.Second):
		t.Fatalf("the holder's context was not cancelled within 3s (renewals are 20s apart); want %v", reason)
	}
	require.ErrorIs(t, context.Cause(h.Context()), reason)
	require.ErrorIs(t, h.Err(), token.ErrNotHeld)
}

// TestSelfFenceOnLiveLease makes each loss happen to a live Lease on the
// real API server while its holder works, and checks that the holder's
// context is cancelled at once, that its fenced client stops writing, and
// that once the new acquisition has written the object, the old token's
// writes fail in the store.
func TestSelfFenceOnLiveLease(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name          string
		allNamespaces bool
		// event makes the loss and returns the token of the acquisition
		// that follows it.
		event  func(t *testing.T, k *kube, e *kubeadapter.Elector, h *kubeadapter.Held) token.Token
		reason error
	}{
		{"deleted, then re-acquired", false, func(t *testing.T, k *kube, e *kubeadapter.Elector, h *kubeadapter.Held) token.Token {
			require.NoError(t, k.CS.CoordinationV1().Leases(k.NS).Delete(t.Context(), "fence", metav1.DeleteOptions{}))
			requireFenced(t, h, kubeadapter.ErrLeaseDeleted)
			return acquire(t, e).Token() // the same Elector, a new acquisition
		}, kubeadapter.ErrLeaseDeleted},
		{"deleted and recreated for another holder", true, func(t *testing.T, k *kube, _ *kubeadapter.Elector, _ *kubeadapter.Held) token.Token {
			leases := k.CS.CoordinationV1().Leases(k.NS)
			require.NoError(t, leases.Delete(t.Context(), "fence", metav1.DeleteOptions{}))
			other, d, n := "other", int32(60), int32(0)
			created, err := leases.Create(t.Context(), &coordinationv1.Lease{
				ObjectMeta: metav1.ObjectMeta{Name: "fence"},
				Spec:       coordinationv1.LeaseSpec{HolderIdentity: &other, LeaseDurationSeconds: &d, LeaseTransitions: &n},
			}, metav1.CreateOptions{})
			require.NoError(t, err)
			tok, err := kubeadapter.TokenOf(created)
			require.NoError(t, err)
			return tok
		}, kubeadapter.ErrLeaseDeleted},
		{"holder changed by an update", false, func(t *testing.T, k *kube, _ *kubeadapter.Elector, _ *kubeadapter.Held) token.Token {
			leases := k.CS.CoordinationV1().Leases(k.NS)
			cur, err := leases.Get(t.Context(), "fence", metav1.GetOptions{})
			require.NoError(t, err)
			other, n := "other", *cur.Spec.LeaseTransitions+1
			cur.Spec.HolderIdentity, cur.Spec.LeaseTransitions = &other, &n
			updated, err := leases.Update(t.Context(), cur, metav1.UpdateOptions{})
			require.NoError(t, err)
			tok, err := kubeadapter.TokenOf(updated)
			require.NoError(t, err)
			return tok
		}, kubeadapter.ErrLeaseTaken},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			k := newKube(t)
			ctx := t.Context()
			w, reg := startWatcher(k, t, tc.allNamespaces)
			e, err := kubeadapter.NewElector(k.CS.CoordinationV1(), slow(k, "a", w))
			require.NoError(t, err)
			h := acquire(t, e)
			ca := k.Client(t, h)
			require.NoError(t, ca.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: k.NS, Name: "o"}, Data: map[string]string{"by": "a"}}))
			work := make(chan error, 1)
			go func() { // the holder's active work
				<-h.Context().Done()
				work <- context.Cause(h.Context())
			}()

			newer := tc.event(t, k, e, h)
			requireFenced(t, h, tc.reason)
			require.ErrorIs(t, <-work, tc.reason)
			require.Eventually(t, func() bool { return histogramCount(t, reg, kubeadapter.MetricSelfFenceLatency) >= 1 }, 5*time.Second, 10*time.Millisecond,
				"the self-fence was not the Watcher's")
			requireGreater(t, newer, h.Token())

			late := k.ConfigMap(t, "o")
			late.Data["by"] = "a-late"
			require.ErrorIs(t, ca.Update(ctx, late.DeepCopy()), token.ErrNotHeld, "the old holder's fenced client still wrote")

			// The new acquisition writes the object; the old token's write,
			// bypassing the local check, then fails in the store.
			cur := k.ConfigMap(t, "o")
			cur.Data["by"] = "new"
			require.NoError(t, k.Client(t, staticHolder{Tok: newer}).Update(ctx, cur))
			require.ErrorIs(t, k.Client(t, staticHolder{Tok: h.Token()}).Update(ctx, late.DeepCopy()), token.ErrStale)
			require.Equal(t, "new", k.ConfigMap(t, "o").Data["by"])
		})
	}
}

func histogramCount(t *testing.T, g prometheus.Gatherer, name string) uint64 {
	t.Helper()
	mfs, err := g.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetHistogram().GetSampleCount()
		}
	}
	return 0
}

// TestSelfFenceWithShippedRole runs a Watcher and an Elector as a user
// bound only to deploy/rbac/role.yaml in the Lease's namespace, and checks
// that those rights suffice to acquire, watch and self-fence.
func TestSelfFenceWithShippedRole(t *testing.T) {
	t.Parallel()
	k := newKube(t)
	ctx := t.Context()
	data, err := deploy.FS.ReadFile(deploy.Role)
	require.NoError(t, err)
	var role rbacv1.Role
	require.NoError(t, yaml.Unmarshal(data, &role))
	_, err = k.CS.RbacV1().Roles(k.NS).Create(ctx, &role, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = k.CS.RbacV1().RoleBindings(k.NS).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "fencer"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "controller"}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)
	cs, err := kubernetes.NewForConfig(k.Env.Impersonate("controller"))
	require.NoError(t, err)
	require.Eventually(t, func() bool { // until the RoleBinding is in effect
		_, err := cs.CoordinationV1().Leases(k.NS).List(ctx, metav1.ListOptions{})
		return err == nil
	}, 30*time.Second, 50*time.Millisecond)

	w, err := kubeadapter.NewWatcher(cs.CoordinationV1(), kubeadapter.WatchNamespaces(k.NS))
	require.NoError(t, err)
	wctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { assert.NoError(t, w.Start(wctx)) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	e, err := kubeadapter.NewElector(cs.CoordinationV1(), slow(k, "a", w))
	require.NoError(t, err)
	h, err := e.TryAcquire(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = h.Release(context.Background()) })
	require.NoError(t, k.CS.CoordinationV1().Leases(k.NS).Delete(ctx, "fence", metav1.DeleteOptions{}))
	requireFenced(t, h, kubeadapter.ErrLeaseDeleted)
}
