package shard

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/fencer-dev/fencer/kubeadapter"
	"github.com/fencer-dev/fencer/kubeadapter/internal/leaserecord"
	"github.com/fencer-dev/fencer/token"
)

// ViewConfig configures a View. NewView checks it with
// Validate.
type ViewConfig struct {
	// Namespace and Ring are those of the ring (Config).
	Namespace, Ring string
	// Operator is the identity (Config.Identity) of the ring member
	// the view is a delegate of.
	Operator string
	// RenewDeadline is how long after the view last saw the operator's
	// heartbeat Lease change it may still act. Use the ring's
	// RenewDeadline: the ring's LeaseDuration minus it is the margin
	// that absorbs the view's watch lag.
	RenewDeadline time.Duration
	// Watcher is the view's process's one Lease watcher. It must watch
	// Namespace.
	Watcher *kubeadapter.Watcher
	// Clock measures durations; nil means the real clock.
	Clock clock.Clock
}

// Validate reports the first invalid field as a *kubeadapter.ConfigError, or nil.
func (c ViewConfig) Validate() error {
	switch {
	case c.Namespace == "":
		return &kubeadapter.ConfigError{Field: "Namespace", Reason: "must not be empty"}
	case c.Ring == "":
		return &kubeadapter.ConfigError{Field: "Ring", Reason: "must not be empty"}
	case c.Operator == "":
		return &kubeadapter.ConfigError{Field: "Operator", Reason: "must not be empty"}
	case c.RenewDeadline <= 0:
		return &kubeadapter.ConfigError{Field: "RenewDeadline", Reason: "must be positive"}
	case c.Watcher == nil:
		return &kubeadapter.ConfigError{Field: "Watcher", Reason: "must not be nil"}
	}
	return nil
}

// View is a read-only delegate of one ring member (the operator):
// a process, such as a pod per namespace, that acts on the shards the
// operator owns without being a member itself, so that Lease writes stay
// O(members) however many delegates there are. It never writes a Lease.
//
// A delegate acts on a shard (Shard, and the Delegate's Err) only
// while the shard Lease, as its Watcher last saw it, is the assignment
// its token came from and names the operator's current incarnation, and
// it has seen the operator's heartbeat Lease change within RenewDeadline
// on its own clock. Its writes carry the shard's token, so the fenced
// client and the admission policy refuse a delegate of a former owner
// exactly as they refuse the owner.
//
// What it does not guarantee: a delegate is not drained by a handoff
// (Gate counts only the operator's own work), and two delegates of one
// operator share a token, so the store does not order their writes to
// one object against each other; run one delegate per shard (a
// StatefulSet of one per namespace) or write through the operator.
type View struct {
	cfg   ViewConfig
	clock clock.Clock
	src   ringSource
	// snap is the view's latest reading of the ring, replaced whole.
	snap    atomic.Pointer[viewSnapshot]
	started atomic.Bool

	mu        sync.Mutex
	delegates map[string]*Delegate // the live delegate of each shard, whose Context Start ends
}

// viewSnapshot is the ring as the view last read it, and when it last
// saw the operator's heartbeat change.
type viewSnapshot struct {
	v         ringView
	heartbeat *coordinationv1.Lease
	changed   time.Time
}

var _ manager.Runnable = (*View)(nil)

// NewView returns a View for cfg, or a *kubeadapter.ConfigError. It
// performs no I/O; Start runs it.
func NewView(cfg ViewConfig) (*View, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	v := &View{cfg: cfg, clock: cfg.Clock, src: cfg.Watcher}
	if v.clock == nil {
		v.clock = clock.RealClock{}
	}
	v.snap.Store(&viewSnapshot{})
	return v, nil
}

// NeedLeaderElection returns false: every delegate runs.
func (v *View) NeedLeaderElection() bool { return false }

// Start reads the ring on every change the Watcher sees, and at least
// every RenewDeadline/4, ending the Context of each delegate that may no
// longer act, until ctx is done; it then ends every delegate's Context
// (a stopped view vouches for none) and returns nil, or kubeadapter.ErrAlreadyStarted
// when called a second time. The Watcher must be running.
func (v *View) Start(ctx context.Context) error {
	if !v.started.CompareAndSwap(false, true) {
		return kubeadapter.ErrAlreadyStarted
	}
	notify, stop := v.src.Subscribe()
	defer stop()
	defer v.sweep(true)
	for {
		v.read()
		v.sweep(false)
		t := v.clock.NewTimer(v.cfg.RenewDeadline / 4)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-notify:
		case <-t.C():
		}
		t.Stop()
	}
}

// read takes a new snapshot of the ring.
func (v *View) read() {
	leases, _, synced := v.src.Labelled(v.cfg.Namespace, RingLabel, v.cfg.Ring)
	if !synced {
		return
	}
	prev := v.snap.Load()
	next := &viewSnapshot{v: newRingView(v.cfg.Ring, leases), changed: prev.changed}
	next.heartbeat = next.v.members[memberLeaseName(v.cfg.Ring, v.cfg.Operator)]
	if hb := next.heartbeat; hb != nil && (prev.heartbeat == nil || prev.heartbeat.ResourceVersion != hb.ResourceVersion) {
		next.changed = v.clock.Now()
	}
	v.snap.Store(next)
}

