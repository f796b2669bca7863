package shard

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/time/rate"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/fencer-dev/fencer/internal/mutant"
	"github.com/fencer-dev/fencer/kubeadapter"
	"github.com/fencer-dev/fencer/kubeadapter/internal/leaserecord"
	"github.com/fencer-dev/fencer/token"
)

// Config configures a Sharder. NewSharder checks it with Validate;
// DefaultConfig fills the durations.
type Config struct {
	// Namespace holds the ring's Leases: one heartbeat Lease per member
	// and one Lease per shard.
	Namespace string
	// Ring names the set of members that share the shards. It prefixes
	// every Lease name of the ring and is the value of RingLabel.
	Ring string
	// Identity is the member's stable name, such as a StatefulSet pod
	// name: shards are assigned by rendezvous hashing over the identities
	// of live members, so a member restarted under the same identity
	// gets the same shards back. Each run of a Sharder is a new
	// incarnation (Identity plus a nonce), so a restarted member never
	// inherits the ownerships of its previous run.
	Identity string
	// LeaseDuration, RenewDeadline and RetryPeriod are those of the
	// member's heartbeat Lease (see kubeadapter.Config): it is renewed every
	// RetryPeriod, its kubeadapter.Held fails closed at RenewDeadline, and the other
	// members declare it dead once they have seen it unchanged for
	// LeaseDuration on their own clocks. RetryPeriod also bounds how long
	// the Sharder waits between two passes over the ring.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// HandoffTimeout bounds the wait for in-flight work on a shard
	// (registered by Gate) to finish before the handoff write that names
	// the new owner. When it passes the write is made anyway and counted
	// in MetricHandoffForced; the new owner's writes are still
	// fenced against the old owner's.
	HandoffTimeout time.Duration
	// Weight scales this member's expected share of shards (rendezvous
	// weight); 0 means 1. It is written on the heartbeat Lease
	// (WeightLabel), so every member sees it.
	Weight uint32
	// MovesPerSecond limits the shard Lease writes of this member that
	// move shards (creates, takeovers, handoffs, releases). Creates and
	// takeovers of orphaned shards are made before handoffs.
	MovesPerSecond float64
	// Watcher is the process's one Lease watcher. It must watch
	// Namespace. The Sharder reads the ring's Leases from it (Labelled,
	// Subscribe), its heartbeat Elector is configured with it, and its
	// Lease writes are counted in the Watcher's metrics
	// (RecordLeaseWrite).
	Watcher *kubeadapter.Watcher
	// Metrics, when not nil, records this package's Metric constants
	// (NewMetrics); several Sharders may share them. Nil records none.
	Metrics *Metrics
	// Clock measures durations; nil means the real clock.
	Clock clock.WithDelayedExecution
}

// DefaultConfig returns a Config for the ring in namespace and
// the member identity, with client-go's durations for the heartbeat (15s,
// 10s, 2s), a HandoffTimeout of 10s and 20 moves per second, the default
// client QPS of controller-runtime. The caller sets Watcher.
func DefaultConfig(namespace, ring, identity string) Config {
	return Config{
		Namespace: namespace, Ring: ring, Identity: identity,
		LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: 2 * time.Second,
		HandoffTimeout: 10 * time.Second,
		MovesPerSecond: 20,
	}
}

// maxRingLen keeps shard Lease names (ring, "-s-", 16 hex digits) short.
const maxRingLen = 40

// Validate reports the first invalid field as a *kubeadapter.ConfigError, or nil: the
// rules of kubeadapter.Config.Validate for the heartbeat, a Ring that is a DNS-1123
// label of at most 40 characters, a required Watcher, and positive
// HandoffTimeout and MovesPerSecond.
func (c Config) Validate() error {
	switch {
	case len(validation.IsDNS1123Label(c.Ring)) > 0:
		return &kubeadapter.ConfigError{Field: "Ring", Reason: "must be a DNS-1123 label: " + strings.Join(validation.IsDNS1123Label(c.Ring), "; ")}
	case len(c.Ring) > maxRingLen:
		return &kubeadapter.ConfigError{Field: "Ring", Reason: fmt.Sprintf("must be at most %d characters", maxRingLen)}
	case c.Identity == "":
		return &kubeadapter.ConfigError{Field: "Identity", Reason: "must not be empty"}
	case len(validation.IsDNS1123Subdomain(memberLeaseName(c.Ring, c.Identity))) > 0:
		return &kubeadapter.ConfigError{Field: "Identity", Reason: "must make a DNS-1123 subdomain of the heartbeat Lease name " + memberLeaseName(c.Ring, c.Identity)}
	case c.Watcher == nil:
		return &kubeadapter.ConfigError{Field: "Watcher", Reason: "must not be nil"}
	case c.HandoffTimeout <= 0:
		return &kubeadapter.ConfigError{Field: "HandoffTimeout", Reason: "must be positive"}
	case !(c.MovesPerSecond > 0):
		return &kubeadapter.ConfigError{Field: "MovesPerSecond", Reason: "must be positive"}
	}
	return c.heartbeat().Validate()
}

