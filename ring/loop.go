package ring

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/time/rate"
	"k8s.io/utils/clock"

	"github.com/fencer-dev/fencer/etcdstore"
	"github.com/fencer-dev/fencer/internal/rendezvous"
	"github.com/fencer-dev/fencer/token"
)

// maxInFlight bounds a member's acquisitions and releases in flight.
const maxInFlight = 32

// retryDelay is how long a member waits before it tries again to acquire
// or release a shard after an error etcd's watch will not resolve.
const retryDelay = time.Second

// Requests from callers to the loop.
type (
	releaseReq struct {
		shards []string
		reply  chan releaseReply
	}
	releaseReply struct {
		toks []token.Token
		err  error
	}
	releaseFailed struct{ toks []token.Token }
	leaveNote     struct{}
)

// result is the outcome of an acquisition or a release in flight.
type result struct {
	shard   string
	acquire bool
	tok     token.Token
	heldAt  int64 // revision at which an acquisition found the shard held
	err     error
}

// held is a shard this member holds.
type held struct {
	tok       token.Token
	losing    bool
	deadline  time.Time // losing: when it is released anyway
	releasing bool      // a release is in flight; Owns no longer reports it
}

// state is the loop's state; only the loop goroutine touches it, after
// Join's initial read.
//
// Invariants: mine holds exactly the shards whose holder key the loop has
// seen created on this member's session (by its watch, its reads or its
// own acquisitions) and not yet seen deleted; Owns reports mine less the
// shards being released; a shard is acquired only if the loop's view says
// it is free and assigned to this member, so etcd's acquiring Txn (holder
// key absent, member key active and this session's) is the only judge.
type state struct {
	m         *Member
	clk       clock.Clock
	shards    []string          // sorted
	members   map[string]bool   // member name -> leaving
	assign    map[string]string // shard -> owner over the active members
	holders   map[string]token.Token
	holderRev int64 // the holder keys are as of this revision
	rev       int64 // the latest revision observed
	mine      map[string]*held
	busy      map[string]bool      // an acquisition or release is in flight
	notBefore map[string]time.Time // failed: try again from then
	inFlight  int
	todo      map[string]bool // shards to look at when the loop next reconciles
	all       bool            // look at every shard
	leaving   bool
	lim       *rate.Limiter
	results   chan result
	changes   []Change // since the last flush
	out       []Batch  // queued for the reader of Updates
}

func newState(m *Member, shards []string) *state {
	r := m.cfg.MovesPerSecond
	return &state{
		m:         m,
		clk:       m.cfg.Clock,
		shards:    shards,
		mine:      map[string]*held{},
		busy:      map[string]bool{},
		notBefore: map[string]time.Time{},
		todo:      map[string]bool{},
		lim:       rate.NewLimiter(rate.Limit(r), max(1, int(math.Ceil(r)))),
		results:   make(chan result, maxInFlight),
	}
}

// errExpired is the loop's error when the member's session ended.
func (s *state) errExpired(why string) error {
	return fmt.Errorf("ring: member %q of %q: %s: %w", s.m.cfg.Member, s.m.cfg.Ring, why, token.ErrSessionExpired)
}

// read reads the member keys and the ring's holder keys at one revision
// and brings the state up to it: shards held on this member's session are
// its own, shards it held and whose key is gone or replaced are lost.
func (s *state) read(ctx context.Context) error {
	st := s.m.st
	resp, err := st.Client().Txn(ctx).Then(
		clientv3.OpGet(memberPrefix(st, s.m.cfg.Ring), clientv3.WithPrefix()),
		clientv3.OpGet(holderPrefix(st, s.m.cfg.Ring), clientv3.WithPrefix()),
	).Commit()
	if err != nil {
		return fmt.Errorf("ring: read ring %q: %w", s.m.cfg.Ring, err)
	}
	s.members = map[string]bool{}
	for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
		s.memberPut(kv)
	}
	s.holders = map[string]token.Token{}
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		s.holderPut(kv)
	}
	s.holderRev, s.rev = resp.Header.Revision, max(s.rev, resp.Header.Revision)
	for shard, h := range s.mine {
		if s.holders[shard] != h.tok {
			s.lose(shard)
		}
	}
	s.reassign()
	if _, ok := s.members[s.m.cfg.Member]; !ok {
		return s.errExpired("member key gone")
	}
	return nil
}

