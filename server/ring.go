package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	"github.com/fencer-dev/fencer/internal/holderkey"
	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
	"github.com/fencer-dev/fencer/ring"
	"github.com/fencer-dev/fencer/token"
)

// The ring calls. A member runs (package ring's Member: its assignment
// loop) in the server that serves its JoinRing stream, for as long as the
// stream lasts; the server keeps at most one running member per session
// and ring (ringMembers). Everything else a member has lives in etcd: its
// member key and its shards' holder keys, on its session's etcd lease.
//
// Invariants:
//   - A ringMember is in ringMembers.m only while its stream's handler
//     runs; the handler removes it (if it is still the one registered)
//     and closes its Member when it returns, whatever the reason.
//   - A newer JoinRing of the same session and ring takes the old entry
//     out, closes its replaced channel (the old handler then ends with
//     ErrRejoined, ABORTED) and closes its Member, waiting for it to stop,
//     before it joins anew; JoinRings of one key take turns from there
//     until the new member is registered (ringMembers.lock): two loops of
//     one member never run in one server
//     (TestRingJoinAgainReplacesTheStream,
//     TestRingConcurrentJoinsOfOneSessionLeaveOneMember).
//   - A member's shard count (the fencer_server_ring_shards_owned gauge)
//     is changed only by its handler, from the batches it sends, and taken
//     back off the gauge when the handler returns
//     (TestRingLeaveEndsTheStreamAfterLostOfAll).

// ringKey names a running member: a session in a ring.
type ringKey struct {
	id   clientv3.LeaseID
	ring string
}

// ringMember is a member whose JoinRing stream this server runs.
type ringMember struct {
	m         *ring.Member
	name      string
	principal string
	replaced  chan struct{} // closed when a newer JoinRing of the same key replaces it
	closeOnce sync.Once
}

// close stops the member's loop, once; it keeps what it holds.
func (rm *ringMember) close() { rm.closeOnce.Do(rm.m.Close) }

// ringMembers are the members whose JoinRing streams this server runs.
type ringMembers struct {
	mu      sync.Mutex
	m       map[ringKey]*ringMember
	joining map[ringKey]chan struct{} // closed when the join of the key in progress is done
}

// lock waits until no other JoinRing of key is joining, and makes this
// one the joining one, until unlock; it fails when ctx ends first.
func (r *ringMembers) lock(ctx context.Context, key ringKey) (unlock func(), err error) {
	for {
		r.mu.Lock()
		busy, ok := r.joining[key]
		if !ok {
			if r.joining == nil {
				r.joining = map[ringKey]chan struct{}{}
			}
			done := make(chan struct{})
			r.joining[key] = done
			r.mu.Unlock()
			return func() {
				r.mu.Lock()
				delete(r.joining, key)
				r.mu.Unlock()
				close(done)
			}, nil
		}
		r.mu.Unlock()
		select {
		case <-busy:
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	}
}

// put registers rm for key and returns the member it replaces, if any.
func (r *ringMembers) put(key ringKey, rm *ringMember) *ringMember {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = map[ringKey]*ringMember{}
	}
	old := r.m[key]
	r.m[key] = rm
	return old
}

// take removes and returns the member registered for key, if any.
func (r *ringMembers) take(key ringKey) *ringMember {
	r.mu.Lock()
	defer r.mu.Unlock()
	old := r.m[key]
	delete(r.m, key)
	return old
}

// get returns the member registered for key, or nil.
func (r *ringMembers) get(key ringKey) *ringMember {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.m[key]
}

// remove unregisters rm from key if it is still the one registered.
func (r *ringMembers) remove(key ringKey, rm *ringMember) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m[key] == rm {
		delete(r.m, key)
	}
}

// replace ends old, a member that a newer JoinRing replaces: its stream
// ends with ErrRejoined and its loop stops before this returns.
func replace(old *ringMember) {
	if old == nil {
		return
	}
	close(old.replaced)
	old.close()
	<-old.m.Done()
}

// ringShardSets caches each ring's shard names: a ring record never
// changes once written. It is bounded: emptied when full.
type ringShardSets struct {
	mu sync.Mutex
	m  map[string]map[string]bool
}

const ringShardSetsSize = 256

// shardsOf returns the set of ring's shards, reading them once.
func (s *Server) shardsOf(ctx context.Context, name string) (map[string]bool, error) {
	c := &s.ringShards
	c.mu.Lock()
	set, ok := c.m[name]
	c.mu.Unlock()
	if ok {
		return set, nil
	}
	shards, err := ring.Shards(ctx, s.store, name)
	if err != nil {
		return nil, inRing(name, "", err)
	}
	return s.rememberShards(name, shards), nil
}