// heartbeat is the kubeadapter.Config of the member's heartbeat kubeadapter.Elector.
func (c Config) heartbeat() kubeadapter.Config {
	return kubeadapter.Config{
		Namespace: c.Namespace, Name: memberLeaseName(c.Ring, c.Identity), Identity: c.Identity,
		LeaseDuration: c.LeaseDuration, RenewDeadline: c.RenewDeadline, RetryPeriod: c.RetryPeriod,
		Clock: c.Clock, Watcher: c.Watcher, Labels: c.memberLabels(),
	}
}

// memberLabels are the labels of the member's heartbeat Lease.
func (c Config) memberLabels() map[string]string {
	l := ringLabels(c.Ring, RoleMember)
	l[WeightLabel] = strconv.FormatUint(uint64(max(c.Weight, 1)), 10)
	return l
}

// ringSource is where a Sharder reads its ring: the Watcher.
type ringSource interface {
	Labelled(namespace, key, value string) ([]*coordinationv1.Lease, int64, bool)
	Subscribe() (<-chan struct{}, func())
}

// Sharder is one member of a ring of processes that share shards (projects,
// clusters, namespaces): each shard is owned by at most one live member at
// a time, chosen by rendezvous hashing over the live members' identities,
// and each ownership has a fencing token. It is a controller-runtime
// manager.Runnable that runs in every replica.
//
// Records, all coordination.k8s.io/v1 Leases in Config.Namespace:
//   - one heartbeat Lease per member, <ring>-m-<identity>, acquired and
//     renewed every RetryPeriod by an ordinary kubeadapter.Elector and kubeadapter.Held: the only
//     Lease writes of a steady ring, so renewal writes grow with members,
//     not shards;
//   - one Lease per shard, LeaseName(ring, shard), whose
//     holderIdentity names the owning incarnation and MemberAnnotation
//     its heartbeat Lease. It is written only when the shard is created,
//     handed off, released or taken over, always conditional on the
//     resourceVersion last seen, and each such write counts a new epoch
//     in leaseTransitions. A shard's token is kubeadapter.TokenOf that write, so the
//     fenced client, token.CheckStamp and the admission policy fence a
//     shard's writers unchanged.
//
// Transitions:
//   - a tracked shard without a Lease is created by its rendezvous owner;
//   - a shard whose owner should be another live member is handed off by
//     its holder: the Held ends first (Gate admits nothing new),
//     in-flight work drains (at most HandoffTimeout), then one
//     conditional write names the new owner, who starts when it sees the
//     write. Each shard of a pass's moves ends right before its own
//     write (up to 16 at once), not all at the start of the pass, so a
//     shard is ownerless only through its own drain and write;
//   - a member whose heartbeat Lease another member has seen unchanged
//     (same resourceVersion) for the Lease's leaseDurationSeconds on its
//     own clock is dead: that member writes a tombstone (released
//     record) conditional on exactly the resourceVersion it saw, so a
//     member that renewed in between is not declared dead, and the dead
//     member's next renewal conflicts, ending its kubeadapter.Held and all its
//     shard Helds. No timestamp in any record is read;
//   - a shard whose Lease names no live incarnation (orphaned: a released
//     heartbeat, a missing one, or one naming a newer incarnation) is
//     taken over by its rendezvous owner with a conditional write;
//   - on Stop, a member marks its heartbeat as leaving
//     (LeavingAnnotation, in a renewal), so that no one assigns it
//     shards any more, then for each shard ends its Held, drains it
//     (at most HandoffTimeout after the mark) and hands the shard off
//     with one conditional write naming its rendezvous owner among the
//     others, up to 16 shards at once, and releases its
//     heartbeat; a shard it did not hand off is orphaned by the release
//     and taken over by a survivor.
//
// What it guarantees: at any resourceVersion a shard Lease names one
// incarnation; a member acts on a shard (Owns, Shard, Gate) only while its
// heartbeat kubeadapter.Held has not ended, the last heartbeat record it knows names
// its incarnation, and the last shard record it knows names it; and
// every assignment's token is greater than the previous one's. What it
// does not guarantee: that two members never believe they own a shard at
// the same instant. A paused or partitioned former owner still believes
// it until it notices; its writes are then refused by the store through
// the token (the fenced client and the admission policy), per object, as
// for any kubeadapter.Held. Liveness (how fast a dead member's shards move) assumes
// that clocks run at about the same rate; safety does not.
type Sharder struct {
	leases  coordinationv1client.LeasesGetter
	cfg     Config
	clock   clock.WithDelayedExecution
	src     ringSource
	limiter *rate.Limiter
	started atomic.Bool
	wake    chan struct{}

	// owned is the immutable set of current ownerships, replaced whole by
	// the loop goroutine; Owns and Shard read it without a lock. A shard
	// leaves it, or its Held is marked gone (which Owns reads),
	// before its Held ends; an ended one leaves it at the next pass.
	owned atomic.Pointer[ownership]

	// mu guards tracked, member and subs.
	mu      sync.Mutex
	tracked map[string]bool
	member  *kubeadapter.Held
	subs    map[*func(string)]bool

	// Owned by the loop goroutine (Start):
	// elector is the current incarnation's kubeadapter.Elector.
	elector *kubeadapter.Elector
	// seen is, by heartbeat Lease name, the resourceVersion last seen and
	// when, on this member's clock, it was first seen.
	seen map[string]seenAt
	// written is, by Lease name, the result of this member's last write
	// of a ring Lease not yet seen through the Watcher.
	written map[string]*coordinationv1.Lease
}

