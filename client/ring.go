package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
	"github.com/fencer-dev/fencer/token"
)

// CreateRing defines ring with the named shards, and reports whether it
// created it: creating a ring that exists with the same shards changes
// nothing and returns false; with other shards it fails with an error
// matching ErrRingConflict. The shards are divided among the members
// that join the ring (Session.JoinRing).
func (c *Client) CreateRing(ctx context.Context, ring string, shards ...string) (bool, error) {
	return c.createRing(ctx, &fencerv1.CreateRingRequest{Ring: ring, Shards: shards})
}

// CreateRingCount is CreateRing with count shards named "0" to
// "<count-1>".
func (c *Client) CreateRingCount(ctx context.Context, ring string, count int) (bool, error) {
	if count < 1 || count > 100000 {
		return false, &token.ArgumentError{Arg: "shard_count", Value: strconv.Itoa(count), Reason: "must be 1 to 100000"}
	}
	return c.createRing(ctx, &fencerv1.CreateRingRequest{Ring: ring, ShardCount: int32(count)})
}

func (c *Client) createRing(ctx context.Context, req *fencerv1.CreateRingRequest) (bool, error) {
	resp, err := c.rpc.CreateRing(ctx, req)
	if err != nil {
		return false, fromStatus(err)
	}
	return resp.GetCreated(), nil
}

// RingStatus is a ring's state at one etcd revision.
type RingStatus struct {
	// Shards is the number of the ring's shards.
	Shards int
	// Members are the ring's members, ordered by name.
	Members []RingMember
	// Unowned counts the shards no member owns.
	Unowned int
	// Revision is the etcd revision of the reads.
	Revision int64
}

// RingMember is one member of a ring, as RingStatus reports it.
type RingMember struct {
	// Member is the member's name.
	Member string
	// Holder is the holder identity of its session ("another principal"
	// for a member of another principal).
	Holder string
	// Leaving is true once the member has called Leave.
	Leaving bool
	// Owned counts the shards it owns.
	Owned int
}

// RingStatus reads ring's members, how many shards each owns, and how many
// have no owner, at one etcd revision. A ring that was never created
// yields an error matching ErrRingNotFound.
func (c *Client) RingStatus(ctx context.Context, ring string) (RingStatus, error) {
	resp, err := c.rpc.RingStatus(ctx, &fencerv1.RingStatusRequest{Ring: ring})
	if err != nil {
		return RingStatus{}, fromStatus(err)
	}
	st := RingStatus{Shards: int(resp.GetShardCount()), Unowned: int(resp.GetUnowned()), Revision: resp.GetRevision()}
	for _, m := range resp.GetMembers() {
		st.Members = append(st.Members, RingMember{Member: m.GetMember(), Holder: m.GetHolder(), Leaving: m.GetLeaving(), Owned: int(m.GetOwned())})
	}
	return st, nil
}

// RingChangeKind is the kind of a RingChange.
type RingChangeKind int

const (
	// Gained: the member owns the shard, with the change's token.
	Gained RingChangeKind = iota + 1
	// Losing: the shard is assigned to another member. Stop acting for
	// it, then Release it; it is released anyway after the change's
	// Drain. Its token stays current until then.
	Losing
	// Lost: the member no longer owns the shard; the change's token is no
	// longer current.
	Lost
)

// String returns "gained", "losing" or "lost".
func (k RingChangeKind) String() string {
	switch k {
	case Gained:
		return "gained"
	case Losing:
		return "losing"
	case Lost:
		return "lost"
	}
	return "RingChangeKind(" + strconv.Itoa(int(k)) + ")"
}

// RingChange is one change of the shards a Ring's member owns.
type RingChange struct {
	// Kind is the kind of change.
	Kind RingChangeKind
	// Shard is the shard's name.
	Shard string
	// Token is the shard's token: the new one for Gained, the ending one
	// for Losing and Lost.
	Token token.Token
	// Drain is, for Losing, how long until the shard is released without
	// Release.
	Drain time.Duration
}

// RingOption configures a JoinRing.
type RingOption func(*fencerv1.JoinRingRequest)

