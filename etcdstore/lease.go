package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencer-dev/fencer/internal/etcdcmp"
	"github.com/fencer-dev/fencer/internal/holderkey"
	"github.com/fencer-dev/fencer/token"
)

// Lease is one acquisition of a named lease, held through a Session. Its
// Token is fixed for its lifetime. Methods are safe for concurrent use.
type Lease struct {
	sess *Session
	tok  token.Token

	// ctx is done when the acquisition ends; its cause is Err's value.
	ctx    context.Context
	cancel context.CancelCauseFunc
}

var _ token.Holder = (*Lease)(nil)

// Token returns the fencing token of this acquisition.
func (l *Lease) Token() token.Token { return l.tok }

// Context returns a context that is done when this acquisition ends, as
// Done closes; its cause (context.Cause) is what Err returns. Work bound
// to it stops promptly but advisorily; writes are fenced by the store.
func (l *Lease) Context() context.Context { return l.ctx }

// Done is closed when this acquisition ends: released, its holder key
// deleted or replaced by someone else, or its session ended. Done closing
// is prompt but advisory; writes are fenced by the store, not by Done.
func (l *Lease) Done() <-chan struct{} { return l.ctx.Done() }

// Err returns nil while the lease is held and then why it ended:
// ErrReleased, ErrLeaseLost, ErrSessionClosed or ErrSessionExpired, wrapped
// with detail. All of them also match token.ErrNotHeld.
func (l *Lease) Err() error {
	return token.Ended(l.ctx)
}

// Guard returns the etcd conditions that hold while this acquisition is
// current; see Store.Guard.
func (l *Lease) Guard() []clientv3.Cmp { return l.sess.store.guard(l.tok) }

// Release ends the Lease with ErrReleased, then deletes the holder key if
// and only if it is still this acquisition's, so a retried or late Release
// never deletes a newer holder's key. It is the clean release: it deletes
// the acquisition's lock-delay marker in the same Txn (Store.ReleaseOn),
// so the lease is free at once. If the delete fails, the Lease has
// ended all the same; a retry deletes the key, or it expires with the
// session. Releasing a lease that has already ended changes nothing in etcd
// unless its key is still this acquisition's.
func (l *Lease) Release(ctx context.Context) error {
	l.sess.forget(l)
	l.end(ErrReleased)
	_, err := l.sess.store.ReleaseOn(ctx, l.tok, l.sess.id)
	return err
}

// end ends the acquisition with reason; only the first call has an effect.
func (l *Lease) end(reason error) {
	l.cancel(fmt.Errorf("%w (%w)", reason, token.ErrNotHeld))
}

// AcquireOption configures one acquisition (TryAcquire, Acquire).
type AcquireOption func(*acquireOptions)

type acquireOptions struct {
	lockDelay time.Duration
}

// WithLockDelay sets the lock-delay of the acquisition, 0 (the default) to
// MaxLockDelay: if the acquisition ends without a clean release by its
// holder (Lease.Release), because its session expired or was closed, its
// holder key was deleted, or someone released its token with
// Store.Release, the lease cannot be acquired again until a delay of at
// least d has passed on etcd's clock, counted from when the next acquirer
// found the lease free. etcd enforces it: the acquiring Txn itself refuses
// an acquisition before then. The delay is timed by an etcd lease, so it
// is d rounded up to whole seconds and to etcd's minimum lease TTL, and
// longer when etcd extends leases (after a leader change, say); it is
// never shorter. Its cost: a lease whose holder crashed is unavailable
// for the session's TTL plus the delay.
func WithLockDelay(d time.Duration) AcquireOption {
	return func(o *acquireOptions) { o.lockDelay = d }
}

// TryAcquire acquires lease name if it is free and returns at once
// otherwise: with a *token.HeldError naming the current holder, with a
// *token.LockDelayError (token.ErrLockDelay) if the lease is free but the
// lock-delay of its last acquisition has not passed (see WithLockDelay;
// the first acquirer to find it so starts the delay), or with
// ErrAlreadyHeld if this session holds name (until it has observed the
// loss of that Lease). The acquisition and the epoch bump are one etcd Txn.
func (s *Session) TryAcquire(ctx context.Context, name string, opts ...AcquireOption) (*Lease, error) {
	l, _, err := s.tryAcquire(ctx, name, opts...)
	return l, err
}