// acting returns the shard Lease of shard when the snapshot lets the
// delegate act on it, and why not otherwise.
func (s *viewSnapshot) acting(shard string, ring, operator string, deadline time.Duration, now time.Time) (*coordinationv1.Lease, error) {
	l := s.v.shards[shard]
	hb := s.heartbeat
	switch {
	case l == nil || hb == nil || leaserecord.Holder(&hb.Spec) == "":
		return nil, ErrNotOwner
	case !holds(l, incarnation{holder: leaserecord.Holder(&hb.Spec), lease: memberLeaseName(ring, operator)}):
		return nil, ErrNotOwner
	case now.Sub(s.changed) >= deadline:
		return nil, ErrMemberLost
	}
	return l, nil
}

// Shard returns the delegate's ownership of shard, for fenced.NewClient, or an
// error matching ErrNotOwner (or ErrMemberLost when the operator's
// heartbeat has not been seen to change within RenewDeadline) and
// token.ErrNotHeld.
func (v *View) Shard(shard string) (*Delegate, error) {
	l, err := v.snap.Load().acting(shard, v.cfg.Ring, v.cfg.Operator, v.cfg.RenewDeadline, v.clock.Now())
	if err != nil {
		return nil, fmt.Errorf("%w: shard %q of %s: %w", err, shard, v.cfg.Operator, token.ErrNotHeld)
	}
	tok, err := kubeadapter.TokenOf(l)
	if err != nil {
		return nil, err
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if d := v.delegates[shard]; d != nil && d.tok == tok && d.ctx.Err() == nil {
		return d, nil
	} else if d != nil {
		d.end(&kubeadapter.LostError{Token: d.tok, Reason: ErrMoved})
	}
	d := &Delegate{v: v, shard: shard, tok: tok, lease: l}
	d.ctx, d.cancel = context.WithCancelCause(context.Background())
	if v.delegates == nil {
		v.delegates = map[string]*Delegate{}
	}
	v.delegates[shard] = d
	return d, nil
}

// sweep ends the delegates that may no longer act, or, with all, every
// delegate, as a lost member's.
func (v *View) sweep(all bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	for shard, d := range v.delegates {
		if d.Err() == nil && !all {
			continue
		}
		d.end(&kubeadapter.LostError{Token: d.tok, Reason: ErrMemberLost})
		delete(v.delegates, shard)
	}
}

// Delegate is a delegate's use of one assignment of a shard to its
// operator. It implements kubeadapter.Holder.
type Delegate struct {
	v     *View
	shard string
	tok   token.Token
	lease *coordinationv1.Lease
	// lost is the first error Err returned; it is kept.
	lost   atomic.Pointer[kubeadapter.LostError]
	ctx    context.Context // ended with lost
	cancel context.CancelCauseFunc
}

var _ kubeadapter.Holder = (*Delegate)(nil)

// Token returns the token of the shard's assignment to the operator.
func (d *Delegate) Token() token.Token { return d.tok }

// Context returns a context that ends, with Err's error as its cause, once
// the view finds the delegate may no longer act: at once on a change its
// Watcher sees, within RenewDeadline/4 of the heartbeat's deadline, and
// when the view stops. Err is exact at the moment of the call; Context
// may end a little later than Err starts failing, never earlier.
func (d *Delegate) Context() context.Context { return d.ctx }

// end records lost, unless an earlier loss was recorded, and ends the
// delegate's Context with the recorded one.
func (d *Delegate) end(lost *kubeadapter.LostError) {
	d.lost.CompareAndSwap(nil, lost)
	d.cancel(d.lost.Load())
}

// Err returns nil while the delegate may act on the shard (see
// View), and, from the first call that finds it may not, a
// *kubeadapter.LostError matching token.ErrNotHeld and ErrMoved or
// ErrMemberLost. It reads the view's latest snapshot and clock.
func (d *Delegate) Err() error {
	if lost := d.lost.Load(); lost != nil {
		return lost
	}
	v := d.v
	l, err := v.snap.Load().acting(d.shard, v.cfg.Ring, v.cfg.Operator, v.cfg.RenewDeadline, v.clock.Now())
	var lost *kubeadapter.LostError
	switch {
	case errors.Is(err, ErrMemberLost):
		lost = &kubeadapter.LostError{Token: d.tok, Reason: ErrMemberLost}
	case err != nil || leaserecord.Compare(d.lease, l) != leaserecord.Same:
		lost = &kubeadapter.LostError{Token: d.tok, Reason: ErrMoved}
	default:
		return nil
	}
	d.end(lost)
	return d.lost.Load()
}
