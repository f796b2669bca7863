package kubeadapter

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"

	"github.com/fencer-dev/fencer/kubeadapter/internal/leaserecord"
	"github.com/fencer-dev/fencer/token"
)

// maxReleaseAttempts bounds the conflict retries of Release.
const maxReleaseAttempts = 5

// Held is one acquisition of a Lease by an Elector. While it is held, a
// goroutine renews the Lease every RetryPeriod with an Update that carries
// the last written resourceVersion as precondition.
//
// A Held ends, once and for good, when:
//   - Release is called (ErrReleased);
//   - no renewal succeeded within RenewDeadline of the start of the last
//     successful write, on the Elector's clock (ErrRenewDeadline): the
//     holder fails closed, before any other candidate may take over;
//   - the Elector's Watcher or a renewal finds that the Lease names another
//     holder or acquisition (ErrLeaseTaken), was deleted (ErrLeaseDeleted)
//     or was recreated with a new UID (ErrLeaseReplaced).
//
// With a Watcher (Config.Watcher), loss is noticed when the Lease event
// reaches the process; without one, up to about RetryPeriod after it
// happened. When the API server cannot be reached it is noticed at the
// renew deadline. A Held's end is an optimisation that stops work early;
// it is never what makes a write safe. That is the conditional write of
// the fenced client.
type Held struct {
	e        *Elector
	tok      token.Token
	ctx      context.Context
	cancel   context.CancelCauseFunc
	deadline clock.Timer
	done     chan struct{}
	ended    atomic.Bool

	// mu guards lease, the Lease as last written or adopted by this
	// acquisition, and serializes Release.
	mu    sync.Mutex
	lease *coordinationv1.Lease
	// renewMu serializes renewals (Renew), so that an out-of-turn one
	// never conflicts with the loop's.
	renewMu sync.Mutex
}

// start turns the acquiring write's result into a running Held. e.mu is
// held. writeStart is the clock reading taken just before the write was
// sent; the renew deadline runs from it.
func (e *Elector) start(ctx context.Context, got *coordinationv1.Lease, writeStart time.Time) (*Held, error) {
	tok, err := TokenOf(got)
	if err != nil {
		return nil, fmt.Errorf("kubeadapter: acquire %s: token from resourceVersion: %w", e.Lease(), err)
	}
	e.obs.observe(got, e.clock.Now())
	hctx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	h := &Held{e: e, tok: tok, ctx: hctx, cancel: cancel, done: make(chan struct{}), lease: got}
	// The callback runs under the fake clock's lock in tests, so it must
	// not read the clock; end does not.
	h.deadline = e.clock.AfterFunc(e.cfg.RenewDeadline-e.clock.Since(writeStart), func() { h.end(ErrRenewDeadline, "") })
	e.current = h
	e.metrics().acquired(e.Lease())
	if w := e.cfg.Watcher; w != nil {
		w.register(h, got)
	}
	go h.renewLoop()
	return h, nil
}

var _ Holder = (*Held)(nil)

// Holder is token.Holder, the one lease contract of fencer, which the
// fenced writes of package kubeadapter/fenced take (fenced.Holder is the
// same type). *Held and *ShardHeld implement it.
type Holder = token.Holder

// Token returns the token of this acquisition. It never changes, and it
// stays readable after the Held ended.
func (h *Held) Token() token.Token { return h.tok }

// Context returns a context that is done when the Held ends; its cause
// (context.Cause) is the *LostError that Err returns. It carries the values
// of the context given to Acquire, but not its cancellation.
func (h *Held) Context() context.Context { return h.ctx }

// Done returns a channel that is closed when the Held ends.
func (h *Held) Done() <-chan struct{} { return h.ctx.Done() }

// Err returns nil while the lease is held and, once it is not, a
// *LostError that matches token.ErrNotHeld and the reason it ended. A nil
// Err only means that this process has not yet seen the loss.
func (h *Held) Err() error {
	return token.Ended(h.ctx)
}

// end ends the Held for reason and reports whether this call did; only
// the first call has an effect. It must not read the clock (see start).
func (h *Held) end(reason error, holder string) bool {
	if !h.ended.CompareAndSwap(false, true) {
		return false
	}
	h.e.metrics().ended(h.tok.Lease, reason)
	h.cancel(&LostError{Token: h.tok, Reason: reason, Holder: holder})
	return true
}

// Release ends the Held (if it has not ended) and waits for its renewal
// loop to stop, so that work bound to Context is cancelled before the
// Lease is freed. It then writes the Lease as released, like client-go
// (no holder, leaseDurationSeconds 1), with the last known resourceVersion
// as precondition. On a conflict it re-reads the Lease and retries only
// while the record is still this acquisition's, so it never clobbers a
// newer holder.
//
// Release returns nil when the Lease was released, is gone, or already
// belongs to someone else, and the API error, wrapped, when it could not
// tell; the Lease then expires after its leaseDurationSeconds. Cancelling
// ctx aborts the write, not the ending of the Held. Release may be called
// more than once.
func (h *Held) Release(ctx context.Context) error {
	h.end(ErrReleased, "")
	<-h.done
	h.mu.Lock()
	defer h.mu.Unlock()
	leases := h.e.leases.Leases(h.e.cfg.Namespace)
	cur := h.lease
	var err error
	for range maxReleaseAttempts {
		next := cur.DeepCopy()
		next.Spec = leaserecord.Released(&cur.Spec, h.e.clock.Now())
		_, err = leases.Update(ctx, next, metav1.UpdateOptions{})
		switch {
		case err == nil:
			h.e.metrics().wrote(WriteTombstone)
			return nil
		case apierrors.IsNotFound(err):
			return nil
		case !apierrors.IsConflict(err):
			return fmt.Errorf("kubeadapter: release %s: %w", h.tok, err)
		}
		cur, err = leases.Get(ctx, h.e.cfg.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return nil
		case err != nil:
			return fmt.Errorf("kubeadapter: release %s: %w", h.tok, err)
		case lossReason(h.lease, cur) != nil:
			return nil
		}
	}
	return fmt.Errorf("kubeadapter: release %s: %d attempts: %w", h.tok, maxReleaseAttempts, err)
}