// memberPut records a member key's new value.
func (s *state) memberPut(kv *mvccpb.KeyValue) {
	name := strings.TrimPrefix(string(kv.Key), memberPrefix(s.m.st, s.m.cfg.Ring))
	v, err := decodeMember(kv.Value)
	if err != nil {
		delete(s.members, name) // not a member this package wrote
		return
	}
	s.members[name] = v.State == stateLeaving
	if name == s.m.cfg.Member && kv.Lease == int64(s.m.cfg.LeaseID) && v.State == stateLeaving {
		s.leaving, s.all = true, true
	}
}

// holderPut records a holder key's creation; one on this member's session
// is its own.
func (s *state) holderPut(kv *mvccpb.KeyValue) {
	shard := strings.TrimPrefix(string(kv.Key), holderPrefix(s.m.st, s.m.cfg.Ring))
	if _, ok := slices.BinarySearch(s.shards, shard); !ok {
		return
	}
	tok, _ := etcdstore.HolderOf(ShardLease(s.m.cfg.Ring, shard), kv)
	s.holders[shard] = tok
	s.todo[shard] = true
	if h := s.mine[shard]; h != nil && h.tok != tok {
		s.lose(shard)
	}
	if kv.Lease == int64(s.m.cfg.LeaseID) && s.mine[shard] == nil {
		s.gain(shard, tok)
	}
}

// reassign computes every shard's owner over the active members.
func (s *state) reassign() {
	var active []rendezvous.Member
	for name, leaving := range s.members {
		if !leaving {
			active = append(active, rendezvous.Member{Name: name})
		}
	}
	s.assign, s.all = make(map[string]string, len(s.shards)), true
	for _, shard := range s.shards {
		s.assign[shard], _ = rendezvous.Owner(shard, active)
	}
}

func (s *state) gain(shard string, tok token.Token) {
	s.mine[shard] = &held{tok: tok}
	s.m.setOwns(shard, tok, true)
	s.changes = append(s.changes, Change{Kind: Gained, Shard: shard, Token: tok})
}

func (s *state) lose(shard string) {
	h := s.mine[shard]
	delete(s.mine, shard)
	s.m.setOwns(shard, h.tok, false)
	s.changes = append(s.changes, Change{Kind: Lost, Shard: shard, Token: h.tok})
}

func (m *Member) setOwns(shard string, tok token.Token, owns bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if owns {
		m.owns[shard] = tok
	} else if m.owns[shard] == tok {
		delete(m.owns, shard)
	}
}

// flush queues the changes so far for the reader of Updates: the
// snapshot is a batch of its own, and later changes merge into one batch
// until the reader takes it.
func (s *state) flush(snapshot bool) {
	if len(s.changes) == 0 && !snapshot {
		return
	}
	if n := len(s.out); n > 0 && !snapshot && !s.out[n-1].Snapshot {
		s.out[n-1].Changes = append(s.out[n-1].Changes, s.changes...)
		s.out[n-1].Revision = s.rev
	} else {
		s.out = append(s.out, Batch{Snapshot: snapshot, Changes: s.changes, Revision: s.rev})
	}
	s.changes = nil
}

// offer returns what the loop's select offers the reader: Updates and the
// first queued batch, or a nil channel when nothing is queued.
func (s *state) offer() (chan<- Batch, Batch) {
	if len(s.out) == 0 {
		return nil, Batch{}
	}
	return s.m.updates, s.out[0]
}

