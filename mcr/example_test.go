package mcr_test

import (
	"context"
	"log"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/config"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/manager/signals"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	mcbuilder "sigs.k8s.io/multicluster-runtime/pkg/builder"
	mccontroller "sigs.k8s.io/multicluster-runtime/pkg/controller"
	mcmanager "sigs.k8s.io/multicluster-runtime/pkg/manager"
	"sigs.k8s.io/multicluster-runtime/pkg/multicluster"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	"github.com/fencer-dev/fencer/kubeadapter"
	"github.com/fencer-dev/fencer/kubeadapter/fenced"
	"github.com/fencer-dev/fencer/kubeadapter/kubefencertest"
	"github.com/fencer-dev/fencer/kubeadapter/shard"
	"github.com/fencer-dev/fencer/mcr"
	"github.com/fencer-dev/fencer/token"
)

// runFencedManager runs one replica of a multicluster-runtime controller
// on fencer's Coordinator: the clusters of provider are the shards of the
// ring "clusters" in ringNS, each replica engages only the clusters it
// owns, and the controller copies each cluster's ConfigMap "app" into
// record-<cluster> in downNS on the local cluster, through the cluster's
// fencing token. docs/multicluster.md quotes it.
func runFencedManager(ctx context.Context, cfg *rest.Config, provider multicluster.Provider, ringNS, downNS, identity string) error {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	w, err := kubeadapter.NewWatcher(cs.CoordinationV1(), kubeadapter.WatchNamespaces(ringNS))
	if err != nil {
		return err
	}
	sc := shard.DefaultConfig(ringNS, "clusters", identity)
	sc.Watcher = w
	s, err := shard.NewSharder(cs.CoordinationV1(), sc)
	if err != nil {
		return err
	}
	coord, err := mcr.New(s)
	if err != nil {
		return err
	}
	m, err := mcmanager.New(cfg, provider, manager.Options{Metrics: metricsserver.Options{BindAddress: "0"}}, mcmanager.WithCoordinator(coord))
	if err != nil {
		return err
	}
	if err := m.GetLocalManager().Add(w); err != nil {
		return err
	}
	mgr := mcr.Gated(m, coord) // GetCluster refuses clusters this replica does not own
	local := mgr.GetLocalManager()
	records := mcr.Gate(coord, shard.ReconcilerFunc[mcreconcile.Request](
		func(ctx context.Context, req mcreconcile.Request, h *shard.Held) (reconcile.Result, error) {
			cl, err := mgr.GetCluster(ctx, req.ClusterName)
			if err != nil {
				return reconcile.Result{}, err
			}
			var app corev1.ConfigMap
			if err := cl.GetClient().Get(ctx, req.NamespacedName, &app); err != nil {
				return reconcile.Result{}, client.IgnoreNotFound(err)
			}
			// Downstream writes carry the cluster's token.
			down, err := fenced.NewClient(local.GetClient(), h, fenced.WithAPIReader(local.GetAPIReader()))
			if err != nil {
				return reconcile.Result{}, err
			}
			rec := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: downNS, Name: "record-" + string(req.ClusterName)}}
			err = local.GetAPIReader().Get(ctx, client.ObjectKeyFromObject(rec), rec)
			rec.Data = map[string]string{"value": app.Data["value"], "owner": identity}
			switch {
			case apierrors.IsNotFound(err):
				err = down.Create(ctx, rec)
			case err == nil:
				err = down.Update(ctx, rec)
			}
			return reconcile.Result{}, err
		}))
	err = mcbuilder.ControllerManagedBy(mgr).Named("records").For(&corev1.ConfigMap{}).
		WithOptions(mccontroller.Options{SkipNameValidation: ptr.To(true)}).
		Complete(records)
	if err != nil {
		return err
	}
	return mgr.Start(ctx)
}

// Example runs a replica of a multicluster controller on fencer's
// Coordinator (see runFencedManager): start one per pod, with the pod's
// name as identity. Any multicluster-runtime provider will do; this one
// makes clusters of namespaces.
func Example() {
	cfg := config.GetConfigOrDie()
	provider, err := newNSProvider(cfg, "team-a", "team-b", "team-c")
	if err != nil {
		log.Fatal(err)
	}
	if err := runFencedManager(signals.SetupSignalHandler(), cfg, provider, "operator-system", "records", os.Getenv("POD_NAME")); err != nil {
		log.Fatal(err)
	}
}

// TestExampleFencedManager runs two replicas of the example on the real
// API server with the admission policy: each cluster's record ends up
// written once by one replica, stamped with the token of the cluster's
// shard Lease.
func TestExampleFencedManager(t *testing.T) {
	start := time.Now()
	api := kubefencertest.APIServerForTest(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	require.NoError(t, kubefencertest.InstallPolicy(ctx, api.Admin()))
	cs, err := kubernetes.NewForConfig(api.Admin())
	require.NoError(t, err)
	teams := []string{"team-a", "team-b", "team-c"}
	for _, ns := range append([]string{"operator-system", "records"}, teams...) {
		_, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	for _, ns := range teams {
		_, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "app"}, Data: map[string]string{"value": ns + "-v1"}}, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	ids := []string{"replica-0", "replica-1"}
	errs := make(chan error, len(ids))
	for _, id := range ids {
		provider, err := newNSProvider(api.Admin(), teams...)
		require.NoError(t, err)
		go func() { errs <- runFencedManager(runCtx, api.Admin(), provider, "operator-system", "records", id) }()
	}
	defer func() {
		stop()
		for range ids {
			require.NoError(t, <-errs)
		}
	}()
	require.True(t, waitFor(60*time.Second, func() bool {
		for _, team := range teams {
			rec, err := cs.CoreV1().ConfigMaps("records").Get(ctx, "record-"+team, metav1.GetOptions{})
			if err != nil || rec.Data["value"] != team+"-v1" {
				return false
			}
			lease, err := cs.CoordinationV1().Leases("operator-system").Get(ctx, shard.LeaseName("clusters", team), metav1.GetOptions{})
			if err != nil {
				return false
			}
			want, err := kubeadapter.TokenOf(lease)
			require.NoError(t, err)
			got, stamped, err := token.FromAnnotations(rec.Annotations)
			require.NoError(t, err)
			if !stamped || got != want {
				return false
			}
		}
		return true
	}), "the records were not written with their clusters' tokens")
	t.Logf("wall time %v", time.Since(start).Round(time.Millisecond))
}
