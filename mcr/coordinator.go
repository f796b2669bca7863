package mcr

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/cluster"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	mcmanager "sigs.k8s.io/multicluster-runtime/pkg/manager"
	"sigs.k8s.io/multicluster-runtime/pkg/multicluster"

	"github.com/fencer-dev/fencer/kubeadapter"
	"github.com/fencer-dev/fencer/kubeadapter/shard"
	"github.com/fencer-dev/fencer/token"
)

// resync is how often the Coordinator checks every cluster's ownership
// besides the Sharder's acquisition events: a safety net for an event
// lost to a failed engagement, never the usual path.
const resync = time.Second

// Coordinator is a multicluster-runtime Coordinator (mcmanager.WithCoordinator)
// on a fencer shard.Sharder: every cluster a provider engages is a shard
// of the Sharder's ring, and the Coordinator engages the manager's aware
// runnables (controllers, sources) for a cluster only while this replica
// owns that shard.
//
//   - Engage tracks the cluster in the Sharder (Track) and, when the
//     provider's context ends, untracks it (Untrack) and disengages it.
//   - When this replica starts to own the cluster's shard, the
//     Coordinator engages every aware runnable with a context that ends
//     when the shard's Held ends (the shard moved, the member was lost,
//     the Sharder stopped) or the provider's context ends, whichever is
//     first. On a later acquisition it engages them again, with a new
//     context, so the controllers' sources list the cluster's objects
//     anew.
//   - Renewal is the Sharder's: one heartbeat Lease per replica, so Lease
//     writes grow with replicas, not clusters; a cluster's own Lease is
//     written only when it moves.
//
// What it guarantees: when this process learns that it lost the cluster,
// the Held ends first, from when Owns, Shard, Gate and GetCluster of a
// manager wrapped by Gated refuse the cluster, and the engagement's
// context ends right after, on a goroutine of its own.
//
// What it does not guarantee: that no two replicas run a cluster's
// runnables at the same instant. A paused or partitioned former owner
// runs them until it notices, and a reconcile that started before the
// loss may still write afterwards. Write downstream through
// fenced.NewClient with the Held the work began under (the one Gate
// passes a reconcile) so that the store refuses those writes; the
// admission policy refuses raw writes with an old stamp. A Held fetched
// later (Shard) may be a newer ownership, under which stale inputs land.
// Every replica's provider must engage the same clusters: a cluster is
// run only by its owner among the live replicas, so while that replica's
// provider has not engaged it (a replica just started, a cluster it
// cannot reach) no replica runs it. Engaging is asynchronous: Engage
// returns before the runnables are engaged; each cluster's engagement
// runs on a goroutine of its own, so an Engage that waits stalls no other
// cluster; an aware runnable that fails to engage is retried about
// every second while the cluster is owned.
type Coordinator struct {
	s *shard.Sharder

	mu       sync.Mutex
	awares   []multicluster.Aware
	clusters map[multicluster.ClusterName]*entry
	queue    workqueue.TypedRateLimitingInterface[string]
	started  atomic.Bool
}

// entry is one cluster a provider engaged.
type entry struct {
	cl  cluster.Cluster
	ctx context.Context
	// eng is the current engagement of the aware runnables, or nil.
	eng *engagement
}

// engagement is one engagement of the aware runnables for one ownership.
type engagement struct {
	h      *shard.Held
	ctx    context.Context
	cancel context.CancelCauseFunc
}

var _ mcmanager.Coordinator = (*Coordinator)(nil)

// New returns a Coordinator on s. The Coordinator's Runnable starts s:
// do not add s to the manager as well. s must not track other shards
// than the clusters the provider engages. It returns a
// *kubeadapter.ConfigError when s is nil.
func New(s *shard.Sharder) (*Coordinator, error) {
	if s == nil {
		return nil, &kubeadapter.ConfigError{Field: "Sharder", Reason: "must not be nil"}
	}
	return &Coordinator{s: s, clusters: map[multicluster.ClusterName]*entry{}}, nil
}

// AddAware registers an aware runnable, to be engaged for the clusters
// this replica owns from then on. It does not engage it for the clusters
// already engaged: the manager adds its runnables before it starts.
func (c *Coordinator) AddAware(a multicluster.Aware) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.awares = append(c.awares, a)
}

// Engage registers cluster cl under name, until ctx ends, and returns at
// once: the aware runnables are engaged for it when, and as long as, this
// replica owns it. Engaging a name again replaces its cluster and ends
// the previous engagement. It returns an error matching ErrBadCluster,
// and registers nothing, for the empty name (the local cluster, which is
// no shard) or a nil cluster, and ctx's error when ctx is done.
func (c *Coordinator) Engage(ctx context.Context, name multicluster.ClusterName, cl cluster.Cluster) error {
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
	case name.Empty():
		return fmt.Errorf("%w: the local cluster cannot be sharded", ErrBadCluster)
	case cl == nil:
		return fmt.Errorf("%w: cluster %q is nil", ErrBadCluster, name)
	}
	e := &entry{cl: cl, ctx: ctx}
	c.mu.Lock()
	if old := c.clusters[name]; old != nil && old.eng != nil {
		old.eng.cancel(errReplaced)
	}
	c.clusters[name] = e
	q := c.queue
	c.mu.Unlock()
	c.s.Track(string(name))
	context.AfterFunc(ctx, func() { c.remove(name, e) })
	if q != nil {
		q.Add(string(name))
	}
	return nil
}

// errReplaced ends an engagement whose cluster the provider replaced.
var errReplaced = errors.New("mcr: cluster replaced by the provider")

