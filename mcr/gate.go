package mcr

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"sigs.k8s.io/controller-runtime/pkg/cluster"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"
	mccontext "sigs.k8s.io/multicluster-runtime/pkg/context"
	mcmanager "sigs.k8s.io/multicluster-runtime/pkg/manager"
	"sigs.k8s.io/multicluster-runtime/pkg/multicluster"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"

	"github.com/fencer-dev/fencer/kubeadapter/shard"
)

// Errors of this package. Match them with errors.Is.
var (
	// ErrNotOwner means this replica does not own the cluster now. It is
	// shard.ErrNotOwner: the errors that carry it also match
	// token.ErrNotHeld.
	ErrNotOwner = shard.ErrNotOwner
	// ErrBadCluster means a cluster name or cluster the Coordinator cannot
	// shard: the empty name of the local cluster, or a nil cluster.
	ErrBadCluster = errors.New("mcr: bad cluster")
)

// Gated returns mgr with GetCluster, GetManager and ClusterFromContext
// refusing the clusters this replica does not own according to c, which
// must be mgr's Coordinator (mcmanager.WithCoordinator(c)). The refusal
// matches ErrNotOwner and token.ErrNotHeld; for a cluster no provider
// engaged it also matches multicluster.ErrClusterNotFound. The local
// cluster (mcmanager.LocalCluster) is passed through. Every other method
// is mgr's.
//
// What it does not guarantee: the cluster returned can stop being owned
// the moment it is returned, and its client writes unfenced. Write to
// shared downstream objects through fenced.NewClient with the Held the
// work began under (the one Gate passes).
func Gated(mgr mcmanager.Manager, c *Coordinator) mcmanager.Manager {
	return &gatedManager{Manager: mgr, c: c}
}

type gatedManager struct {
	mcmanager.Manager
	c *Coordinator
}

func (m *gatedManager) GetCluster(ctx context.Context, name multicluster.ClusterName) (cluster.Cluster, error) {
	if err := m.c.check(name); err != nil {
		return nil, err
	}
	return m.Manager.GetCluster(ctx, name)
}

func (m *gatedManager) GetManager(ctx context.Context, name multicluster.ClusterName) (manager.Manager, error) {
	if err := m.c.check(name); err != nil {
		return nil, err
	}
	return m.Manager.GetManager(ctx, name)
}

func (m *gatedManager) ClusterFromContext(ctx context.Context) (cluster.Cluster, error) {
	name, ok := mccontext.ClusterFrom(ctx)
	if !ok {
		return m.Manager.ClusterFromContext(ctx)
	}
	return m.GetCluster(ctx, name)
}

// check returns nil for the local cluster and for a cluster this replica
// owns, and GetCluster's refusal otherwise.
func (c *Coordinator) check(name multicluster.ClusterName) error {
	if name == mcmanager.LocalCluster {
		return nil
	}
	c.mu.Lock()
	known := c.clusters[name] != nil
	c.mu.Unlock()
	if !known {
		return fmt.Errorf("mcr: cluster %q: %w: %w", name, multicluster.ErrClusterNotFound, ErrNotOwner)
	}
	if _, err := c.s.Shard(string(name)); err != nil {
		return fmt.Errorf("mcr: cluster %q: %w", name, err)
	}
	return nil
}

// GatedReconciler is the reconciler Gate returns.
type GatedReconciler struct {
	gate    reconcile.TypedReconciler[mcreconcile.Request]
	skipped atomic.Int64
}

// ranKey is the context key of the flag by which Gate's inner reconciler
// tells GatedReconciler that it ran.
type ranKey struct{}

// Gate returns a reconciler for mcreconcile.Request that asks, for every
// request, whether this replica owns the request's cluster, at dispatch,
// whatever source enqueued it (a per-cluster watch or a raw source on a
// shared downstream cluster). When it does not, the request is dropped:
// an empty Result, no error, and one more in Skipped (and in
// shard.MetricDispatchSkipped when the Sharder has Metrics). When it
// does, r runs with the cluster's Held, registered as in flight so that a
// handoff waits for it (shard.Config.HandoffTimeout), and with a context
// that is also done when the Held ends. Write downstream through
// fenced.NewClient(client, h). Requests of the local cluster are never
// owned and always dropped: run a controller of the local cluster apart.
//
// What it does not guarantee: a dropped request is not remembered (add
// AcquiredSource for raw sources; the per-cluster watches list the
// cluster again when the Coordinator engages it); a reconcile that
// started before the cluster moved may still write when the handoff
// timeout has passed, and the store refuses those writes only when they
// carry the token (fenced.NewClient).
func Gate(c *Coordinator, r shard.Reconciler[mcreconcile.Request]) *GatedReconciler {
	g := &GatedReconciler{}
	g.gate = shard.Gate(c.s, func(req mcreconcile.Request) string { return string(req.ClusterName) },
		shard.ReconcilerFunc[mcreconcile.Request](func(ctx context.Context, req mcreconcile.Request, h *shard.Held) (reconcile.Result, error) {
			if ran, ok := ctx.Value(ranKey{}).(*bool); ok {
				*ran = true
			}
			return r.Reconcile(ctx, req, h)
		}))
	return g
}

// Reconcile dispatches req as Gate describes.
func (g *GatedReconciler) Reconcile(ctx context.Context, req mcreconcile.Request) (reconcile.Result, error) {
	var ran bool
	res, err := g.gate.Reconcile(context.WithValue(ctx, ranKey{}, &ran), req)
	if !ran {
		g.skipped.Add(1)
	}
	return res, err
}

// Skipped returns how many requests this reconciler dropped because this
// replica did not own their cluster at dispatch.
func (g *GatedReconciler) Skipped() int64 { return g.skipped.Load() }

// AcquiredSource returns a source that enqueues a cluster's requests, as
// list returns them, whenever this replica starts to own the cluster, and
// for the clusters it owns when the source starts. With Gate it recovers
// the requests of a raw source (such as a watch of a shared downstream
// cluster) that were dropped while another replica owned the cluster.
// list runs on the source's own goroutine; its errors are logged and
// drop that cluster's requests. Add it with the controller's Watch (or
// builder.WatchesRawSource).
func AcquiredSource(c *Coordinator, list func(ctx context.Context, name multicluster.ClusterName) ([]mcreconcile.Request, error)) source.TypedSource[mcreconcile.Request] {
	return shard.AcquiredSource(c.s, func(ctx context.Context, sh string) ([]mcreconcile.Request, error) {
		return list(ctx, multicluster.ClusterName(sh))
	})
}