// renewLoop renews every RetryPeriod until the Held ends.
func (h *Held) renewLoop() {
	defer close(h.done)
	if w := h.e.cfg.Watcher; w != nil {
		defer w.unregister(h)
	}
	defer h.deadline.Stop()
	t := h.e.clock.NewTimer(h.e.cfg.RetryPeriod)
	defer t.Stop()
	for {
		select {
		case <-h.ctx.Done():
			return
		case <-t.C():
		}
		_ = h.Renew(h.ctx, nil)
		t.Reset(h.e.cfg.RetryPeriod)
	}
}

// Renew makes one renewal now, out of turn, with mutate (when not nil)
// applied to a copy of the last known record before the write: the
// renewal the Held's own loop makes every RetryPeriod (with a nil
// mutate), an Update that carries the last written resourceVersion as
// precondition and a fresh renewTime. Renewals of one Held are
// serialized, so Renew and the loop never conflict with each other.
//
// When the write lands, the Held adopts the written record, so later
// renewals keep what mutate set, and its renew deadline moves to
// RenewDeadline after the write's start. On a conflict it re-reads the
// Lease: a record that is still this acquisition (someone changed another
// field) is adopted and the write retried once, with mutate applied
// again; one that names another holder or acquisition, or a deleted
// Lease, ends the Held with the reason, as the Watcher would. Every write
// is counted in MetricRenewals or MetricRenewalFailures.
//
// mutate may change labels and annotations. It must not change the Spec,
// whose holderIdentity and leaseTransitions make the acquisition, nor the
// name or namespace, and must not keep the Lease it is given.
//
// Renew returns nil when the write landed; the Held's *LostError (see
// Err) when the Held had ended or the renewal found it lost; and
// otherwise the API error, wrapped, after which the Held still ends at
// its renew deadline unless a later renewal lands. Cancelling ctx aborts
// the write, not the Held.
//
// What it does not guarantee: that the record is still this
// acquisition's when Renew returns (another candidate may write next),
// nor that a nil return means anyone has seen what mutate set.
func (h *Held) Renew(ctx context.Context, mutate func(*coordinationv1.Lease)) error {
	h.renewMu.Lock()
	defer h.renewMu.Unlock()
	leases := h.e.leases.Leases(h.e.cfg.Namespace)
	var err error
	for range 2 {
		if h.ctx.Err() != nil {
			return h.Err()
		}
		h.mu.Lock()
		next := h.lease.DeepCopy()
		h.mu.Unlock()
		if mutate != nil {
			mutate(next)
		}
		start := h.e.clock.Now()
		now := metav1.NewMicroTime(start)
		next.Spec.RenewTime = &now
		var got *coordinationv1.Lease
		got, err = leases.Update(ctx, next, metav1.UpdateOptions{})
		h.e.metrics().renewal(h.tok.Lease, err == nil)
		switch {
		case err == nil:
			h.adopt(got)
			h.extend(start)
			return nil
		case apierrors.IsNotFound(err):
			h.end(ErrLeaseDeleted, "")
			return h.Err()
		case !apierrors.IsConflict(err):
			return fmt.Errorf("kubeadapter: renew %s: %w", h.tok, err)
		}
		cur, gerr := leases.Get(ctx, h.e.cfg.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(gerr):
			h.end(ErrLeaseDeleted, "")
			return h.Err()
		case gerr != nil:
			return fmt.Errorf("kubeadapter: renew %s: %w", h.tok, gerr)
		}
		if reason := lossReason(next, cur); reason != nil {
			h.end(reason, leaserecord.Holder(&cur.Spec))
			return h.Err()
		}
		h.adopt(cur)
	}
	return fmt.Errorf("kubeadapter: renew %s: %w", h.tok, err)
}

// Lease returns the Lease record as this acquisition last wrote or
// adopted it: the acquiring write's result, then each renewal's. The
// object is shared and must not be modified. It may be older than the
// record in the API server, and it stays readable after the Held ended.
func (h *Held) Lease() *coordinationv1.Lease {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lease
}

func (h *Held) adopt(l *coordinationv1.Lease) {
	h.mu.Lock()
	h.lease = l
	h.mu.Unlock()
}

// extend moves the renew deadline to RenewDeadline after writeStart, the
// start of a write that succeeded.
func (h *Held) extend(writeStart time.Time) {
	remaining := h.e.cfg.RenewDeadline - h.e.clock.Since(writeStart)
	if remaining <= 0 {
		h.end(ErrRenewDeadline, "")
		return
	}
	h.deadline.Reset(remaining)
}