// rememberShards caches the shards of ring name and returns their set.
func (s *Server) rememberShards(name string, shards []string) map[string]bool {
	set := make(map[string]bool, len(shards))
	for _, sh := range shards {
		set[sh] = true
	}
	c := &s.ringShards
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil || len(c.m) >= ringShardSetsSize {
		c.m = map[string]map[string]bool{}
	}
	c.m[name] = set
	return set
}

// checkShards checks that each of shards (the request field field) is one
// of ring name's.
func (s *Server) checkShards(ctx context.Context, name, field string, shards ...string) error {
	set, err := s.shardsOf(ctx, name)
	if err != nil {
		return err
	}
	for i, sh := range shards {
		if !set[sh] {
			f := field
			if len(shards) > 1 || field == "shards" {
				f = fmt.Sprintf("%s[%d]", field, i)
			}
			return invalidArg(f, sh, fmt.Sprintf("not a shard of ring %q", name))
		}
	}
	return nil
}

// defaultMember is the member name of a JoinRing that names none: the
// session's holder identity with "-" for its "/" (a member name has
// none), "<principal>-<session id in hex>", or the session id alone when
// that would be too long.
func defaultMember(principal string, id clientv3.LeaseID) string {
	hex := fmt.Sprintf("%016x", int64(id))
	if name := principal + "-" + hex; ring.ValidateMember(name) == nil {
		return name
	}
	return hex
}

// CreateRing implements FencerService.CreateRing.
func (s *Server) CreateRing(ctx context.Context, req *fencerv1.CreateRingRequest) (*fencerv1.CreateRingResponse, error) {
	shards, err := validateCreateRing(req)
	if err != nil {
		return nil, err
	}
	created, err := ring.Define(ctx, s.store, req.GetRing(), shards)
	if err != nil {
		return nil, inRing(req.GetRing(), "", err)
	}
	s.rememberShards(req.GetRing(), shards)
	if created {
		s.audit.LogAttrs(ctx, slog.LevelInfo, "create ring", slog.String("principal", principalOf(ctx)), slog.String("ring", req.GetRing()),
			slog.Int("shards", len(shards)))
	}
	return &fencerv1.CreateRingResponse{Created: created}, nil
}

// RingStatus implements FencerService.RingStatus. The holder of another
// principal's member is not named, as in ListLeases.
func (s *Server) RingStatus(ctx context.Context, req *fencerv1.RingStatusRequest) (*fencerv1.RingStatusResponse, error) {
	if err := validateRingStatus(req); err != nil {
		return nil, err
	}
	st, err := ring.ReadStatus(ctx, s.store, req.GetRing())
	if err != nil {
		return nil, inRing(req.GetRing(), "", err)
	}
	p := principalOf(ctx)
	out := &fencerv1.RingStatusResponse{ShardCount: int32(st.Shards), Unowned: int32(st.Unowned), Revision: st.Revision}
	for _, m := range st.Members {
		holder := m.Holder
		if principalOfHolder(holder) != p {
			holder = otherPrincipal
		}
		out.Members = append(out.Members, &fencerv1.RingMember{Member: m.Member, Holder: holder, Leaving: m.Leaving, Owned: int32(m.Owned)})
	}
	return out, nil
}

// JoinRing implements FencerService.JoinRing; see ringMember for what the
// server keeps of a member.
func (s *Server) JoinRing(req *fencerv1.JoinRingRequest, stream fencerv1.FencerService_JoinRingServer) error {
	ctx := stream.Context()
	p := principalOf(ctx)
	// Streams are not authorized by the interceptor: JoinRing is the one
	// that names something.
	if err := s.authz.authorize(p, req); err != nil {
		return err
	}
	if err := validateJoinRing(req); err != nil {
		return err
	}
	first := &fencerv1.JoinRingResponse{Snapshot: true}
	id := clientv3.LeaseID(req.GetSessionId())
	if id == 0 {
		ttl := req.GetTtlSeconds()
		if ttl == 0 {
			ttl = DefaultTTLSeconds
		}
		var secret []byte
		var err error
		if id, ttl, secret, err = s.openSession(ctx, p, ttl); err != nil {
			return err
		}
		first.TtlSeconds, first.SessionSecret = ttl, secret
		// Until the client has the session's id, the server renews it;
		// if the call fails before, the session is the call's alone.
		stopRenewing := s.renew(ctx, id, ttl, nil)
		defer stopRenewing()
		sent := false
		err = s.joinRing(ctx, stream, req, p, id, first, func() {
			sent = true
			stopRenewing()
		})
		if err != nil && !sent {
			s.revoke(id)
		}
		return err
	}
	return s.joinRing(ctx, stream, req, p, id, first, func() {})
}