// run is the member's goroutine: the loop, then the delivery of the last
// batches until the reader has taken them or Close abandons them.
func (m *Member) run(ctx context.Context, s *state) {
	defer m.wg.Done()
	defer close(m.updates)
	s.flush(true)
	err := s.loop(ctx)
	m.stop()
	s.drainWorkers()
	if !errors.Is(err, ErrLeft) && !errors.Is(err, ErrClosed) {
		for shard := range s.mine {
			s.lose(shard)
		}
	}
	s.flush(false)
	m.mu.Lock()
	m.err = err
	clear(m.owns)
	m.mu.Unlock()
	close(m.done)
	for len(s.out) > 0 {
		select {
		case m.updates <- s.out[0]:
			s.out = s.out[1:]
		case <-m.abandon:
			return
		}
	}
}

// drainWorkers waits for the acquisitions and releases in flight, whose
// context has been cancelled.
func (s *state) drainWorkers() {
	for ; s.inFlight > 0; s.inFlight-- {
		<-s.results
	}
}

// loop watches, reconciles and answers requests until the member stops,
// and returns why.
func (s *state) loop(ctx context.Context) error {
	var wake clock.Timer
	defer func() {
		if wake != nil {
			wake.Stop()
		}
	}()
	for {
		wctx, cancelWatch := context.WithCancel(clientv3.WithRequireLeader(ctx))
		cli, opts := s.m.st.Client(), []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithRev(s.holderRev + 1)}
		mw := cli.Watch(wctx, memberPrefix(s.m.st, s.m.cfg.Ring), opts...)
		hw := cli.Watch(wctx, holderPrefix(s.m.st, s.m.cfg.Ring), opts...)
		err := s.follow(ctx, mw, hw, &wake)
		cancelWatch()
		if err != nil {
			return err
		}
		if err := s.resync(ctx); err != nil {
			return err
		}
	}
}

// follow handles watch events, results and requests until the member
// stops (its error) or a watch breaks (nil). It reconciles when no result
// is waiting, so that a burst of results costs one pass over the shards
// (a watch response carries its burst of events at once).
func (s *state) follow(ctx context.Context, mw, hw clientv3.WatchChan, wake *clock.Timer) error {
	for {
		if len(s.results) == 0 {
			if err := s.reconcile(ctx, wake); err != nil {
				return err
			}
			s.flush(false)
		}
		var wakeC <-chan time.Time
		if *wake != nil {
			wakeC = (*wake).C()
		}
		var broken bool
		var err error
		out, next := s.offer()
		select {
		case <-ctx.Done():
			return ErrClosed
		case out <- next:
			s.out = s.out[1:]
		case resp, ok := <-mw:
			broken, err = s.memberEvents(resp, ok)
		case resp, ok := <-hw:
			broken = s.holderEvents(resp, ok)
		case r := <-s.results:
			err = s.handle(r)
		case req := <-s.m.reqs:
			s.request(req)
		case <-wakeC:
		}
		if err != nil || broken {
			return err
		}
	}
}

// resync reads the ring again after a broken watch, retrying until it
// succeeds or the member stops.
func (s *state) resync(ctx context.Context) error {
	for {
		err := s.read(ctx)
		if err == nil || errors.Is(err, token.ErrSessionExpired) {
			s.flush(false)
			return err
		}
		t := s.clk.NewTimer(retryDelay)
		select {
		case <-ctx.Done():
			t.Stop()
			return ErrClosed
		case <-t.C():
		}
	}
}

// memberEvents applies a member watch response; broken means the watch
// must be restarted.
func (s *state) memberEvents(resp clientv3.WatchResponse, ok bool) (broken bool, err error) {
	if !ok || resp.Canceled || resp.Err() != nil {
		return true, nil
	}
	for _, ev := range resp.Events {
		s.rev = max(s.rev, ev.Kv.ModRevision)
		if ev.Type == mvccpb.PUT {
			s.memberPut(ev.Kv)
			continue
		}
		name := strings.TrimPrefix(string(ev.Kv.Key), memberPrefix(s.m.st, s.m.cfg.Ring))
		delete(s.members, name)
		if name == s.m.cfg.Member {
			return false, s.errExpired("member key deleted")
		}
	}
	if len(resp.Events) > 0 {
		s.reassign()
	}
	return false, nil
}