// ownership is what Owns reads: the member's heartbeat context and the
// shards it owns under it. Tokens are stored by value so that Owns reads
// one map entry and one shared context.
type ownership struct {
	member context.Context
	shards map[string]ownedShard
}

type ownedShard struct {
	tok token.Token
	h   *Held
}

type seenAt struct {
	rv string
	at time.Time
}

var (
	_ manager.Runnable               = (*Sharder)(nil)
	_ manager.LeaderElectionRunnable = (*Sharder)(nil)
)

// NewSharder returns a Sharder for cfg that writes Leases through leases
// (for a clientset, clientset.CoordinationV1()). It returns a
// *kubeadapter.ConfigError when cfg is invalid and performs no I/O; Start runs it.
func NewSharder(leases coordinationv1client.LeasesGetter, cfg Config) (*Sharder, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return newSharder(leases, cfg, cfg.Watcher)
}

func newSharder(leases coordinationv1client.LeasesGetter, cfg Config, src ringSource) (*Sharder, error) {
	if leases == nil {
		return nil, &kubeadapter.ConfigError{Field: "leases", Reason: "must not be nil"}
	}
	s := &Sharder{
		leases:  leases,
		cfg:     cfg,
		clock:   cfg.Clock,
		src:     src,
		limiter: rate.NewLimiter(rate.Limit(cfg.MovesPerSecond), max(1, int(cfg.MovesPerSecond))),
		wake:    make(chan struct{}, 1),
		tracked: map[string]bool{},
		subs:    map[*func(string)]bool{},
		seen:    map[string]seenAt{},
		written: map[string]*coordinationv1.Lease{},
	}
	if s.clock == nil {
		s.clock = clock.RealClock{}
	}
	s.publish(nil)
	return s, nil
}

// NeedLeaderElection returns false: every replica is a member.
func (s *Sharder) NeedLeaderElection() bool { return false }

// Track adds shards to the set this member shares with the others. Every
// member should track the same set; a shard is owned only by a member
// that tracks it.
func (s *Sharder) Track(shards ...string) {
	s.mu.Lock()
	for _, sh := range shards {
		s.tracked[sh] = true
	}
	s.mu.Unlock()
	s.poke()
}

// Untrack removes shards from the set this member tracks. A shard it owns
// is released: its Held ends, in-flight work drains, and a
// conditional write leaves the shard Lease without holder, for a member
// that tracks it to take over.
func (s *Sharder) Untrack(shards ...string) {
	s.mu.Lock()
	for _, sh := range shards {
		delete(s.tracked, sh)
	}
	s.mu.Unlock()
	s.poke()
}