// revoke ends session id, which a failed call opened.
func (s *Server) revoke(id clientv3.LeaseID) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, _ = s.cli.Revoke(ctx, id)
}

// joinRing runs the JoinRing stream of session id of principal p: it
// joins the ring, registers the running member (replacing an older one
// of the same session and ring), and streams the member's updates, first
// the snapshot completed from first, until the member stops, the session
// ends, the stream breaks or the server stops. sent is called once the
// first message has gone out.
func (s *Server) joinRing(ctx context.Context, stream fencerv1.FencerService_JoinRingServer, req *fencerv1.JoinRingRequest, p string,
	id clientv3.LeaseID, first *fencerv1.JoinRingResponse, sent func()) error {
	name := req.GetRing()
	rev, err := s.checkSession(ctx, id, p)
	if err != nil {
		return err
	}
	ended := s.ended.subscribe(id, rev, nil)
	defer s.ended.unsubscribe(ended)
	if !s.ended.covers(ended, rev) {
		again, err := s.checkSession(ctx, id, p)
		if err != nil {
			return err
		}
		s.ended.covers(ended, again)
	}
	memberName := req.GetMember()
	if memberName == "" {
		memberName = defaultMember(p, id)
	}
	key := ringKey{id: id, ring: name}
	unlock, err := s.members.lock(ctx, key)
	if err != nil {
		return err
	}
	if old := s.members.get(key); old != nil && old.name != memberName {
		// A session is a member of a ring under one name (package ring
		// refuses another): keep the running member and its stream.
		unlock()
		return inRing(name, memberName, &ring.SessionJoinedError{Ring: name, Member: old.name})
	}
	drain, err := s.ringDrain(ctx, id, req.GetDrainSeconds())
	if err != nil {
		unlock()
		return err
	}
	replace(s.members.take(key))
	holder := holderName(p, id)
	m, err := ring.Join(ctx, s.store, ring.Config{Ring: name, Member: memberName, Holder: holder, LeaseID: id, Drain: drain})
	if err != nil {
		unlock()
		return inRing(name, memberName, err)
	}
	rm := &ringMember{m: m, name: m.Name(), principal: p, replaced: make(chan struct{})}
	replace(s.members.put(key, rm)) // nil: the lock kept other joins out
	unlock()
	s.m.ringMembers.Inc()
	owned := 0
	losing := map[string]bool{}
	defer func() {
		s.members.remove(key, rm)
		rm.close()
		s.m.ringMembers.Dec()
		s.m.ringOwned.Sub(float64(owned))
	}()
	s.audit.LogAttrs(ctx, slog.LevelInfo, "join ring", slog.String("principal", p), slog.String("ring", name),
		slog.String("member", rm.name), slog.String("holder", holder))
	first.Member, first.SessionId = rm.name, int64(id)
	msg := first
	for {
		var b ring.Batch
		var ok bool
		select {
		case <-s.stopped.Done():
			return ErrShuttingDown
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-rm.replaced:
			return inRing(name, rm.name, ErrRejoined)
		case <-ended.gone:
			return ended.err
		case b, ok = <-m.Updates():
		}
		if !ok {
			return s.memberStopped(name, rm)
		}
		if msg == nil {
			msg = &fencerv1.JoinRingResponse{}
		}
		msg.Revision = b.Revision
		for _, c := range b.Changes {
			msg.Changes = append(msg.Changes, shardChange(c))
		}
		before := owned
		owned = s.recordBatch(ctx, p, holder, name, b, owned, losing)
		s.m.ringOwned.Add(float64(owned - before))
		for _, part := range splitRingMessage(msg) {
			if err := stream.Send(part); err != nil {
				return err
			}
		}
		if msg == first {
			sent()
		}
		msg = nil
	}
}

// maxRingMessage bounds the changes of one JoinRingResponse, in bytes,
// well under gRPC's default 4 MiB receive limit (a member of 50,000
// shards has a snapshot of about 5 MB).
const maxRingMessage = 1 << 20