// holderEvents applies a holder-key watch response; broken means the
// watch must be restarted.
func (s *state) holderEvents(resp clientv3.WatchResponse, ok bool) (broken bool) {
	if !ok || resp.Canceled || resp.Err() != nil {
		return true
	}
	for _, ev := range resp.Events {
		s.holderRev, s.rev = ev.Kv.ModRevision, max(s.rev, ev.Kv.ModRevision)
		if ev.Type == mvccpb.PUT {
			s.holderPut(ev.Kv)
			continue
		}
		shard := strings.TrimPrefix(string(ev.Kv.Key), holderPrefix(s.m.st, s.m.cfg.Ring))
		delete(s.holders, shard)
		s.todo[shard] = true
		if h := s.mine[shard]; h != nil && ev.Kv.ModRevision > h.tok.Revision {
			s.lose(shard)
		}
	}
	return false
}

// handle applies the result of an acquisition or release.
func (s *state) handle(r result) error {
	s.inFlight--
	delete(s.busy, r.shard)
	s.todo[r.shard] = true
	if r.acquire {
		switch {
		case r.err == nil:
			s.rev = max(s.rev, r.tok.Revision)
			if s.mine[r.shard] == nil && r.tok.Revision > s.holderRev {
				s.gain(r.shard, r.tok) // the watch has yet to show it
			}
		case errors.Is(r.err, rpctypes.ErrLeaseNotFound):
			return s.errExpired("lease not found")
		case errors.Is(r.err, token.ErrHeldByAnother), errors.Is(r.err, token.ErrLockDelay):
			if r.heldAt > s.holderRev {
				// Its key existed at heldAt, which the watch has yet to
				// pass: an event of that key will mark the shard again.
				delete(s.todo, r.shard)
			}
		default: // the member key is not active, or etcd failed
			s.notBefore[r.shard] = s.clk.Now().Add(retryDelay)
		}
		return nil
	}
	if h := s.mine[r.shard]; h != nil && h.tok == r.tok && r.err != nil {
		s.unrelease(r.shard, h)
	}
	return nil
}

// unrelease holds again a shard whose release failed; it is released
// after a further retryDelay.
func (s *state) unrelease(shard string, h *held) {
	h.releasing = false
	s.todo[shard] = true
	h.deadline = s.clk.Now().Add(retryDelay)
	s.m.setOwns(shard, h.tok, true)
}

// request answers a caller.
func (s *state) request(req any) {
	switch req := req.(type) {
	case leaveNote:
		s.leaving, s.all = true, true
	case releaseFailed:
		for _, tok := range req.toks {
			shard := strings.TrimPrefix(tok.Lease, ShardLease(s.m.cfg.Ring, ""))
			if h := s.mine[shard]; h != nil && h.tok == tok && h.releasing {
				s.unrelease(shard, h)
			}
		}
	case releaseReq:
		var toks []token.Token
		for _, shard := range req.shards {
			h := s.mine[shard]
			switch {
			case h == nil || h.releasing:
			case !h.losing:
				req.reply <- releaseReply{err: fmt.Errorf("ring: release %q of %q: %w", shard, s.m.cfg.Ring, ErrNotLosing)}
				return
			default:
				toks = append(toks, h.tok)
			}
		}
		for _, tok := range toks {
			shard := strings.TrimPrefix(tok.Lease, ShardLease(s.m.cfg.Ring, ""))
			s.mine[shard].releasing = true
			s.m.setOwns(shard, tok, false)
		}
		req.reply <- releaseReply{toks: toks}
	}
}