func (s *Sharder) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Owns returns the token of this member's ownership of shard and true, or
// false when it does not own it now. It takes no lock. The answer can be
// stale the moment it is returned; write through fenced.NewClient with the
// Held (Shard) so that the store refuses writes of a former owner.
func (s *Sharder) Owns(shard string) (token.Token, bool) {
	o := s.owned.Load()
	if o.member == nil || o.member.Err() != nil {
		return token.Token{}, false
	}
	e, ok := o.shards[shard]
	if !ok || e.h.gone.Load() {
		return token.Token{}, false
	}
	return e.tok, true
}

// Shard returns this member's ownership of shard, for fenced.NewClient. It
// returns an error matching ErrNotOwner and token.ErrNotHeld when the
// member does not own the shard now.
func (s *Sharder) Shard(shard string) (*Held, error) {
	h := s.owned.Load().shards[shard].h
	if h == nil || h.ctx.Err() != nil {
		return nil, fmt.Errorf("%w: shard %q: %w", ErrNotOwner, shard, token.ErrNotHeld)
	}
	return h, nil
}

// Member returns the current heartbeat kubeadapter.Held, or nil before the first
// acquisition.
func (s *Sharder) Member() *kubeadapter.Held {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.member
}

// onAcquire calls fn, from the Sharder's goroutine, with every shard this
// member starts to own, until the returned function is called. fn must
// not block.
func (s *Sharder) onAcquire(fn func(string)) func() {
	p := &fn
	s.mu.Lock()
	s.subs[p] = true
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		delete(s.subs, p)
		s.mu.Unlock()
	}
}