// WithMember sets the member's name in the ring, 1 to 128 bytes without
// spaces, control characters or "/". Rendezvous hashing assigns shards
// by name, so a worker that joins again under its old name gets its old
// shards back. A name is held by one session at a time. The default is
// derived from the session's holder identity.
func WithMember(name string) RingOption {
	return func(r *fencerv1.JoinRingRequest) { r.Member = name }
}

// WithDrain sets how long a shard reported Losing waits for Release
// before it is released anyway: 0 (the server's default, 5s) to 10
// minutes, in whole seconds (rounded up). The server never drains for
// less than the session's TTL plus a second, so that a member cut off
// from it has stopped on its own deadline before the shard moves.
func WithDrain(d time.Duration) RingOption {
	return func(r *fencerv1.JoinRingRequest) { r.DrainSeconds = int64((d + time.Second - 1) / time.Second) }
}

// Errors that end a Ring, besides its session's.
var (
	// ErrRingLeft ends a Ring whose Leave has handed off every shard.
	ErrRingLeft = errors.New("client: left the ring")
	// ErrRingClosed ends a Ring after Close.
	ErrRingClosed = errors.New("client: ring closed")
)

// Ring is a Session's membership of a ring: the shards the member owns,
// each with its token, kept current from the server's JoinRing stream.
// Owns answers from memory. Methods are safe for concurrent use.
//
// When the stream breaks for a reason that may pass (the server, or its
// etcd, is unavailable or restarting), the Ring joins again with its
// session, with jittered backoff (200 ms doubling to 5 s, on the client's
// clock), and compares the server's new snapshot with what it owned: a
// shard missing from it, or held now with another token, is reported
// Lost (with its old token) and the new one Gained, so no change is
// missed while it reconnects. Until then Owns answers from what the Ring
// last knew; the tokens fence every write regardless.
//
// The Ring ends when Leave has handed off everything (ErrRingLeft), on
// Close (ErrRingClosed), when its session ends (the session's error), and
// on an error that does not pass (such as another JoinRing of the same
// session and ring, which replaces this one). Once it ends, Owns reports
// nothing, and each shard it still owned is reported Lost.
type Ring struct {
	sess *Session
	ring string
	req  *fencerv1.JoinRingRequest // the request of the next join, with the session's id

	ctx    context.Context // done when the Ring ends; its cause is Err's value
	cancel context.CancelCauseFunc
	done   chan struct{} // closed when run has returned

	mu     sync.Mutex
	member string
	owned  map[string]token.Token
	losing map[string]bool
	queue  []RingChange // changes not yet handed to Changes
	more   chan struct{}
	ended  bool // run has returned: pump closes changes once the queue is empty

	changes   chan RingChange
	stop      chan struct{} // closed by Close: pump drops what is queued
	closeOnce sync.Once
}

// JoinRing makes the session a member of ring and returns the Ring once
// the server has sent the first snapshot of the shards the member owns.
// A session that is not open yet is opened by the call, as an
// acquisition opens it, and kept alive from then on. The ring must have
// been created (CreateRing); otherwise the error matches ErrRingNotFound.
// A member name held by another session yields an error matching
// ErrRingConflict.
//
// Close or Leave the Ring when done; closing the Session ends it too.
func (s *Session) JoinRing(ctx context.Context, ring string, opts ...RingOption) (*Ring, error) {
	if err := s.Err(); err != nil {
		return nil, err
	}
	req := &fencerv1.JoinRingRequest{Ring: ring}
	for _, o := range opts {
		o(req)
	}
	id := s.ID()
	if id == 0 {
		s.open.Lock()
		defer s.open.Unlock()
		id = s.ID()
	}
	req.SessionId = id
	if id == 0 {
		req.TtlSeconds = int64(s.ttl / time.Second)
	}
	r := &Ring{sess: s, ring: ring, owned: map[string]token.Token{}, losing: map[string]bool{},
		more: make(chan struct{}, 1), changes: make(chan RingChange), done: make(chan struct{}), stop: make(chan struct{})}
	r.ctx, r.cancel = context.WithCancelCause(s.ctx)
	sctx, cancelStream := context.WithCancel(r.ctx)
	sent := s.c.clock.Now()
	stream, first, err := r.join(sctx, ctx, req)
	if err != nil {
		cancelStream()
		r.cancel(err)
		return nil, err
	}
	if id == 0 {
		// The server renewed the new session until it sent the snapshot;
		// see acquire.
		ttl := time.Duration(first.GetTtlSeconds()) * time.Second
		deadline := sent.Add(ttl)
		if d := s.c.clock.Now().Add(ttl / 2); d.After(deadline) {
			deadline = d
		}
		if renewed := s.start(first.GetSessionId(), first.GetSessionSecret(), deadline, first.GetRevision()); renewed != nil {
			select {
			case <-renewed:
			case <-s.ctx.Done():
				cancelStream()
				r.cancel(s.Err())
				return nil, s.Err()
			}
		}
	}
	req.SessionId, req.TtlSeconds = first.GetSessionId(), 0
	r.req = req
	r.apply(first)
	go r.pump()
	go r.run(stream, cancelStream)
	return r, nil
}