// reconcile starts what the state calls for, for the shards marked to
// look at (todo): acquisitions of free shards assigned to this member,
// Losing reports of held shards assigned elsewhere (at the moves limit),
// and releases of those whose drain has passed. A shard that must wait
// (for its drain, the moves limit, a retry, or a free slot when
// maxInFlight are in flight) stays marked, and wake is armed for the next
// deadline. It stops the member once it has left.
func (s *state) reconcile(ctx context.Context, wake *clock.Timer) error {
	if s.all {
		for _, shard := range s.shards {
			s.todo[shard] = true
		}
		s.all = false
	}
	now := s.clk.Now()
	var next time.Time
	later := func(t time.Time) {
		if next.IsZero() || t.Before(next) {
			next = t
		}
	}
	limited := false
	for shard := range s.todo {
		if s.inFlight >= maxInFlight {
			break // a result will come, and reconcile again
		}
		delete(s.todo, shard)
		if t, wait := s.visit(ctx, shard, now, &limited); wait {
			s.todo[shard] = true
			if !t.IsZero() {
				later(t)
			}
		}
	}
	if *wake != nil {
		(*wake).Stop()
		*wake = nil
	}
	if !next.IsZero() {
		*wake = s.clk.NewTimer(next.Sub(now))
	}
	if s.leaving && len(s.mine) == 0 && s.inFlight == 0 {
		return s.deleteMemberKey(ctx)
	}
	return nil
}

// visit does what shard calls for, and reports whether it must be looked
// at again, from when (zero: whenever the loop next reconciles).
func (s *state) visit(ctx context.Context, shard string, now time.Time, limited *bool) (when time.Time, wait bool) {
	me, owner := s.m.cfg.Member, s.assign[shard]
	h := s.mine[shard]
	switch {
	case h != nil && h.releasing:
		return time.Time{}, false
	case h != nil && !h.losing && (s.leaving || owner != me):
		if *limited {
			return time.Time{}, true
		}
		if !s.lim.AllowN(now, 1) {
			r := s.lim.ReserveN(now, 1)
			defer r.CancelAt(now)
			*limited = true
			return now.Add(r.DelayFrom(now)), true
		}
		h.losing, h.deadline = true, now.Add(s.m.cfg.Drain)
		s.changes = append(s.changes, Change{Kind: Losing, Shard: shard, Token: h.tok, Drain: s.m.cfg.Drain})
		return h.deadline, true
	case h != nil && h.losing && now.Before(h.deadline):
		return h.deadline, true
	case h != nil && h.losing:
		h.releasing = true
		s.m.setOwns(shard, h.tok, false)
		s.start(ctx, shard, false, h.tok)
		return time.Time{}, false
	case h != nil || owner != me || s.leaving || s.busy[shard]:
		return time.Time{}, false
	}
	if _, taken := s.holders[shard]; taken {
		return time.Time{}, false // its deletion will mark it
	}
	if t, ok := s.notBefore[shard]; ok && now.Before(t) {
		return t, true
	}
	delete(s.notBefore, shard)
	s.start(ctx, shard, true, token.Token{})
	return time.Time{}, false
}

// start acquires or releases shard in a goroutine of its own, which
// reports to s.results.
func (s *state) start(ctx context.Context, shard string, acquire bool, tok token.Token) {
	s.busy[shard] = true
	s.inFlight++
	m := s.m
	go func() {
		r := result{shard: shard, acquire: acquire, tok: tok}
		if acquire {
			r.tok, r.heldAt, r.err = m.st.AcquireOn(ctx, m.cfg.LeaseID, m.cfg.Holder, ShardLease(m.cfg.Ring, shard), 0,
				clientv3.Compare(clientv3.Value(m.key), "=", m.active),
				clientv3.Compare(clientv3.LeaseValue(m.key), "=", int64(m.cfg.LeaseID)))
		} else {
			_, r.err = m.st.ReleaseOn(ctx, tok, m.cfg.LeaseID)
		}
		s.results <- r // buffered for every worker in flight
	}()
}

// deleteMemberKey ends a Leave: the member holds nothing, so it deletes
// its member key and stops with ErrLeft.
func (s *state) deleteMemberKey(ctx context.Context) error {
	k := s.m.key
	_, err := s.m.st.Client().Txn(ctx).
		If(clientv3.Compare(clientv3.LeaseValue(k), "=", int64(s.m.cfg.LeaseID))).
		Then(clientv3.OpDelete(k)).Commit()
	if err != nil && ctx.Err() == nil {
		return fmt.Errorf("ring: leave %q: delete the member key: %w", s.m.cfg.Ring, err)
	}
	return ErrLeft
}