// Start runs the member until ctx is done: it acquires the heartbeat
// Lease (as a new incarnation after every loss), and makes a pass over the
// ring on every change the Watcher sees and at least every RetryPeriod.
// When ctx is done it leaves (ends and drains each Held and hands its
// shard off, releases the heartbeat; see leave) and returns nil. It returns the *kubeadapter.AcquireError of a heartbeat
// the API server refuses for good, and kubeadapter.ErrAlreadyStarted when called a
// second time. The Watcher must be running.
func (s *Sharder) Start(ctx context.Context) error {
	if !s.started.CompareAndSwap(false, true) {
		return kubeadapter.ErrAlreadyStarted
	}
	log := logr.FromContextOrDiscard(ctx).WithValues("ring", s.cfg.Ring, "member", s.cfg.Identity)
	ctx = logr.NewContext(ctx, log)
	notify, stop := s.src.Subscribe()
	defer stop()
	for {
		member, err := s.join(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		log.Info("joined", "incarnation", s.elector.Identity())
		s.serve(ctx, member, notify)
		if ctx.Err() != nil {
			s.leave(ctx, member)
			return nil
		}
		log.Info("member lost; joining again", "reason", member.Err().Error())
		s.lost(ctx, member)
	}
}

// join acquires the heartbeat Lease as a new incarnation.
func (s *Sharder) join(ctx context.Context) (*kubeadapter.Held, error) {
	e, err := kubeadapter.NewElector(s.leases, s.cfg.heartbeat())
	if err != nil {
		return nil, err
	}
	h, err := e.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	s.elector = e
	s.mu.Lock()
	s.member = h
	s.mu.Unlock()
	return h, nil
}

// minPassInterval bounds how often Watcher events start a pass: a pass
// is O(shards), and a burst of shard Lease writes (a rebalance) is one
// event each.
func (s *Sharder) minPassInterval() time.Duration {
	return min(s.cfg.RetryPeriod/8, 100*time.Millisecond)
}

// serve makes passes over the ring until member ends or ctx is done.
func (s *Sharder) serve(ctx context.Context, member *kubeadapter.Held, notify <-chan struct{}) {
	for {
		wait := s.step(ctx, member)
		t := s.clock.NewTimer(wait)
		select {
		case <-ctx.Done():
		case <-member.Done():
		case <-notify:
		case <-s.wake:
		case <-t.C():
		}
		t.Stop()
		if ctx.Err() != nil || member.Err() != nil {
			return
		}
		// Let a burst of events coalesce into one pass.
		pause := s.clock.NewTimer(s.minPassInterval())
		select {
		case <-ctx.Done():
		case <-member.Done():
		case <-pause.C():
		}
		pause.Stop()
		if ctx.Err() != nil || member.Err() != nil {
			return
		}
	}
}

// lost ends every ownership after member ended, and releases the
// heartbeat if the record is still member's, so that its shards are
// orphaned at once.
func (s *Sharder) lost(ctx context.Context, member *kubeadapter.Held) {
	s.endAll(ErrMemberLost)
	rctx, cancel := context.WithTimeout(ctx, s.cfg.RenewDeadline)
	defer cancel()
	if err := member.Release(rctx); err != nil {
		logr.FromContextOrDiscard(ctx).Error(err, "release of lost heartbeat failed")
	}
}

// leave hands the member's shards to the other live members and then
// releases the heartbeat. It marks the heartbeat as leaving (one
// renewal carrying LeavingAnnotation), so that no other member assigns
// it shards any more; then, for each shard, within the rate limit, ends
// its ownership, drains its work (until HandoffTimeout after the mark at
// most) and makes one conditional write naming its rendezvous owner among
// the other live members, up to maxMovesInFlight shards at once, so that
// a shard waits for its new owner only through its own handoff. Writes
// stop HandoffTimeout after the drains' deadline. Every ownership left is
// then ended and drained, and the heartbeat released: shards it could not
// hand off (no other live member, a conflict, the time spent) are
// orphaned by the release, and the survivors take them over.
func (s *Sharder) leave(ctx context.Context, member *kubeadapter.Held) {
	log := logr.FromContextOrDiscard(ctx)
	ctx = context.WithoutCancel(ctx)
	marked := s.markLeaving(ctx, member)
	drainBy := s.clock.Now().Add(s.cfg.HandoffTimeout)
	if marked {
		s.handOffAll(ctx, member, drainBy)
	}
	owned := s.helds()
	s.publish(nil)
	for _, h := range owned {
		h.end(kubeadapter.ErrReleased)
	}
	for _, sh := range slices.Sorted(maps.Keys(owned)) {
		s.drain(ctx, owned[sh], drainBy)
	}
	rctx, cancel := context.WithTimeout(ctx, s.cfg.RenewDeadline)
	defer cancel()
	if err := member.Release(rctx); err != nil {
		log.Error(err, "release of heartbeat failed; the other members take its shards after its lease duration")
	}
}

// markLeaving renews the heartbeat with LeavingAnnotation set (kubeadapter.Held.Renew)
// and reports whether the write landed. The mark names the incarnation
// the record holds, so a later incarnation that inherits it is not
// leaving.
func (s *Sharder) markLeaving(ctx context.Context, member *kubeadapter.Held) bool {
	return member.Renew(ctx, func(next *coordinationv1.Lease) {
		if next.Annotations == nil {
			next.Annotations = map[string]string{}
		}
		next.Annotations[LeavingAnnotation] = leaserecord.Holder(&next.Spec)
	}) == nil
}

// handOffAll writes the handoff of every shard the ring shows this member
// holding to its rendezvous owner among the other live members, and the
// release of those it no longer tracks, within the rate limit and
// HandoffTimeout after drainBy. Each shard's ownership ends right before
// its write, and its work drains until drainBy at most.
func (s *Sharder) handOffAll(ctx context.Context, member *kubeadapter.Held, drainBy time.Time) {
	leases, progress, synced := s.src.Labelled(s.cfg.Namespace, RingLabel, s.cfg.Ring)
	if !synced {
		return
	}
	me := s.me()
	v := s.view(leases, progress, member)
	live, _ := s.observe(v, s.clock.Now(), me)
	if len(live) < 2 {
		return
	}
	// live[0] is me: with it left out, every shard I hold has another
	// owner.
	batch := plan(v, s.trackedShards(), live[1:], me)
	deadline := drainBy.Add(s.cfg.HandoffTimeout)
	for len(batch) > 0 {
		n, wait := s.admit(batch)
		if n == 0 {
			if s.clock.Now().Add(wait).After(deadline) {
				return
			}
			t := s.clock.NewTimer(wait)
			<-t.C()
			continue
		}
		for i, got := range s.writeMoves(ctx, batch[:n], func(mv move) { s.yieldShard(ctx, mv.shard, kubeadapter.ErrReleased, drainBy) }) {
			if got != nil {
				s.moved(batch[i].kind)
			}
		}
		batch = batch[n:]
	}
}

func (s *Sharder) endAll(reason error) {
	owned := s.helds()
	s.publish(nil)
	for _, h := range owned {
		h.end(reason)
	}
}

// helds returns the current ownerships by shard.
func (s *Sharder) helds() map[string]*Held {
	o := s.owned.Load()
	out := make(map[string]*Held, len(o.shards))
	for sh, e := range o.shards {
		out[sh] = e.h
	}
	return out
}

// publish replaces the set of ownerships with owned, under the current
// heartbeat.
func (s *Sharder) publish(owned map[string]*Held) {
	o := &ownership{shards: make(map[string]ownedShard, len(owned))}
	if m := s.Member(); m != nil {
		o.member = m.Context()
	}
	for sh, h := range owned {
		o.shards[sh] = ownedShard{tok: h.tok, h: h}
	}
	s.owned.Store(o)
	s.cfg.Metrics.setOwned(s.cfg.Ring, len(owned))
}

// moved counts one shard move of kind, in MetricMoves and, as a
// WriteAssign, in the Watcher's kubeadapter.MetricLeaseWrites.
func (s *Sharder) moved(kind string) {
	s.cfg.Metrics.moved(kind)
	s.wrote(kubeadapter.WriteAssign)
}

// wrote counts one accepted Lease write of kind in the Watcher's
// kubeadapter.MetricLeaseWrites.
func (s *Sharder) wrote(kind string) {
	if s.cfg.Watcher != nil {
		s.cfg.Watcher.RecordLeaseWrite(kind)
	}
}

// me is this incarnation as the planner sees it.
func (s *Sharder) me() incarnation {
	return incarnation{identity: s.cfg.Identity, holder: s.elector.Identity(), lease: memberLeaseName(s.cfg.Ring, s.cfg.Identity), weight: float64(max(s.cfg.Weight, 1))}
}

func (s *Sharder) trackedShards() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Sorted(maps.Keys(s.tracked))
}

