package e2e_test

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
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/config"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/manager/signals"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/fencer-dev/fencer/kubeadapter"
	"github.com/fencer-dev/fencer/kubeadapter/fenced"
	"github.com/fencer-dev/fencer/kubeadapter/shard"
	"github.com/fencer-dev/fencer/token"
)

// runShardedManager is a controller-runtime manager that shards by
// namespace: every replica is a member of the ring "app" in ringNS, each
// namespace is a shard, and the controller that stamps ConfigMap "app"
// with its owner acts only on the namespaces this replica owns, writing
// through the namespace's fencing token. docs/sharding.md quotes it.
func runShardedManager(ctx context.Context, cfg *rest.Config, ringNS, identity string, namespaces []string) error {
	cs := kubernetes.NewForConfigOrDie(cfg)
	mgr, err := manager.New(cfg, manager.Options{Metrics: metricsserver.Options{BindAddress: "0"}})
	if err != nil {
		return err
	}
	w, err := kubeadapter.NewWatcher(cs.CoordinationV1(), kubeadapter.WatchNamespaces(ringNS))
	if err != nil {
		return err
	}
	sc := shard.DefaultConfig(ringNS, "app", identity)
	sc.Watcher = w
	s, err := shard.NewSharder(cs.CoordinationV1(), sc)
	if err != nil {
		return err
	}
	s.Track(namespaces...)
	gated := shard.Gate(s, func(r reconcile.Request) string { return r.Namespace },
		shard.ReconcilerFunc[reconcile.Request](func(ctx context.Context, r reconcile.Request, h *shard.Held) (reconcile.Result, error) {
			var cm corev1.ConfigMap
			if err := mgr.GetClient().Get(ctx, r.NamespacedName, &cm); err != nil || cm.Data["owner"] == identity {
				return reconcile.Result{}, client.IgnoreNotFound(err)
			}
			c, err := fenced.NewClient(mgr.GetClient(), h, fenced.WithAPIReader(mgr.GetAPIReader()))
			if err != nil {
				return reconcile.Result{}, err
			}
			cm.Data = map[string]string{"owner": identity}
			return reconcile.Result{}, c.Update(ctx, &cm)
		}))
	acquired := shard.AcquiredSource(s, func(_ context.Context, ns string) ([]reconcile.Request, error) {
		return []reconcile.Request{{NamespacedName: client.ObjectKey{Namespace: ns, Name: "app"}}}, nil
	})
	err = builder.ControllerManagedBy(mgr).Named("app").For(&corev1.ConfigMap{}).
		WatchesRawSource(acquired).
		WithOptions(controller.Options{SkipNameValidation: ptr.To(true)}).
		Complete(gated)
	if err != nil {
		return err
	}
	if err := mgr.Add(w); err != nil {
		return err
	}
	if err := mgr.Add(s); err != nil {
		return err
	}
	return mgr.Start(ctx)
}

// Example_sharder runs a replica of a namespace-sharded manager (see
// runShardedManager): start one per pod, with the pod's name as
// identity.
func Example_sharder() {
	err := runShardedManager(signals.SetupSignalHandler(), config.GetConfigOrDie(), "operator-system", os.Getenv("POD_NAME"), []string{"team-a", "team-b", "team-c"})
	if err != nil {
		log.Fatal(err)
	}
}

// TestExampleShardedManager runs two replicas of the example on the real
// API server: each namespace's ConfigMap ends up stamped by its owner
// with the namespace's shard token.
func TestExampleShardedManager(t *testing.T) {
	t.Parallel()
	k := newKube(t)
	ids := []string{"m-1", "m-2"}
	namespaces := append(k.createNamespaces(t, "a", 2, "m-1", ids...), k.createNamespaces(t, "b", 2, "m-2", ids...)...)
	for _, ns := range namespaces {
		_, err := k.cs.CoreV1().ConfigMaps(ns).Create(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "app"}}, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errs := make(chan error, len(ids))
	for _, id := range ids {
		go func() { errs <- runShardedManager(ctx, k.env.Admin(), k.ns, id, namespaces) }()
	}
	defer func() {
		cancel()
		for range ids {
			require.NoError(t, <-errs)
		}
	}()
	want := map[string]string{namespaces[0]: "m-1", namespaces[1]: "m-1", namespaces[2]: "m-2", namespaces[3]: "m-2"}
	var last map[string]string
	ok := waitFor(30*time.Second, func() bool {
		last = map[string]string{}
		for _, ns := range namespaces {
			cm, err := k.cs.CoreV1().ConfigMaps(ns).Get(context.Background(), "app", metav1.GetOptions{})
			if apierrors.IsNotFound(err) || err != nil {
				return false
			}
			last[ns] = cm.Data["owner"]
			tok, stamped, err := token.FromAnnotations(cm.Annotations)
			if err != nil || !stamped || tok.Lease != k.ns+"/"+shard.LeaseName("app", ns) || cm.Data["owner"] != want[ns] {
				return false
			}
		}
		return true
	})
	require.True(t, ok, "owners %v, want %v", last, want)
}