// splitRingMessage splits msg into messages whose changes take at most
// maxRingMessage bytes each (one change at least), all but the last with
// More set, each with msg's Snapshot and Revision; the first keeps msg's
// other fields. A message under the bound is returned as it is.
func splitRingMessage(msg *fencerv1.JoinRingResponse) []*fencerv1.JoinRingResponse {
	out := []*fencerv1.JoinRingResponse{msg}
	all, size, from := msg.Changes, 0, 0
	for i, c := range all {
		n := proto.Size(c) + 4 // the field's tag and length
		if size+n > maxRingMessage && i > from {
			last := out[len(out)-1]
			last.Changes, last.More = all[from:i], true
			out = append(out, &fencerv1.JoinRingResponse{Snapshot: msg.Snapshot, Revision: msg.Revision})
			from, size = i, 0
		}
		size += n
	}
	out[len(out)-1].Changes = all[from:]
	return out
}

// ringDrain is how long a member's LOSING shard stays held without
// ReleaseShards: the drain_seconds asked (or DefaultDrainSeconds), but no
// less than the session's TTL plus a second. A member cut off from this
// server cannot hear its LOSING, and stops acting on its session's local
// deadline, at most a TTL after its last renewal: its view of the shard
// then ends before its successor's begins (the second is for its timer,
// late on a loaded machine).
func (s *Server) ringDrain(ctx context.Context, id clientv3.LeaseID, asked int64) (time.Duration, error) {
	drain := time.Duration(asked) * time.Second
	if drain == 0 {
		drain = DefaultDrainSeconds * time.Second
	}
	ttl, err := s.cli.TimeToLive(ctx, id)
	if err != nil {
		return 0, fmt.Errorf("server: the session's TTL: %w: %w", errStoreUnavailable, err)
	}
	return max(drain, time.Duration(ttl.GrantedTTL+1)*time.Second), nil
}

// memberStopped is how a JoinRing stream ends when its member has
// stopped: OK after LeaveRing, SESSION_NOT_FOUND when its session ended,
// and otherwise with the member's error.
func (s *Server) memberStopped(name string, rm *ringMember) error {
	select {
	case <-rm.replaced:
		return inRing(name, rm.name, ErrRejoined)
	default:
	}
	err := rm.m.Err()
	switch {
	case errors.Is(err, token.ErrSessionExpired):
		return fmt.Errorf("%w: %w", ErrSessionNotFound, err)
	case errors.Is(err, ring.ErrLeft):
		return nil
	}
	return fmt.Errorf("server: ring %q: member %q stopped: %w: %w", name, rm.name, errStoreUnavailable, err)
}

// shardChange is the message of one change.
func shardChange(c ring.Change) *fencerv1.ShardChange {
	out := &fencerv1.ShardChange{Shard: c.Shard, Token: c.Token.String()}
	switch c.Kind {
	case ring.Gained:
		out.Kind = fencerv1.ShardChange_KIND_GAINED
	case ring.Losing:
		out.Kind = fencerv1.ShardChange_KIND_LOSING
		out.DrainMs = c.Drain.Milliseconds()
	case ring.Lost:
		out.Kind = fencerv1.ShardChange_KIND_LOST
	}
	return out
}

// recordBatch counts batch b of a member of principal p (holder holder)
// in ring name for the metrics and writes the audit records of its
// changes: "acquire" for a shard gained, "release" for a shard lost after
// LOSING (a hand-off), "lost" for a shard lost otherwise. A snapshot
// repeats what the member holds, so it is counted in the owned gauge
// only. owned is the member's count of shards before b, and the count
// after is returned; losing tracks the member's shards reported LOSING.
func (s *Server) recordBatch(ctx context.Context, p, holder, name string, b ring.Batch, owned int, losing map[string]bool) int {
	if b.Snapshot {
		clear(losing)
		owned = 0
		for _, c := range b.Changes {
			if c.Kind == ring.Gained {
				owned++
			}
		}
		return owned
	}
	for _, c := range b.Changes {
		lease := ring.ShardLease(name, c.Shard)
		attrs := []slog.Attr{slog.String("principal", p), slog.String("lease", lease), slog.String("token", c.Token.String()),
			slog.String("holder", holder), slog.String("ring", name), slog.String("shard", c.Shard)}
		switch c.Kind {
		case ring.Gained:
			owned++
			s.m.ringChanges.WithLabelValues(ringGained).Inc()
			s.audit.LogAttrs(ctx, slog.LevelInfo, "acquire", attrs...)
		case ring.Losing:
			losing[c.Shard] = true
			s.m.ringChanges.WithLabelValues(ringLosing).Inc()
		case ring.Lost:
			owned--
			s.m.ringChanges.WithLabelValues(ringLost).Inc()
			if losing[c.Shard] {
				delete(losing, c.Shard)
				s.audit.LogAttrs(ctx, slog.LevelInfo, "release", attrs...)
			} else {
				s.audit.LogAttrs(ctx, slog.LevelWarn, "lost", attrs...)
			}
		}
	}
	return owned
}