// step makes one pass over the ring while member is held and returns how
// long to wait at most before the next: it records what it sees of the
// heartbeats, ends and starts ownerships, tombstones dead members and
// makes the moves of plan that the rate limit allows.
func (s *Sharder) step(ctx context.Context, member *kubeadapter.Held) time.Duration {
	wait := s.cfg.RetryPeriod
	leases, progress, synced := s.src.Labelled(s.cfg.Namespace, RingLabel, s.cfg.Ring)
	if !synced || member.Err() != nil {
		return wait
	}
	me := s.me()
	v := s.view(leases, progress, member)
	if hb := v.members[me.lease]; hb == nil || leaserecord.Holder(&hb.Spec) != me.holder {
		// The newest heartbeat record this member knows names another
		// incarnation (a restart under the same identity, a tombstone)
		// or is gone: it is lost, even if its kubeadapter.Held has not noticed yet.
		s.endAll(ErrMemberLost)
		return wait
	}
	now := s.clock.Now()
	live, dead := s.observe(v, now, me)
	s.adopt(v, member, me)
	if len(dead) > 0 {
		for _, m := range dead {
			s.tombstone(ctx, m)
		}
		v = s.view(leases, progress, member)
		live, _ = s.observe(v, now, me)
	}
	planned := plan(v, s.trackedShards(), live, me)
	n, delay := s.admit(planned)
	if n < len(planned) {
		wait = min(wait, delay)
	}
	batch := planned[:n]
	for i, got := range s.writeMoves(ctx, batch, func(mv move) {
		reason := ErrMoved
		if mv.kind == MoveRelease {
			reason = kubeadapter.ErrReleased
		}
		s.yieldShard(ctx, mv.shard, reason, s.clock.Now().Add(s.cfg.HandoffTimeout))
	}) {
		if got != nil {
			s.moved(batch[i].kind)
			s.written[got.Name] = got
		}
	}
	s.adopt(s.view(leases, progress, member), member, me)
	return wait
}

// admit returns how many of the first moves the rate limit lets this
// member make now, taking their tokens, and, when it stops one, how long
// until it would let it through.
func (s *Sharder) admit(moves []move) (int, time.Duration) {
	for i := range moves {
		now := s.clock.Now()
		if !s.limiter.AllowN(now, 1) {
			r := s.limiter.ReserveN(now, 1)
			defer r.CancelAt(now)
			return i, max(r.DelayFrom(now), time.Millisecond)
		}
	}
	return len(moves), 0
}

// maxMovesInFlight bounds the shard Lease writes a pass sends at once.
const maxMovesInFlight = 16

// yieldShard ends this member's ownership of shard, if it has one, with
// reason, and waits until its in-flight work has drained or deadline has
// passed. It does not republish the ownerships, which would copy them all
// for every move: Owns reads the Held's end, and the pass's last
// adopt drops it.
func (s *Sharder) yieldShard(ctx context.Context, shard string, reason error, deadline time.Time) {
	h := s.owned.Load().shards[shard].h
	if h == nil {
		return
	}
	h.end(reason)
	s.drain(ctx, h, deadline)
}