// join opens a JoinRing stream on sctx and waits, within ctx, for its
// first message: the snapshot.
func (r *Ring) join(sctx, ctx context.Context, req *fencerv1.JoinRingRequest) (fencerv1.FencerService_JoinRingClient, *fencerv1.JoinRingResponse, error) {
	stream, err := r.sess.c.rpc.JoinRing(sctx, req)
	if err != nil {
		return nil, nil, fromStatus(err)
	}
	type result struct {
		msg *fencerv1.JoinRingResponse
		err error
	}
	got := make(chan result, 1)
	go func() {
		msg, err := recvBatch(stream)
		got <- result{msg, err}
	}()
	select {
	case res := <-got:
		if res.err != nil {
			return nil, nil, fromStatus(res.err)
		}
		if !res.msg.GetSnapshot() {
			return nil, nil, fmt.Errorf("client: join ring %q: the server's first message is not a snapshot", req.GetRing())
		}
		return stream, res.msg, nil
	case <-ctx.Done():
		return nil, nil, ctx.Err()
	}
}

// run follows the Ring's streams until the Ring ends: it applies each
// message, and joins again after an error that may pass (UNAVAILABLE).
func (r *Ring) run(stream fencerv1.FencerService_JoinRingClient, cancelStream context.CancelFunc) {
	defer close(r.done)
	retry := r.sess.retry(retryMax)
	for {
		err := r.follow(stream)
		cancelStream()
		for {
			switch {
			case r.ctx.Err() != nil:
				r.finish(context.Cause(r.ctx))
				return
			case err == nil:
				r.finish(ErrRingLeft)
				return
			case status.Code(err) != codes.Unavailable:
				if errors.Is(err, token.ErrSessionExpired) {
					r.sess.end(err)
				}
				r.finish(err)
				return
			}
			if !r.pause(retry.NextBackOff()) {
				continue
			}
			if h := r.sess.hooks.JoinRing; h != nil {
				h(r.ring)
			}
			var sctx context.Context
			sctx, cancelStream = context.WithCancel(r.ctx)
			var first *fencerv1.JoinRingResponse
			if stream, first, err = r.join(sctx, r.ctx, r.req); err != nil {
				cancelStream()
				continue
			}
			retry.Reset()
			r.apply(first)
			break
		}
	}
}

// pause waits d on the client's clock and reports false if the Ring
// ended first.
func (r *Ring) pause(d time.Duration) bool {
	t := r.sess.c.clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-r.ctx.Done():
		return false
	case <-t.C():
	}
	return true
}

// follow applies the messages of stream until it ends: nil when the
// server ended it with OK (the member has left).
func (r *Ring) follow(stream fencerv1.FencerService_JoinRingClient) error {
	for {
		msg, err := recvBatch(stream)
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return fromStatus(err)
		}
		r.apply(msg)
	}
}

// recvBatch receives one batch of stream: one message, or the messages of
// a batch the server split (JoinRingResponse.more), joined into the
// first. A stream that ends inside a batch returns the error, and the
// partial batch is dropped.
func recvBatch(stream fencerv1.FencerService_JoinRingClient) (*fencerv1.JoinRingResponse, error) {
	msg, err := stream.Recv()
	if err != nil {
		return nil, err
	}
	for next := msg; next.GetMore(); {
		if next, err = stream.Recv(); err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return nil, err
		}
		msg.Changes = append(msg.Changes, next.GetChanges()...)
		msg.Revision = next.GetRevision()
	}
	msg.More = false
	return msg, nil
}