// running returns the member of session id in ring name that this server
// runs for principal p. Without one, it reads the session, to refuse a
// session that is not p's or has ended, and returns ErrNotJoinedHere.
func (s *Server) running(ctx context.Context, name string, id clientv3.LeaseID, p string) (*ringMember, error) {
	if rm := s.members.get(ringKey{id: id, ring: name}); rm != nil {
		if rm.principal != p {
			return nil, fmt.Errorf("%w: the session belongs to another principal", ErrPermissionDenied)
		}
		return rm, nil
	}
	if _, err := s.checkSession(ctx, id, p); err != nil {
		return nil, err
	}
	return nil, inRing(name, "", ErrNotJoinedHere)
}

// ReleaseShards implements FencerService.ReleaseShards, through the
// member's JoinRing stream on this server (ErrNotJoinedHere without one).
func (s *Server) ReleaseShards(ctx context.Context, req *fencerv1.ReleaseShardsRequest) (*fencerv1.ReleaseShardsResponse, error) {
	if err := validateReleaseShards(req); err != nil {
		return nil, err
	}
	name, p := req.GetRing(), principalOf(ctx)
	rm, err := s.running(ctx, name, clientv3.LeaseID(req.GetSessionId()), p)
	if err != nil {
		return nil, err
	}
	if err := s.checkShards(ctx, name, "shards", req.GetShards()...); err != nil {
		return nil, err
	}
	n, err := rm.m.Release(ctx, req.GetShards()...)
	if err != nil {
		return nil, inRing(name, "", err)
	}
	return &fencerv1.ReleaseShardsResponse{Released: int32(n)}, nil
}

// LeaveRing implements FencerService.LeaveRing, through the member's
// JoinRing stream on this server (ErrNotJoinedHere without one).
func (s *Server) LeaveRing(ctx context.Context, req *fencerv1.LeaveRingRequest) (*fencerv1.LeaveRingResponse, error) {
	if err := validateLeaveRing(req); err != nil {
		return nil, err
	}
	name, p := req.GetRing(), principalOf(ctx)
	id := clientv3.LeaseID(req.GetSessionId())
	rm, err := s.running(ctx, name, id, p)
	if err != nil {
		return nil, err
	}
	if err := rm.m.Leave(ctx); err != nil {
		return nil, inRing(name, rm.name, err)
	}
	s.audit.LogAttrs(ctx, slog.LevelInfo, "leave ring", slog.String("principal", p), slog.String("ring", name),
		slog.String("member", rm.name), slog.String("holder", holderName(p, id)))
	return &fencerv1.LeaveRingResponse{}, nil
}

// Owns implements FencerService.Owns: from the running member's memory
// when this server runs its JoinRing stream, and otherwise from one etcd
// read of the session key and the shard's holder key, owned when the
// holder key is the session's.
func (s *Server) Owns(ctx context.Context, req *fencerv1.OwnsRequest) (*fencerv1.OwnsResponse, error) {
	if err := validateOwns(req); err != nil {
		return nil, err
	}
	name, shard, p := req.GetRing(), req.GetShard(), principalOf(ctx)
	id := clientv3.LeaseID(req.GetSessionId())
	if err := s.checkShards(ctx, name, "shard", shard); err != nil {
		return nil, err
	}
	if rm := s.members.get(ringKey{id: id, ring: name}); rm != nil && rm.principal == p {
		if tok, ok := rm.m.Owns(shard); ok {
			return &fencerv1.OwnsResponse{Owned: true, Token: tok.String()}, nil
		}
		return &fencerv1.OwnsResponse{}, nil
	}
	lease := ring.ShardLease(name, shard)
	resp, err := s.cli.Txn(ctx).Then(clientv3.OpGet(s.sessionKey(id)), clientv3.OpGet(holderkey.Key(s.store.Prefix(), lease))).Commit()
	if err != nil {
		return nil, fmt.Errorf("server: read shard %q of ring %q: %w", shard, name, err)
	}
	if err := sessionOwner(resp.Responses[0].GetResponseRange().Kvs, p); err != nil {
		return nil, err
	}
	kvs := resp.Responses[1].GetResponseRange().Kvs
	if len(kvs) == 0 || clientv3.LeaseID(kvs[0].Lease) != id {
		return &fencerv1.OwnsResponse{}, nil
	}
	tok, holder := holderkey.Of(lease, kvs[0])
	if holder != holderName(p, id) {
		return &fencerv1.OwnsResponse{}, nil
	}
	return &fencerv1.OwnsResponse{Owned: true, Token: tok.String()}, nil
}