// writeMoves makes the writes of batch, up to maxMovesInFlight at once,
// and returns the Lease each write returned (nil when it failed), in
// batch's order. Writes are independent: each is one shard's Lease.
// Right before the write of a handoff or a release it calls yield with
// the move, to end and drain this member's ownership of the shard, so a
// shard waits for its new owner only through its own drain and write,
// not through the whole batch's.
func (s *Sharder) writeMoves(ctx context.Context, batch []move, yield func(move)) []*coordinationv1.Lease {
	out := make([]*coordinationv1.Lease, len(batch))
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(maxMovesInFlight, len(batch)) {
		wg.Go(func() {
			for i := range next {
				if k := batch[i].kind; k == MoveHandoff || k == MoveRelease {
					yield(batch[i])
				}
				out[i] = s.writeMove(ctx, batch[i])
			}
		})
	}
	for i := range batch {
		next <- i
	}
	close(next)
	wg.Wait()
	return out
}

// view is the ring as the Watcher last saw it, with this member's own
// writes that the Watcher has not shown yet laid over it.
func (s *Sharder) view(leases []*coordinationv1.Lease, progress int64, member *kubeadapter.Held) ringView {
	own := member.Lease()
	overlay := maps.Clone(s.written)
	if prev, ok := overlay[own.Name]; !ok || rvOf(prev) < rvOf(own) {
		overlay[own.Name] = own
	}
	merged := make([]*coordinationv1.Lease, 0, len(leases)+len(overlay))
	for _, l := range leases {
		if w, ok := overlay[l.Name]; ok {
			delete(overlay, l.Name)
			if rvOf(w) > rvOf(l) {
				merged = append(merged, w)
				continue
			}
			delete(s.written, l.Name)
		}
		merged = append(merged, l)
	}
	for name, w := range overlay {
		if rvOf(w) <= progress {
			// Written, seen by the Watcher and gone since.
			delete(s.written, name)
			continue
		}
		merged = append(merged, w)
	}
	return newRingView(s.cfg.Ring, merged)
}

func rvOf(l *coordinationv1.Lease) int64 {
	n, err := token.ParseRevision(l.ResourceVersion)
	if err != nil {
		return 0
	}
	return n
}