// errRemoved ends an engagement whose cluster the provider removed.
var errRemoved = errors.New("mcr: cluster removed by the provider")

// remove forgets name's entry e when the provider's context ends, unless
// the provider engaged the name again since.
func (c *Coordinator) remove(name multicluster.ClusterName, e *entry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e.eng != nil {
		e.eng.cancel(errRemoved)
	}
	if c.clusters[name] != e {
		return
	}
	delete(c.clusters, name)
	c.s.Untrack(string(name))
}

// Owns returns the token of this replica's ownership of the cluster and
// true, or false when it does not own it now. It takes no lock. The
// answer can be stale the moment it is returned: write through
// fenced.NewClient with the Held the work began under.
func (c *Coordinator) Owns(name multicluster.ClusterName) (token.Token, bool) {
	return c.s.Owns(string(name))
}

// Shard returns this replica's current ownership of the cluster, a
// kubeadapter.Holder for fenced.NewClient, so that downstream writes carry
// the cluster's token. Call it when work starts, and write with what it
// returned: after a move away and back it returns a newer ownership,
// under which inputs read earlier would land. It returns an error matching ErrNotOwner and
// token.ErrNotHeld when this replica does not own the cluster now.
func (c *Coordinator) Shard(name multicluster.ClusterName) (*shard.Held, error) {
	return c.s.Shard(string(name))
}

// Sharder returns the Sharder the Coordinator runs on.
func (c *Coordinator) Sharder() *shard.Sharder { return c.s }

// Runnable returns the runnable that runs the Sharder and engages the
// aware runnables as ownerships start; the manager adds it
// (mcmanager.WithCoordinator). It runs on every replica (it needs no
// leader election). When its context ends, the Sharder leaves the ring
// (every Held ends, so every engagement ends) and it returns once the
// Sharder has, with the Sharder's error (such as a *kubeadapter.AcquireError
// of a heartbeat the API server refuses for good), or
// kubeadapter.ErrAlreadyStarted when started a second time. The Sharder's
// Watcher must be running: add it to the manager too.
func (c *Coordinator) Runnable() manager.Runnable { return runnable{c} }

type runnable struct{ c *Coordinator }

func (r runnable) NeedLeaderElection() bool { return false }

func (r runnable) Start(ctx context.Context) error { return r.c.run(ctx) }

// run is the Runnable's Start.
func (c *Coordinator) run(ctx context.Context) error {
	if !c.started.CompareAndSwap(false, true) {
		return kubeadapter.ErrAlreadyStarted
	}
	log := logr.FromContextOrDiscard(ctx).WithName("fencer-mcr")
	q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]())
	c.mu.Lock()
	c.queue = q
	c.mu.Unlock()

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	sharderErr := make(chan error, 1)
	wg.Go(func() {
		sharderErr <- c.s.Start(ctx)
		cancel()
	})
	acquired := shard.AcquiredSource(c.s, func(_ context.Context, sh string) ([]string, error) { return []string{sh}, nil })
	if err := acquired.Start(ctx, q); err != nil {
		cancel()
		wg.Wait()
		q.ShutDown()
		return err
	}
	wg.Go(func() {
		t := time.NewTicker(resync)
		defer t.Stop()
		for {
			for _, name := range c.names() {
				q.Add(string(name))
			}
			select {
			case <-ctx.Done():
				q.ShutDown()
				return
			case <-t.C:
			}
		}
	})
	wg.Go(func() {
		for {
			name, shutdown := q.Get()
			if shutdown {
				return
			}
			if run := c.sync(log, q, multicluster.ClusterName(name)); run != nil {
				// Each engagement runs on its own goroutine, so that
				// an Engage that waits (a cache that cannot sync)
				// stalls no other cluster.
				wg.Go(run)
			}
			q.Done(name)
		}
	})
	wg.Wait()
	return <-sharderErr
}

func (c *Coordinator) names() []multicluster.ClusterName {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]multicluster.ClusterName, 0, len(c.clusters))
	for name := range c.clusters {
		out = append(out, name)
	}
	return out
}

// sync starts an engagement of the aware runnables for name if this
// replica owns it under a Held they are not engaged for yet, and returns
// the function that engages them (nil when there is nothing to do). That
// function ends the engagement and requeues name, rate-limited, when an
// aware runnable fails to engage, and forgets name's failures when all
// engaged.
func (c *Coordinator) sync(log logr.Logger, q workqueue.TypedRateLimitingInterface[string], name multicluster.ClusterName) func() {
	h, err := c.s.Shard(string(name))
	if err != nil {
		return nil // not owned: an engagement of an ended Held has ended with it
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.clusters[name]
	if e == nil || e.ctx.Err() != nil || (e.eng != nil && e.eng.h == h && e.eng.ctx.Err() == nil) {
		return nil
	}
	if e.eng != nil {
		e.eng.cancel(shard.ErrMoved)
	}
	ectx, cancel := context.WithCancelCause(e.ctx)
	stop := context.AfterFunc(h.Context(), func() { cancel(context.Cause(h.Context())) })
	context.AfterFunc(ectx, func() { stop() })
	e.eng = &engagement{h: h, ctx: ectx, cancel: cancel}
	awares, cl := slices.Clone(c.awares), e.cl
	return func() {
		log.V(1).Info("engaging", "cluster", name, "token", h.Token().String())
		for _, a := range awares {
			if err := a.Engage(ectx, name, cl); err != nil {
				cancel(err)
				log.Error(err, "engaging an owned cluster failed", "cluster", name)
				q.AddRateLimited(string(name))
				return
			}
		}
		q.Forget(string(name))
	}
}
