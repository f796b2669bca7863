package shard

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	coordinationv1 "k8s.io/api/coordination/v1"

	"github.com/fencer-dev/fencer/kubeadapter"
	"github.com/fencer-dev/fencer/token"
)

// Held is one member's ownership of one shard: from the write that
// named this member's incarnation on the shard Lease (or from seeing it)
// until the shard moves or the member is lost. It implements kubeadapter.Holder, so
// fenced.NewClient, fenced.UpdateFenced and fenced.DeleteFenced stamp its token, whose Lease
// is the shard Lease: the fenced client, token.CheckStamp and the
// admission policy order a shard's writers exactly as they order the
// holders of any fence Lease.
//
// A Held ends, once and for good, when:
//   - the Sharder sees the shard Lease name another incarnation, or
//     deleted (ErrMoved);
//   - the Sharder starts a handoff of the shard (ErrMoved), before
//     it drains in-flight work and writes the new owner;
//   - the member's heartbeat kubeadapter.Held ends (ErrMemberLost): every Held of
//     the member ends with it, at the same instant;
//   - the Sharder stops (kubeadapter.ErrReleased).
//
// What it does not guarantee: like a kubeadapter.Held, it ends when this process
// learns of the change, not when the change happens. Writes that were
// sent before it ended may still land; they are fenced only by the
// store, through the token.
type Held struct {
	shard string
	tok   token.Token
	// lease is the shard Lease as it was when this ownership started.
	lease  *coordinationv1.Lease
	ctx    context.Context
	cancel context.CancelCauseFunc
	// gone is set by end before the context ends; Owns reads it.
	gone atomic.Bool

	// mu guards inflight and ended; drained is closed once the Held
	// has ended and no work is in flight.
	mu       sync.Mutex
	inflight int
	ended    bool
	drained  chan struct{}
}

// newHeld starts an ownership of shard, whose Lease as read or
// written is lease, under the member's context.
func newHeld(member context.Context, shard string, lease *coordinationv1.Lease) (*Held, error) {
	tok, err := kubeadapter.TokenOf(lease)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancelCause(member)
	h := &Held{shard: shard, tok: tok, lease: lease, ctx: ctx, cancel: cancel, drained: make(chan struct{})}
	// The member's end ends the Held's context at once (it is a
	// child); end still has to run to release the drain.
	context.AfterFunc(ctx, func() { h.end(ErrMemberLost) })
	return h, nil
}

var _ kubeadapter.Holder = (*Held)(nil)

// Shard returns the shard's name.
func (h *Held) Shard() string { return h.shard }

// Token returns the token of this ownership: that of the shard Lease
// write that named this member's incarnation. It never changes.
func (h *Held) Token() token.Token { return h.tok }

// Context returns a context that is done when the Held ends; its
// cause is a *kubeadapter.LostError.
func (h *Held) Context() context.Context { return h.ctx }

// Done returns a channel that is closed when the Held ends.
func (h *Held) Done() <-chan struct{} { return h.ctx.Done() }

// Err returns nil while the shard is owned and, once it is not, a
// *kubeadapter.LostError that matches token.ErrNotHeld and the reason: ErrMoved,
// ErrMemberLost or kubeadapter.ErrReleased.
func (h *Held) Err() error {
	cause := token.Ended(h.ctx)
	var lost *kubeadapter.LostError
	if cause == nil || errors.As(cause, &lost) && lost.Token == h.tok {
		return cause
	}
	return &kubeadapter.LostError{Token: h.tok, Reason: ErrMemberLost}
}

// end ends the Held for reason; only the first call has an effect.
func (h *Held) end(reason error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ended {
		return
	}
	h.ended = true
	h.gone.Store(true)
	h.cancel(&kubeadapter.LostError{Token: h.tok, Reason: reason})
	if h.inflight == 0 {
		close(h.drained)
	}
}

// enter registers one unit of work on the shard, and reports false,
// registering nothing, once the Held has ended. Each true must be
// followed by one exit.
func (h *Held) enter() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ended {
		return false
	}
	h.inflight++
	return true
}

// exit ends one unit of work registered by enter.
func (h *Held) exit() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.inflight--
	if h.ended && h.inflight == 0 {
		close(h.drained)
	}
}