// observe records the heartbeats of v as seen at now and returns the
// live members, this one first, and the heartbeats of dead ones: those
// that name a holder and whose resourceVersion has not changed for their
// leaseDurationSeconds since this member first saw it. Only this
// member's clock is read; the records' timestamps are not.
func (s *Sharder) observe(v ringView, now time.Time, me incarnation) (live []incarnation, dead []*coordinationv1.Lease) {
	live = []incarnation{me}
	for name := range s.seen {
		if _, ok := v.members[name]; !ok {
			delete(s.seen, name)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(v.members)) {
		m := v.members[name]
		seen, ok := s.seen[name]
		if !ok || seen.rv != m.ResourceVersion {
			seen = seenAt{rv: m.ResourceVersion, at: now}
			s.seen[name] = seen
		}
		if mutant.On(mutant.SharderTrustsRenewTime) && m.Spec.RenewTime != nil {
			seen.at = m.Spec.RenewTime.Time
		}
		holder := leaserecord.Holder(&m.Spec)
		switch {
		case name == me.lease || holder == "":
		case now.Sub(seen.at) >= leaserecord.Duration(&m.Spec):
			dead = append(dead, m)
		case m.Annotations[LeavingAnnotation] == holder:
			// Alive, so its shards are not orphaned, but leaving: it is
			// handing them off and takes none.
		default:
			live = append(live, incarnation{identity: identityOf(s.cfg.Ring, m), holder: holder, lease: name, weight: weightOf(m)})
		}
	}
	return live, dead
}

// adopt ends the ownerships that v shows moved and starts those that v
// shows assigned to me, then publishes the result and tells the
// AcquiredSources.
func (s *Sharder) adopt(v ringView, member *kubeadapter.Held, me incarnation) {
	cur := s.helds()
	next := make(map[string]*Held, len(cur))
	var moved []*Held
	for shard, h := range cur {
		l := v.shards[shard]
		switch {
		case h.Err() != nil:
		case l == nil || leaserecord.Compare(h.lease, l) != leaserecord.Same || !holds(l, me):
			moved = append(moved, h)
		default:
			next[shard] = h
		}
	}
	s.mu.Lock()
	tracked := maps.Clone(s.tracked)
	s.mu.Unlock()
	var acquired []string
	for shard, l := range v.shards {
		if next[shard] != nil || !tracked[shard] || !holds(l, me) || member.Err() != nil {
			continue
		}
		h, err := newHeld(member.Context(), shard, l)
		if err != nil {
			continue
		}
		next[shard] = h
		acquired = append(acquired, shard)
	}
	s.publish(next)
	for _, h := range moved {
		h.end(ErrMoved)
	}
	if len(acquired) == 0 {
		return
	}
	s.mu.Lock()
	subs := slices.Collect(maps.Keys(s.subs))
	s.mu.Unlock()
	for _, shard := range acquired {
		for _, fn := range subs {
			(*fn)(shard)
		}
	}
}

// tombstone declares the member of heartbeat m dead with a write
// conditional on m's resourceVersion, the one seen unchanged.
func (s *Sharder) tombstone(ctx context.Context, m *coordinationv1.Lease) {
	got, err := s.leases.Leases(m.Namespace).Update(ctx, tombstoned(m, s.clock.Now()), metav1.UpdateOptions{})
	if err != nil {
		if !apierrors.IsConflict(err) {
			logr.FromContextOrDiscard(ctx).Error(err, "tombstone failed", "lease", m.Name)
		}
		return
	}
	s.wrote(kubeadapter.WriteTombstone)
	s.written[got.Name] = got
}

// writeMove makes the write of one move, conditional on the shard Lease
// it was planned from (or a create), and returns the result, or nil when
// the write failed.
func (s *Sharder) writeMove(ctx context.Context, mv move) *coordinationv1.Lease {
	next := assigned(s.cfg.Namespace, s.cfg.Ring, mv.shard, mv.cur, mv.to, s.cfg.LeaseDuration, s.clock.Now())
	leases := s.leases.Leases(s.cfg.Namespace)
	var got *coordinationv1.Lease
	var err error
	if mv.cur == nil {
		got, err = leases.Create(ctx, next, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			got, err = s.reclaim(ctx, mv)
		}
	} else {
		got, err = leases.Update(ctx, next, metav1.UpdateOptions{})
	}
	if err != nil {
		if !apierrors.IsConflict(err) && !apierrors.IsAlreadyExists(err) {
			logr.FromContextOrDiscard(ctx).Error(err, "shard move failed", "shard", mv.shard, "kind", mv.kind)
		}
		return nil
	}
	return got
}

// reclaim makes a create move whose Lease exists under the shard's name
// but is not in the ring's view: a raw writer stripped or rewrote its
// ring labels or NameAnnotation, so no member would ever see the shard
// again. It reads the Lease and, when it still does not look like the
// shard's, writes the move over it, conditional on the version read, as
// any takeover: a new token, greater than every one issued on it. A
// Lease that does look like the shard's (another member created it
// first) is left to the Watcher, and reclaim returns its AlreadyExists.
func (s *Sharder) reclaim(ctx context.Context, mv move) (*coordinationv1.Lease, error) {
	leases := s.leases.Leases(s.cfg.Namespace)
	name := LeaseName(s.cfg.Ring, mv.shard)
	cur, err := leases.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	if _, ok := newRingView(s.cfg.Ring, []*coordinationv1.Lease{cur}).shards[mv.shard]; ok && cur.Labels[RingLabel] == s.cfg.Ring {
		return nil, apierrors.NewAlreadyExists(coordinationv1.Resource("leases"), name)
	}
	logr.FromContextOrDiscard(ctx).Info("reclaiming a shard Lease edited out of the ring", "shard", mv.shard, "lease", name)
	return leases.Update(ctx, assigned(s.cfg.Namespace, s.cfg.Ring, mv.shard, cur, mv.to, s.cfg.LeaseDuration, s.clock.Now()), metav1.UpdateOptions{})
}

// drain waits until h's in-flight work has finished, the deadline has
// passed on the Sharder's clock (counted as forced), or ctx is done.
func (s *Sharder) drain(ctx context.Context, h *Held, deadline time.Time) {
	select {
	case <-h.drained:
		return
	default:
	}
	t := s.clock.NewTimer(deadline.Sub(s.clock.Now()))
	defer t.Stop()
	select {
	case <-h.drained:
	case <-t.C():
		s.cfg.Metrics.forced()
	case <-ctx.Done():
	}
}