// apply applies one message of the stream to the Ring's view and queues
// its changes. A snapshot is compared with the view: what the view owned
// and the snapshot does not (or with another token) is reported Lost,
// what the snapshot adds is reported Gained.
func (r *Ring) apply(msg *fencerv1.JoinRingResponse) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if m := msg.GetMember(); m != "" {
		r.member = m
	}
	var out []RingChange
	if msg.GetSnapshot() {
		now := make(map[string]token.Token, len(msg.GetChanges()))
		for _, c := range msg.GetChanges() {
			if tok, err := token.Parse(c.GetToken()); err == nil && c.GetKind() == fencerv1.ShardChange_KIND_GAINED {
				now[c.GetShard()] = tok
			}
		}
		for shard, tok := range r.owned {
			if n, ok := now[shard]; !ok || n != tok {
				out = append(out, RingChange{Kind: Lost, Shard: shard, Token: tok})
				delete(r.owned, shard)
				delete(r.losing, shard)
			}
		}
		for shard, tok := range now {
			if _, ok := r.owned[shard]; !ok {
				r.owned[shard] = tok
				out = append(out, RingChange{Kind: Gained, Shard: shard, Token: tok})
			}
		}
	}
	for _, c := range msg.GetChanges() {
		if msg.GetSnapshot() {
			break
		}
		tok, err := token.Parse(c.GetToken())
		if err != nil {
			continue
		}
		switch c.GetKind() {
		case fencerv1.ShardChange_KIND_GAINED:
			if old, ok := r.owned[c.GetShard()]; ok && old != tok {
				out = append(out, RingChange{Kind: Lost, Shard: c.GetShard(), Token: old})
			}
			r.owned[c.GetShard()] = tok
			delete(r.losing, c.GetShard())
			out = append(out, RingChange{Kind: Gained, Shard: c.GetShard(), Token: tok})
		case fencerv1.ShardChange_KIND_LOSING:
			if r.losing[c.GetShard()] {
				continue // reported again after a reconnect
			}
			r.losing[c.GetShard()] = true
			out = append(out, RingChange{Kind: Losing, Shard: c.GetShard(), Token: tok, Drain: time.Duration(c.GetDrainMs()) * time.Millisecond})
		case fencerv1.ShardChange_KIND_LOST:
			if old, ok := r.owned[c.GetShard()]; !ok || old != tok {
				continue // already reported, from a snapshot
			}
			delete(r.owned, c.GetShard())
			delete(r.losing, c.GetShard())
			out = append(out, RingChange{Kind: Lost, Shard: c.GetShard(), Token: tok})
		}
	}
	r.push(out)
}

// push queues changes for Changes. r.mu must be held.
func (r *Ring) push(changes []RingChange) {
	if len(changes) == 0 {
		return
	}
	r.queue = append(r.queue, changes...)
	select {
	case r.more <- struct{}{}:
	default:
	}
}

// finish ends the Ring with reason (the first reason wins): every shard
// it owned is reported Lost, and Changes closes once they are delivered.
func (r *Ring) finish(reason error) {
	r.cancel(reason)
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []RingChange
	for shard, tok := range r.owned {
		out = append(out, RingChange{Kind: Lost, Shard: shard, Token: tok})
	}
	r.owned, r.losing = map[string]token.Token{}, map[string]bool{}
	r.push(out)
	r.ended = true
	select {
	case r.more <- struct{}{}:
	default:
	}
}

// pump hands the queued changes to Changes, in order, and closes it once
// the Ring has ended and the queue is empty, or at once after Close.
func (r *Ring) pump() {
	defer close(r.changes)
	for {
		r.mu.Lock()
		q := r.queue
		r.queue = nil
		ended := r.ended
		r.mu.Unlock()
		for _, c := range q {
			select {
			case r.changes <- c:
			case <-r.stop:
				return
			}
		}
		if len(q) > 0 {
			continue
		}
		if ended {
			return
		}
		select {
		case <-r.more:
		case <-r.stop:
			return
		}
	}
}

// Name returns the member's name in the ring.
func (r *Ring) Name() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.member
}