// tryAcquire returns the revision at which a held lease was seen, so that
// Acquire can wait for its deletion from there.
//
// The session's watch may see the new holder key deleted or replaced
// before the Lease is registered with it: the acquiring Txn has committed,
// the watch has delivered the change, and nothing was held under that name
// yet. So the name is marked pending before the Txn, the watch keeps the
// latest state it saw of a pending name's key, and registering the Lease
// applies that state to it (see Session.observe).
func (s *Session) tryAcquire(ctx context.Context, name string, opts ...AcquireOption) (*Lease, int64, error) {
	var o acquireOptions
	for _, opt := range opts {
		opt(&o)
	}
	if err := s.ctx.Err(); err != nil {
		return nil, 0, s.Err()
	}
	s.mu.Lock()
	mine := s.held[name]
	if mine == nil {
		s.pend(name)
	}
	s.mu.Unlock()
	if mine != nil {
		return nil, 0, fmt.Errorf("%w: %s", ErrAlreadyHeld, mine.tok)
	}
	tok, heldAt, err := s.store.acquire(ctx, s.id, s.holder, name, o.lockDelay)
	if err != nil {
		s.register(name, nil)
		return nil, heldAt, err
	}
	if h := s.hooks.acquired; h != nil {
		h(tok)
	}
	l := &Lease{sess: s, tok: tok}
	l.ctx, l.cancel = context.WithCancelCause(context.Background())
	if err := s.register(name, l); err != nil {
		return nil, 0, err
	}
	return l, 0, nil
}

// AcquireOn acquires lease name for holder on etcd lease id, which the
// caller grants and keeps alive itself, as fencer's service does for its
// remote sessions; applications acquire through a Session, which keeps its
// etcd lease alive and watches its leases. lockDelay is the acquisition's
// lock-delay (WithLockDelay). cond are further compares that must hold in
// the acquiring Txn (for example, that id belongs to the caller); if they
// fail, nothing is written and ErrCondition is returned.
//
// It returns a *token.HeldError, with the revision it was seen at, when
// the lease is held, and a *token.LockDelayError, with the revision too,
// when it is free but in its lock-delay; wait with WaitFree from that
// revision. Nothing watches a lease acquired this way: the caller detects
// its loss (fencer's service watches the holder keys), and its clean
// release is ReleaseOn with id. An id of 0 is refused: a holder key on no
// etcd lease would never expire.
func (s *Store) AcquireOn(ctx context.Context, id clientv3.LeaseID, holder, name string, lockDelay time.Duration, cond ...clientv3.Cmp) (tok token.Token, heldAt int64, err error) {
	if id == 0 {
		return token.Token{}, 0, invalid("lease id", "0", "not an etcd lease")
	}
	return s.acquire(ctx, id, holder, name, lockDelay, cond...)
}

// acquire creates the holder key of name on etcd lease id and bumps the
// epoch, in one Txn, which also enforces the lock-delay of the acquisition
// before (see delay.go) and records lockDelay for this one. It starts from
// the epoch the store last saw for name and from no lock-delay marker, so
// that the common case is a single Txn; a wrong guess (another process
// acquired name since, or a marker is left) costs one more round trip.
func (s *Store) acquire(ctx context.Context, id clientv3.LeaseID, holder, name string, lockDelay time.Duration, cond ...clientv3.Cmp) (token.Token, int64, error) {
	if err := ValidateName("name", name); err != nil {
		return token.Token{}, 0, err
	}
	if err := validLockDelay(lockDelay); err != nil {
		return token.Token{}, 0, err
	}
	hk, ek, dk, ck := s.holderKey(name), s.epochKey(name), s.delayKey(name), s.claimKey(name)
	seen := s.epochs.get(name)
	var mark delayMarker // guessed absent
	for {
		cmps, then := s.acquireOps(id, holder, name, lockDelay, seen, mark, cond)
		resp, err := s.commit(ctx, cmps, then,
			[]clientv3.Op{clientv3.OpGet(hk), clientv3.OpGet(ek), clientv3.OpGet(dk), clientv3.OpGet(ck, clientv3.WithCountOnly())})
		if err != nil {
			return token.Token{}, 0, fmt.Errorf("etcdstore: acquire %q: %w", name, err)
		}
		if resp.Succeeded {
			rev := resp.Header.Revision
			s.epochs.put(name, epochSeen{value: seen.value + 1, modRev: rev})
			return token.Token{Lease: name, Epoch: seen.value + 1, Revision: rev}, 0, nil
		}
		if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) == 1 {
			return token.Token{}, resp.Header.Revision, &token.HeldError{Lease: name, Holder: holderkey.Decode(kvs[0].Value).Holder}
		}
		now := epochSeen{}
		if kvs := resp.Responses[1].GetResponseRange().Kvs; len(kvs) == 1 {
			now.modRev = kvs[0].ModRevision
			if now.value, err = strconv.ParseUint(string(kvs[0].Value), 10, 64); err != nil {
				return token.Token{}, 0, fmt.Errorf("etcdstore: acquire %q: corrupt epoch %q", name, kvs[0].Value)
			}
		}
		s.epochs.put(name, now)
		var markNow delayMarker
		if kvs := resp.Responses[2].GetResponseRange().Kvs; len(kvs) == 1 {
			if markNow, err = decodeMarker(kvs[0].Value, kvs[0].ModRevision); err != nil {
				return token.Token{}, 0, fmt.Errorf("acquire %q: %w", name, err)
			}
		}
		claimed := resp.Responses[3].GetResponseRange().Count > 0
		switch {
		case markNow.present && markNow.claim == 0:
			// The last acquisition ended without a clean release and
			// nobody has started its delay yet: start it.
			left, started, err := s.startDelay(ctx, name, markNow)
			if err != nil {
				return token.Token{}, 0, err
			}
			if started {
				return token.Token{}, resp.Header.Revision, &token.LockDelayError{Lease: name, Delay: markNow.delay, Remaining: left}
			}
			seen, mark = now, delayMarker{} // read again
			continue
		case markNow.present && claimed:
			return token.Token{}, resp.Header.Revision, s.delayError(ctx, name, markNow)
		}
		if now == seen && markNow == mark {
			// The lease is free, the epoch and marker as guessed: cond failed.
			return token.Token{}, 0, ErrCondition
		}
		seen, mark = now, markNow // only the guesses were wrong: retry
	}
}

