package leader_test

import (
	"context"
	"log"
	"os"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client/config"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/manager/signals"

	"github.com/fencer-dev/fencer/kubeadapter"
	"github.com/fencer-dev/fencer/kubeadapter/fenced"
	"github.com/fencer-dev/fencer/kubeadapter/leader"
)

// ExampleLeader wires one Watcher per process, an Elector that uses it,
// and a Leader that runs leader-only work in a controller-runtime Manager
// whose own leader election is off. The work gets a context that is
// cancelled as soon as the Lease is deleted, replaced or taken, and a
// fenced client carrying the acquisition's token.
func ExampleLeader() {
	restConfig := config.GetConfigOrDie()
	cs := kubernetes.NewForConfigOrDie(restConfig)
	mgr, err := manager.New(restConfig, manager.Options{LeaderElection: false})
	if err != nil {
		log.Fatal(err)
	}
	w, err := kubeadapter.NewWatcher(cs.CoordinationV1(),
		kubeadapter.WatchNamespaces("team-a"),
		kubeadapter.WithRegisterer(prometheus.DefaultRegisterer))
	if err != nil {
		log.Fatal(err)
	}
	cfg := kubeadapter.DefaultConfig("team-a", "fence", os.Getenv("POD_NAME"))
	cfg.Watcher = w
	e, err := kubeadapter.NewElector(cs.CoordinationV1(), cfg)
	if err != nil {
		log.Fatal(err)
	}
	ldr, err := leader.New(e, leader.RunnableFunc(func(ctx context.Context, h *kubeadapter.Held) error {
		c, err := fenced.NewClient(mgr.GetClient(), h, fenced.WithAPIReader(mgr.GetAPIReader()))
		if err != nil {
			return err
		}
		// Build this acquisition's controllers on c and start them with
		// ctx (see docs/fencing.md); here the work is one fenced write.
		owned := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "owned"}}
		if err := c.Create(ctx, owned); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
		<-ctx.Done()
		return nil
	}))
	if err != nil {
		log.Fatal(err)
	}
	for _, r := range []manager.Runnable{w, ldr} {
		if err := mgr.Add(r); err != nil {
			log.Fatal(err)
		}
	}
	if err := mgr.Start(signals.SetupSignalHandler()); err != nil {
		log.Fatal(err)
	}
}