// SessionID returns the id of the member's session.
func (r *Ring) SessionID() int64 { return r.req.GetSessionId() }

// Owns reports whether the member owns shard, and its token, from
// memory: no I/O. A shard reported Losing is owned until it is Lost. It
// reports nothing once the Ring or its session has ended. The answer may
// be stale when it returns: a write is fenced by the token, never by Owns.
func (r *Ring) Owns(shard string) (token.Token, bool) {
	if r.ctx.Err() != nil {
		return token.Token{}, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	tok, ok := r.owned[shard]
	return tok, ok
}

// CheckOwns asks the server whether the member owns shard now, and its
// token: the server that runs the member's stream answers from memory,
// another with one etcd read. Owns answers the same question without I/O
// from what the Ring has been told; both may be stale by the time they
// return, and a write is fenced by the token, never by either.
func (r *Ring) CheckOwns(ctx context.Context, shard string) (token.Token, bool, error) {
	resp, err := r.sess.c.rpc.Owns(ctx, &fencerv1.OwnsRequest{Ring: r.ring, SessionId: r.req.GetSessionId(), Shard: shard})
	if err != nil {
		return token.Token{}, false, fromStatus(err)
	}
	if !resp.GetOwned() {
		return token.Token{}, false, nil
	}
	tok, err := token.Parse(resp.GetToken())
	if err != nil {
		return token.Token{}, false, fmt.Errorf("client: owns %q of ring %q: server sent %w", shard, r.ring, err)
	}
	return tok, true, nil
}

// Owned returns the shards the member owns, with their tokens (nothing
// once the Ring has ended).
func (r *Ring) Owned() map[string]token.Token {
	out := map[string]token.Token{}
	if r.ctx.Err() != nil {
		return out
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for shard, tok := range r.owned {
		out[shard] = tok
	}
	return out
}

// Changes returns the channel of the member's changes, in order: first a
// Gained for each shard of the first snapshot, then each change as the
// server reports it (or as a new snapshot after a reconnect shows it). It
// is closed when the Ring has ended and every change has been received.
// Changes are queued, however slowly they are received; Owns does not
// wait for them.
func (r *Ring) Changes() <-chan RingChange { return r.changes }

// Release hands off shards reported Losing, once the caller has stopped
// acting for them, and returns how many it released. A shard the member
// owns but is not losing is not released (an error matching
// ErrNotLosing); one it does not own is ignored.
func (r *Ring) Release(ctx context.Context, shards ...string) (int, error) {
	resp, err := r.sess.c.rpc.ReleaseShards(ctx, &fencerv1.ReleaseShardsRequest{Ring: r.ring, SessionId: r.req.GetSessionId(), Shards: shards})
	if err != nil {
		return 0, fromStatus(err)
	}
	return int(resp.GetReleased()), nil
}

// Leave starts the member's departure: the other members stop counting
// it, and it hands off every shard, each reported Losing and then Lost.
// It returns at once; the Ring then ends with ErrRingLeft.
func (r *Ring) Leave(ctx context.Context) error {
	_, err := r.sess.c.rpc.LeaveRing(ctx, &fencerv1.LeaveRingRequest{Ring: r.ring, SessionId: r.req.GetSessionId()})
	return fromStatus(err)
}

// Close stops following the ring and ends the Ring with ErrRingClosed
// (if it has not ended already), and closes Changes, dropping the changes
// not yet received. The member keeps what it owns, gaining and handing
// off nothing, until its session ends or it joins again; to hand its
// shards off, Leave instead. Call Close when done with a Ring, also after
// it ended. Close is idempotent.
func (r *Ring) Close() {
	r.cancel(ErrRingClosed)
	r.closeOnce.Do(func() { close(r.stop) })
	<-r.done
}

// Done is closed when the Ring ends.
func (r *Ring) Done() <-chan struct{} { return r.ctx.Done() }

// Err returns nil while the Ring runs, and then why it ended: ErrRingLeft,
// ErrRingClosed, the session's error (token.ErrSessionClosed or
// token.ErrSessionExpired, wrapped), or the error the server ended its
// stream with.
func (r *Ring) Err() error {
	if r.ctx.Err() == nil {
		return nil
	}
	return context.Cause(r.ctx)
}
