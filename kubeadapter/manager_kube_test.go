package kubeadapter_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/fencer-dev/fencer/kubeadapter"
	"github.com/fencer-dev/fencer/kubeadapter/fenced"
	"github.com/fencer-dev/fencer/kubeadapter/leader"
	"github.com/fencer-dev/fencer/token"
)

// term is one acquisition as a leader-only runnable saw it.
type term struct {
	ctx context.Context
	h   *kubeadapter.Held
}

// copyController returns a leader.Runnable that, under each acquisition,
// runs a new controller copying ConfigMap "source" to "target" through a
// fenced client holding that acquisition, and reports the acquisition on
// terms.
func copyController(mgr manager.Manager, terms chan<- term) leader.Runnable {
	return leader.RunnableFunc(func(ctx context.Context, h *kubeadapter.Held) error {
		c, err := fenced.NewClient(mgr.GetClient(), h, fenced.WithAPIReader(mgr.GetAPIReader()))
		if err != nil {
			return err
		}
		ctrl, err := controller.NewUnmanaged("copy", controller.Options{
			SkipNameValidation: ptr.To(true), // a new controller per acquisition
			Reconciler: reconcile.Func(func(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
				var src corev1.ConfigMap
				if err := c.Get(ctx, req.NamespacedName, &src); err != nil {
					return reconcile.Result{}, client.IgnoreNotFound(err)
				}
				tgt := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: src.Namespace, Name: "target"}, Data: src.Data}
				err := c.Create(ctx, tgt)
				if apierrors.IsAlreadyExists(err) {
					tgt.Annotations = nil
					err = c.Update(ctx, tgt) // no resourceVersion: read, check and write
				}
				return reconcile.Result{}, err
			}),
		})
		if err != nil {
			return err
		}
		only := predicate.NewTypedPredicateFuncs(func(o *corev1.ConfigMap) bool { return o.Name == "source" })
		if err := ctrl.Watch(source.Kind(mgr.GetCache(), &corev1.ConfigMap{}, &handler.TypedEnqueueRequestForObject[*corev1.ConfigMap]{}, only)); err != nil {
			return err
		}
		terms <- term{ctx: ctx, h: h}
		return ctrl.Start(ctx)
	})
}

// TestLeaderWithManager runs a real controller-runtime Manager, its own
// leader election off, with a Watcher and a Leader whose leader-only
// controller writes through a fenced client. Deleting the Lease cancels
// the controller at once; the Leader acquires again with a greater token,
// which the new controller's writes carry, and the old token's writes fail
// in the store. Another holder taking the Lease cancels the controller at
// once too.
func TestLeaderWithManager(t *testing.T) {
	t.Parallel()
	k := newKube(t)
	ctx := t.Context()
	mgr, err := manager.New(k.Env.Admin(), manager.Options{
		Scheme:                 clientgoscheme.Scheme,
		LeaderElection:         false,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Cache:                  cache.Options{DefaultNamespaces: map[string]cache.Config{k.NS: {}}},
	})
	require.NoError(t, err)
	w, reg := startWatcher(k, t, false)
	e, err := kubeadapter.NewElector(k.CS.CoordinationV1(), slow(k, "mgr", w))
	require.NoError(t, err)
	terms := make(chan term, 4)
	ldr, err := leader.New(e, copyController(mgr, terms))
	require.NoError(t, err)
	require.False(t, ldr.NeedLeaderElection())
	require.NoError(t, mgr.Add(ldr))

	mctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { assert.NoError(t, mgr.Start(mctx)) })
	t.Cleanup(func() { stop(); wg.Wait() })
	next := func() term {
		t.Helper()
		select {
		case tm := <-terms:
			return tm
		case <-time.After(30 * time.Second):
			t.Fatal("no acquisition")
			return term{}
		}
	}
	waitTarget := func(n string, tok token.Token) {
		t.Helper()
		require.Eventually(t, func() bool {
			var tgt corev1.ConfigMap
			if k.CRC.Get(ctx, client.ObjectKey{Namespace: k.NS, Name: "target"}, &tgt) != nil {
				return false
			}
			got, ok, err := token.FromAnnotations(tgt.Annotations)
			return err == nil && ok && got == tok && tgt.Data["n"] == n
		}, 30*time.Second, 20*time.Millisecond, "target not written with n=%s by %v", n, tok)
	}

	first := next()
	src := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: k.NS, Name: "source"}, Data: map[string]string{"n": "1"}}
	require.NoError(t, k.CRC.Create(ctx, src))
	waitTarget("1", first.h.Token())

	// Delete the Lease: the controller's context ends at once.
	require.NoError(t, k.CS.CoordinationV1().Leases(k.NS).Delete(ctx, "fence", metav1.DeleteOptions{}))
	select {
	case <-first.ctx.Done():
	case <-time.After(3 * time.Second):
		t.Fatal("the leader-only controller was not cancelled within 3s of the delete (renewals are 20s apart)")
	}
	require.ErrorIs(t, context.Cause(first.ctx), kubeadapter.ErrLeaseDeleted)

	second := next()
	requireGreater(t, second.h.Token(), first.h.Token())
	src.Data["n"] = "2"
	require.NoError(t, k.CRC.Update(ctx, src))
	waitTarget("2", second.h.Token())

	stale := k.ConfigMap(t, "target")
	stale.Data["n"] = "stale"
	require.ErrorIs(t, k.Client(t, first.h).Update(ctx, stale.DeepCopy()), token.ErrNotHeld)
	require.ErrorIs(t, k.Client(t, staticHolder{Tok: first.h.Token()}).Update(ctx, stale.DeepCopy()), token.ErrStale)

	// Another holder takes the Lease by an update.
	leases := k.CS.CoordinationV1().Leases(k.NS)
	cur, err := leases.Get(ctx, "fence", metav1.GetOptions{})
	require.NoError(t, err)
	other, n := "other", *cur.Spec.LeaseTransitions+1
	cur.Spec.HolderIdentity, cur.Spec.LeaseTransitions = &other, &n
	_, err = leases.Update(ctx, cur, metav1.UpdateOptions{})
	require.NoError(t, err)
	select {
	case <-second.ctx.Done():
	case <-time.After(3 * time.Second):
		t.Fatal("the leader-only controller was not cancelled within 3s of the takeover")
	}
	require.ErrorIs(t, context.Cause(second.ctx), kubeadapter.ErrLeaseTaken)
	require.Equal(t, "2", k.ConfigMap(t, "target").Data["n"])
	require.GreaterOrEqual(t, histogramCount(t, reg, kubeadapter.MetricSelfFenceLatency), uint64(2))
}
