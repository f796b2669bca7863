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
	if h.ctx.Err() == nil {
		return nil
	}
	return context.Cause(h.ctx)
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
		next.Spec = releasedSpec(&cur.Spec, h.e.clock.Now())
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
		h.renew()
		t.Reset(h.e.cfg.RetryPeriod)
	}
}

// renew makes one renewal: an Update with the last written resourceVersion
// as precondition. On a conflict it re-reads the Lease: a record that is
// no longer this acquisition ends the Held; one that still is (someone
// changed another field) is adopted and the renewal retried once. Other
// errors are left to the renew deadline.
func (h *Held) renew() {
	leases := h.e.leases.Leases(h.e.cfg.Namespace)
	for range 2 {
		if h.ctx.Err() != nil {
			return
		}
		h.mu.Lock()
		next := h.lease.DeepCopy()
		h.mu.Unlock()
		start := h.e.clock.Now()
		now := metav1.NewMicroTime(start)
		next.Spec.RenewTime = &now
		got, err := leases.Update(h.ctx, next, metav1.UpdateOptions{})
		h.e.metrics().renewal(h.tok.Lease, err == nil)
		switch {
		case err == nil:
			h.adopt(got)
			h.extend(start)
			return
		case apierrors.IsNotFound(err):
			h.end(ErrLeaseDeleted, "")
			return
		case !apierrors.IsConflict(err):
			return
		}
		cur, err := leases.Get(h.ctx, h.e.cfg.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			h.end(ErrLeaseDeleted, "")
			return
		case err != nil:
			return
		}
		if reason := lossReason(next, cur); reason != nil {
			h.end(reason, holderOf(&cur.Spec))
			return
		}
		h.adopt(cur)
	}
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
