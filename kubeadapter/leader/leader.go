// Package leader runs controller-runtime work under a fencer lease: a
// Leader is a manager.Runnable that acquires with a kubeadapter.Elector,
// starts its Runnables with each acquisition's Held, and stops them when
// the Held ends, so that the work's fenced writes carry the token of the
// acquisition they run under.
//
// It is apart from package kubeadapter so that election, the Held and the
// Watcher need client-go only; this package is where controller-runtime
// comes in. It imports kubeadapter's exported API only.
package leader

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/fencer-dev/fencer/kubeadapter"
)

// Runnable is leader-only work that runs under one acquisition. Start
// must return once ctx is done; it is called again, on a new acquisition,
// after every loss, so that it runs with the new token.
type Runnable interface {
	// Start runs the work while h is held. ctx is done when h ends or the
	// Leader stops. Pass h to fenced.NewClient (or fenced.UpdateFenced,
	// fenced.DeleteFenced) so that the work's writes carry h's token.
	Start(ctx context.Context, h *kubeadapter.Held) error
}

// RunnableFunc adapts a function to Runnable.
type RunnableFunc func(ctx context.Context, h *kubeadapter.Held) error

// Start calls f(ctx, h).
func (f RunnableFunc) Start(ctx context.Context, h *kubeadapter.Held) error { return f(ctx, h) }

// Leader is a controller-runtime manager.Runnable that runs leader-only
// work under a fencer lease instead of the Manager's own leader election.
// Start repeats, until its context is done:
//
//  1. acquire the Lease with the Elector (Elector.Acquire);
//  2. start every Runnable with the Held and a context that is done
//     when the Held ends (with the Elector's Watcher, as soon as the Lease
//     is deleted, replaced or taken) or the Leader stops;
//  3. when the Held ends, wait for every Runnable to return, then
//     release the Lease and acquire again, with a new, greater token.
//
// Runnables of two acquisitions never run at once in one Leader.
// Runnables that return nil early leave the Lease held until loss or
// stop. When a Runnable returns an error while the Held is still held,
// the others are cancelled, the Lease is released and Start returns the
// error, which stops the Manager; errors returned after the Held ended are
// logged and ignored.
//
// The Manager's own leader election must be off (LeaderElection: false):
// Leader runs in every replica (NeedLeaderElection is false) and elects by
// itself. Controllers that must only run under the lease are built per
// acquisition inside a Runnable (controller.NewUnmanaged with
// SkipNameValidation, since the name repeats across acquisitions), not
// added to the Manager. With the Manager's leader election on as well,
// the two elections are independent: the Manager's leader-elected
// runnables keep client-go's semantics and are not self-fenced.
//
// What is not guaranteed: a Runnable may still be running for a short
// while after its context is done; only fenced writes are safe against a
// newer holder.
type Leader struct {
	e         *kubeadapter.Elector
	runnables []Runnable
	started   atomic.Bool
}

// A Leader, and the kubeadapter.Watcher its Elector uses, are added to a
// Manager as runnables that run in every replica.
var (
	_ manager.Runnable               = (*Leader)(nil)
	_ manager.LeaderElectionRunnable = (*Leader)(nil)
	_ manager.Runnable               = (*kubeadapter.Watcher)(nil)
	_ manager.LeaderElectionRunnable = (*kubeadapter.Watcher)(nil)
)

// New returns a Leader that runs runnables under the acquisitions of e.
// It returns a *kubeadapter.ConfigError for a nil Elector or runnable, and
// performs no I/O.
func New(e *kubeadapter.Elector, runnables ...Runnable) (*Leader, error) {
	if e == nil {
		return nil, &kubeadapter.ConfigError{Field: "elector", Reason: "must not be nil"}
	}
	for _, r := range runnables {
		if r == nil {
			return nil, &kubeadapter.ConfigError{Field: "runnables", Reason: "must not contain nil"}
		}
	}
	return &Leader{e: e, runnables: runnables}, nil
}

// NeedLeaderElection returns false: a Leader runs in every replica and
// elects by itself.
func (l *Leader) NeedLeaderElection() bool { return false }

// Start runs the acquire-run-release cycle until ctx is done, then stops
// the runnables, waits for them, releases the Lease and returns nil. It
// returns the error of a runnable that failed while its lease was held,
// the *kubeadapter.AcquireError of an acquisition the API server refuses
// for good (see Elector.Acquire), and kubeadapter.ErrAlreadyStarted when
// called a second time.
func (l *Leader) Start(ctx context.Context) error {
	if !l.started.CompareAndSwap(false, true) {
		return kubeadapter.ErrAlreadyStarted
	}
	log := logr.FromContextOrDiscard(ctx).WithValues("lease", l.e.Lease())
	for {
		h, err := l.e.Acquire(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		log.Info("acquired", "token", h.Token().String())
		err = l.term(ctx, h, log)
		// Release bounds its write by the renew deadline: past it, the
		// Lease expires anyway.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.e.Config().RenewDeadline)
		if rerr := h.Release(rctx); rerr != nil {
			log.Error(rerr, "release failed; the lease will expire")
		}
		cancel()
		switch {
		case err != nil:
			return fmt.Errorf("leader: %s: %w", l.e.Lease(), err)
		case ctx.Err() != nil:
			return nil
		}
		log.Info("lost; acquiring again", "token", h.Token().String(), "reason", h.Err().Error())
	}
}

// term runs the runnables under h until h ends or ctx is done and all of
// them have returned. It returns the first error a runnable returned
// while h was held and ctx not done.
func (l *Leader) term(ctx context.Context, h *kubeadapter.Held, log logr.Logger) error {
	rctx, cancel := context.WithCancelCause(h.Context())
	defer cancel(nil)
	stop := context.AfterFunc(ctx, func() { cancel(context.Cause(ctx)) })
	defer stop()
	errs := make(chan error, len(l.runnables))
	for _, r := range l.runnables {
		go func() { errs <- r.Start(rctx, h) }()
	}
	var failed error
	for range l.runnables {
		err := <-errs
		switch {
		case err == nil:
		case rctx.Err() == nil:
			failed = err
			cancel(err)
		case !errors.Is(err, context.Canceled):
			log.Error(err, "runnable failed after the lease ended")
		}
	}
	if failed != nil {
		return failed
	}
	<-rctx.Done()
	return nil
}