// acquireOps builds the acquiring Txn of name for holder on etcd lease id,
// as guessed from the epoch seen and the lock-delay marker mark: it
// commits only if the holder key is absent, the epoch key is at seen's
// mod revision, and the marker is exactly mark (mod revision and value),
// which must be absent or name a claim; a marker that names a claim also
// requires the claim key to be absent, that is expired by etcd. A marker
// that names no claim cannot be acquired over: the guard then requires a
// claim that the marker does not name, which never holds. It bumps the
// epoch, and writes the marker for lockDelay or deletes the one there.
func (s *Store) acquireOps(id clientv3.LeaseID, holder, name string, lockDelay time.Duration, seen epochSeen, mark delayMarker, cond []clientv3.Cmp) ([]clientv3.Cmp, []clientv3.Op) {
	hk, ek, dk, ck := s.holderKey(name), s.epochKey(name), s.delayKey(name), s.claimKey(name)
	epoch := seen.value + 1
	cmps := append([]clientv3.Cmp{
		etcdcmp.CreateRevisionIs(hk, 0),
		etcdcmp.ModRevisionIs(ek, seen.modRev),
		etcdcmp.ModRevisionIs(dk, mark.modRev),
	}, cond...)
	if mark.present {
		// The delay has passed: its claim was started (the marker names
		// it) and etcd has expired it. An unstarted delay never passes.
		cmps = append(cmps,
			etcdcmp.ValueIs(dk, encodeMarker(mark.delay, mark.claim)),
			etcdcmp.VersionIs(ck, 0))
		if mark.claim == 0 {
			cmps = append(cmps, etcdcmp.VersionAbove(ck, 0))
		}
	}
	then := []clientv3.Op{
		clientv3.OpPut(hk, holderkey.Encode(holderkey.Record{Holder: holder, Epoch: epoch}), clientv3.WithLease(id)),
		clientv3.OpPut(ek, strconv.FormatUint(epoch, 10)),
	}
	switch {
	case lockDelay > 0:
		then = append(then, clientv3.OpPut(dk, encodeMarker(lockDelay, 0)))
	case mark.present:
		then = append(then, clientv3.OpDelete(dk))
	}
	return cmps, then
}

// epochSeen is the last value and mod revision of an epoch key that the
// store saw.
type epochSeen struct {
	value  uint64
	modRev int64
}

// maxEpochGuesses bounds epochGuesses; past it the guesses start over.
const maxEpochGuesses = 1 << 16

// epochGuesses remembers, per lease name, the epoch a store last saw, so
// that its next acquisition of the name guesses the epoch right. A wrong or
// missing guess costs a round trip, never correctness: the acquiring Txn
// compares the epoch key's mod revision.
type epochGuesses struct {
	mu   sync.Mutex
	seen map[string]epochSeen
}

func (g *epochGuesses) get(name string) epochSeen {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.seen[name]
}

func (g *epochGuesses) put(name string, e epochSeen) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if _, ok := g.seen[name]; g.seen == nil || (!ok && len(g.seen) >= maxEpochGuesses) {
		g.seen = map[string]epochSeen{}
	}
	g.seen[name] = e
}

