package shard

import (
	"context"
	"sync"

	"github.com/go-logr/logr"

	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"
)

// Reconciler reconciles requests of shards this member owns. h is
// the ownership of the request's shard: write through fenced.NewClient(inner, h)
// so that the writes carry the shard's token.
type Reconciler[R comparable] interface {
	Reconcile(ctx context.Context, req R, h *Held) (reconcile.Result, error)
}

// ReconcilerFunc adapts a function to Reconciler.
type ReconcilerFunc[R comparable] func(ctx context.Context, req R, h *Held) (reconcile.Result, error)

// Reconcile calls f(ctx, req, h).
func (f ReconcilerFunc[R]) Reconcile(ctx context.Context, req R, h *Held) (reconcile.Result, error) {
	return f(ctx, req, h)
}

// Gate returns a reconciler that asks, for every request, whether this
// member owns the request's shard (shardOf), at dispatch, whatever source
// enqueued the request. When it does not, the request is dropped: Gate
// returns an empty Result and no error, and counts it in
// MetricDispatchSkipped. When it does, the request is registered as
// in flight on the shard's Held, so that a handoff waits for it (up
// to Config.HandoffTimeout), and r runs with a context that is also
// done when the Held ends.
//
// What it does not guarantee: a dropped request is not remembered. Add an
// AcquiredSource to the controller so that a member enqueues a shard's
// objects when it starts to own the shard; a RequeueAfter returned by a
// former owner is lost with the ownership. A reconcile that started
// before the shard moved may still be running when the handoff timeout
// passes; its writes are fenced by the store through the token.
func Gate[R comparable](s *Sharder, shardOf func(R) string, r Reconciler[R]) reconcile.TypedReconciler[R] {
	return reconcile.TypedFunc[R](func(ctx context.Context, req R) (reconcile.Result, error) {
		h, err := s.Shard(shardOf(req))
		if err != nil || !h.enter() {
			s.cfg.Metrics.skip()
			return reconcile.Result{}, nil
		}
		defer h.exit()
		rctx, cancel := context.WithCancelCause(ctx)
		defer cancel(nil)
		stop := context.AfterFunc(h.ctx, func() { cancel(context.Cause(h.ctx)) })
		defer stop()
		return r.Reconcile(rctx, req, h)
	})
}

// OwnedPredicate returns a predicate that passes only events of objects
// whose shard (shardOf) this member owns now. It saves queue work; it is
// an optimisation only, since ownership can change between the event and
// the dispatch: keep Gate, which decides.
func OwnedPredicate(s *Sharder, shardOf func(client.Object) string) predicate.Predicate {
	return predicate.NewPredicateFuncs(func(o client.Object) bool {
		_, ok := s.Owns(shardOf(o))
		return ok
	})
}

// AcquiredSource returns a source that enqueues the requests of a shard,
// as list returns them, whenever this member starts to own the shard, and
// for the shards it owns when the source starts. With Gate it recovers
// the requests dropped while another member owned the shard. list runs
// on the source's own goroutine; its errors are logged (with the
// logr.Logger of the source's context) and drop that shard's requests (the
// shard's objects' next events still reach the controller).
func AcquiredSource[R comparable](s *Sharder, list func(ctx context.Context, shard string) ([]R, error)) source.TypedSource[R] {
	return source.TypedFunc[R](func(ctx context.Context, q workqueue.TypedRateLimitingInterface[R]) error {
		var mu sync.Mutex
		pending := map[string]bool{}
		signal := make(chan struct{}, 1)
		add := func(shard string) {
			mu.Lock()
			pending[shard] = true
			mu.Unlock()
			select {
			case signal <- struct{}{}:
			default:
			}
		}
		unsubscribe := s.onAcquire(add)
		for shard := range s.owned.Load().shards {
			add(shard)
		}
		go func() {
			defer unsubscribe()
			for {
				select {
				case <-ctx.Done():
					return
				case <-signal:
				}
				mu.Lock()
				shards := pending
				pending = map[string]bool{}
				mu.Unlock()
				for shard := range shards {
					reqs, err := list(ctx, shard)
					if err != nil {
						logr.FromContextOrDiscard(ctx).Error(err, "listing an acquired shard's requests failed", "shard", shard)
						continue
					}
					for _, r := range reqs {
						q.Add(r)
					}
				}
			}
		}()
		return nil
	})
}
