package kubeadapter

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	coordinationv1 "k8s.io/api/coordination/v1"

	"github.com/fencer-dev/fencer/token"
)

// ShardHeld is one member's ownership of one shard: from the write that
// named this member's incarnation on the shard Lease (or from seeing it)
// until the shard moves or the member is lost. It implements Holder, so
// NewClient, UpdateFenced and DeleteFenced stamp its token, whose Lease
// is the shard Lease: the fenced client, token.CheckStamp and the
// admission policy order a shard's writers exactly as they order the
// holders of any fence Lease.
//
// A ShardHeld ends, once and for good, when:
//   - the Sharder sees the shard Lease name another incarnation, or
//     deleted (ErrShardMoved);
//   - the Sharder starts a handoff of the shard (ErrShardMoved), before
//     it drains in-flight work and writes the new owner;
//   - the member's heartbeat Held ends (ErrMemberLost): every ShardHeld of
//     the member ends with it, at the same instant;
//   - the Sharder stops (ErrReleased).
//
// What it does not guarantee: like a Held, it ends when this process
// learns of the change, not when the change happens. Writes that were
// sent before it ended may still land; they are fenced only by the
// store, through the token.
type ShardHeld struct {
	shard string
	tok   token.Token
	// lease is the shard Lease as it was when this ownership started.
	lease  *coordinationv1.Lease
	ctx    context.Context
	cancel context.CancelCauseFunc
	// gone is set by end before the context ends; Owns reads it.
	gone atomic.Bool

	// mu guards inflight and ended; drained is closed once the ShardHeld
	// has ended and no work is in flight.
	mu       sync.Mutex
	inflight int
	ended    bool
	drained  chan struct{}
}

// newShardHeld starts an ownership of shard, whose Lease as read or
// written is lease, under the member's context.
func newShardHeld(member context.Context, shard string, lease *coordinationv1.Lease) (*ShardHeld, error) {
	tok, err := TokenOf(lease)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancelCause(member)
	h := &ShardHeld{shard: shard, tok: tok, lease: lease, ctx: ctx, cancel: cancel, drained: make(chan struct{})}
	// The member's end ends the ShardHeld's context at once (it is a
	// child); end still has to run to release the drain.
	context.AfterFunc(ctx, func() { h.end(ErrMemberLost) })
	return h, nil
}

var _ Holder = (*ShardHeld)(nil)

// Shard returns the shard's name.
func (h *ShardHeld) Shard() string { return h.shard }

// Token returns the token of this ownership: that of the shard Lease
// write that named this member's incarnation. It never changes.
func (h *ShardHeld) Token() token.Token { return h.tok }

// Context returns a context that is done when the ShardHeld ends; its
// cause is a *LostError.
func (h *ShardHeld) Context() context.Context { return h.ctx }

// Done returns a channel that is closed when the ShardHeld ends.
func (h *ShardHeld) Done() <-chan struct{} { return h.ctx.Done() }

// Err returns nil while the shard is owned and, once it is not, a
// *LostError that matches token.ErrNotHeld and the reason: ErrShardMoved,
// ErrMemberLost or ErrReleased.
func (h *ShardHeld) Err() error {
	if h.ctx.Err() == nil {
		return nil
	}
	var lost *LostError
	if cause := context.Cause(h.ctx); errors.As(cause, &lost) && lost.Token == h.tok {
		return cause
	}
	return &LostError{Token: h.tok, Reason: ErrMemberLost}
}

// end ends the ShardHeld for reason; only the first call has an effect.
func (h *ShardHeld) end(reason error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ended {
		return
	}
	h.ended = true
	h.gone.Store(true)
	h.cancel(&LostError{Token: h.tok, Reason: reason})
	if h.inflight == 0 {
		close(h.drained)
	}
}

// enter registers one unit of work on the shard, and reports false,
// registering nothing, once the ShardHeld has ended. Each true must be
// followed by one exit.
func (h *ShardHeld) enter() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ended {
		return false
	}
	h.inflight++
	return true
}

// exit ends one unit of work registered by enter.
func (h *ShardHeld) exit() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.inflight--
	if h.ended && h.inflight == 0 {
		close(h.drained)
	}
}