// Acquire acquires lease name, waiting while another holder has it and
// while the lock-delay of its last acquisition runs. It returns when
// acquired, or with ctx's error when ctx ends first, or with the session's
// error if the session ends. Waiters are not queued: when a holder key is
// deleted or a delay ends, all waiters race for the lease.
func (s *Session) Acquire(ctx context.Context, name string, opts ...AcquireOption) (*Lease, error) {
	for {
		l, seenAt, err := s.tryAcquire(ctx, name, opts...)
		if !errors.Is(err, token.ErrHeldByAnother) && !errors.Is(err, token.ErrLockDelay) {
			return l, err
		}
		if err := s.waitFree(ctx, name, seenAt); err != nil {
			return nil, err
		}
	}
}

// waitFree is WaitFree that also gives up when the session ends.
func (s *Session) waitFree(ctx context.Context, name string, rev int64) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(s.ctx, cancel)
	defer stop()
	err := s.store.WaitFree(ctx, name, rev)
	if s.ctx.Err() != nil {
		return s.Err()
	}
	return err
}

// WaitFree waits until the holder key of lease name, or the claim that
// times its lock-delay, is deleted after revision rev (as returned with a
// *token.HeldError or *token.LockDelayError), or until that
// revision has been compacted away, when the caller should simply try
// again. When the watch breaks otherwise (etcd lost its leader, say) it
// watches again from the same revision, with backoff (50 ms doubling to
// 5 s, ±50%), so a caller that retries on its return never spins. It
// returns ctx's error if ctx ends first.
func (s *Store) WaitFree(ctx context.Context, name string, rev int64) error {
	if err := ValidateName("name", name); err != nil {
		return err
	}
	retry := newWatchBackOff()
	for {
		done, err := s.watchDelete(ctx, name, rev, retry)
		if done || err != nil {
			return err
		}
		t := time.NewTimer(retry.NextBackOff())
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// watchDelete watches name's holder key and lock-delay claim from after
// rev until one is deleted or rev is compacted (done), ctx ends (its error), or the watch
// breaks (neither). Once etcd has accepted the watch, retry starts over.
func (s *Store) watchDelete(ctx context.Context, name string, rev int64, retry backoff.BackOff) (done bool, err error) {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := s.cli.Watch(wctx, s.holderKey(name), clientv3.WithRev(rev+1), clientv3.WithFilterPut(), clientv3.WithCreatedNotify())
	cch := s.cli.Watch(wctx, s.claimKey(name), clientv3.WithRev(rev+1), clientv3.WithFilterPut())
	for {
		var resp clientv3.WatchResponse
		var ok bool
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case resp, ok = <-cch:
			resp.Created = false // only the holder key's watch resets retry
		case resp, ok = <-wch:
		}
		switch {
		case ctx.Err() != nil:
			return false, ctx.Err()
		case !ok:
			return false, nil
		case resp.CompactRevision != 0:
			return true, nil
		case resp.Err() != nil:
			return false, nil
		case resp.Created:
			retry.Reset()
		}
		for _, ev := range resp.Events {
			if ev.Type == mvccpb.DELETE {
				return true, nil
			}
		}
	}
}

// pend marks an acquisition of name as in flight, so that the watch keeps
// what it sees of name's holder key until register. s.mu must be held.
func (s *Session) pend(name string) {
	p := s.pending[name]
	if p == nil {
		p = &pendingName{}
		s.pending[name] = p
	}
	p.n++
}

// register ends an in-flight acquisition of name: l is the Lease it
// acquired, or nil if it acquired nothing. l is registered with the
// session's watch and then checked against the latest state of its holder
// key that the watch saw while the acquisition was in flight, so a change
// the watch delivered before l was registered still ends l. If the session
// has already ended, l ends too and the session's error is returned; l's
// key is attached to the session's etcd lease and goes with it.
func (s *Session) register(name string, l *Lease) error {
	s.mu.Lock()
	p := s.pending[name]
	seen := p.seen
	if p.n--; p.n == 0 {
		delete(s.pending, name)
	}
	if l == nil {
		s.mu.Unlock()
		return nil
	}
	err := s.Err()
	if err == nil {
		s.held[name] = l
	}
	s.mu.Unlock()
	if err != nil {
		l.end(err)
		return err
	}
	if seen != nil {
		s.apply(l, *seen)
	}
	return nil
}

func (s *Session) forget(l *Lease) {
	s.mu.Lock()
	if s.held[l.tok.Lease] == l {
		delete(s.held, l.tok.Lease)
	}
	s.mu.Unlock()
}
