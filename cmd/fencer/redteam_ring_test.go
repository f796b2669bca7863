package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/fencer-dev/fencer/client"
	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
	"github.com/fencer-dev/fencer/token"
)

// Red-team tests of rings, run against fencer serve (the binary) through
// the Go client, raw gRPC and the CLI. Each asserts the safe outcome; a
// failure is a hole.

// rrConn is a connection to a fencer serve, as the Go client and as raw
// gRPC, optionally with a bearer token.
type rrConn struct {
	c   *client.Client
	raw fencerv1.FencerServiceClient
}

// rrDial connects to s, with bearer token bearer if it is not empty.
func rrDial(t *testing.T, s *serveProc, bearer string) *rrConn {
	t.Helper()
	return rrDialAddr(t, s.addr, bearer)
}

// rrDialAddr connects to addr, with bearer token bearer if it is not
// empty.
func rrDialAddr(t *testing.T, addr, bearer string) *rrConn {
	t.Helper()
	opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if bearer != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(client.BearerToken(bearer, false)))
	}
	cc, err := grpc.NewClient(addr, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = cc.Close() })
	return &rrConn{c: client.New(cc), raw: fencerv1.NewFencerServiceClient(cc)}
}

// rrCtx is a context bounded for one test step.
func rrCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// rrMember is a Go-client member of a ring whose changes are recorded
// and, when autoRelease, released as soon as they are reported Losing.
type rrMember struct {
	name string
	sess *client.Session
	ring *client.Ring
	mu   sync.Mutex
	log  []client.RingChange
	done chan struct{}
}

// rrJoin joins ring as member name through a new session of c with ttl,
// following its changes until the test ends.
func rrJoin(t *testing.T, c *client.Client, ring, name string, ttl time.Duration, autoRelease bool, opts ...client.RingOption) *rrMember {
	t.Helper()
	sess, err := c.NewSession(client.WithTTL(ttl))
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = sess.Close(ctx)
	})
	r, err := sess.JoinRing(rrCtx(t), ring, append([]client.RingOption{client.WithMember(name), client.WithDrain(2 * time.Second)}, opts...)...)
	require.NoError(t, err, name)
	t.Cleanup(r.Close)
	m := &rrMember{name: name, sess: sess, ring: r, done: make(chan struct{})}
	go func() {
		defer close(m.done)
		for ch := range r.Changes() {
			m.mu.Lock()
			m.log = append(m.log, ch)
			m.mu.Unlock()
			if autoRelease && ch.Kind == client.Losing {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				_, _ = r.Release(ctx, ch.Shard)
				cancel()
			}
		}
	}()
	return m
}

// gainedTokens returns every token m was ever told Gained, by shard.
func (m *rrMember) gainedTokens() map[string][]token.Token {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string][]token.Token{}
	for _, ch := range m.log {
		if ch.Kind == client.Gained {
			out[ch.Shard] = append(out[ch.Shard], ch.Token)
		}
	}
	return out
}

// rrStale asserts that err is a stale-token refusal.
func rrStale(t *testing.T, err error, msgAndArgs ...any) {
	t.Helper()
	require.Error(t, err, msgAndArgs...)
	require.True(t, errors.Is(err, token.ErrStale), "want stale, got %v %v", err, fmt.Sprint(msgAndArgs...))
}

// rrReleaseTok is a Release of tok, as anyone holding it may.
func rrReleaseTok(tok string) *fencerv1.ReleaseRequest {
	return &fencerv1.ReleaseRequest{Target: &fencerv1.ReleaseRequest_Token{Token: tok}}
}

// rrCode asserts that err is a gRPC error with code c.
func rrCode(t *testing.T, err error, c codes.Code, msgAndArgs ...any) {
	t.Helper()
	require.Error(t, err, msgAndArgs...)
	require.Equal(t, c, status.Code(err), "%v %v", err, fmt.Sprint(msgAndArgs...))
}

// rrValue reads key, "" when absent.
func rrValue(t *testing.T, c *client.Client, key string) string {
	t.Helper()
	v, found, err := c.Get(rrCtx(t), key)
	require.NoError(t, err)
	if !found {
		return ""
	}
	return string(v.Data)
}

// rrOwnedAll waits until members together own all n shards of ring, each
// once, each member owns at least one (when there are several), and
// the server reports none unowned.
func rrOwnedAll(t *testing.T, c *client.Client, ring string, n int, members ...*rrMember) {
	t.Helper()
	require.Eventually(t, func() bool {
		seen := map[string]int{}
		for _, m := range members {
			if len(members) > 1 && len(m.ring.Owned()) == 0 {
				return false
			}
			for sh := range m.ring.Owned() {
				seen[sh]++
			}
		}
		if len(seen) != n {
			return false
		}
		for _, k := range seen {
			if k != 1 {
				return false
			}
		}
		st, err := c.RingStatus(rrCtx(t), ring)
		return err == nil && st.Unowned == 0
	}, 30*time.Second, 20*time.Millisecond, "ring %s never settled", ring)
}

// TestRedTeamRingShardLeaseIsNotAPlainLease: a ring's shard lease
// (ring:<ring>:<shard>) cannot be acquired with a plain Acquire (owned or
// not, ring created or not, through a session that is a member or not),
// nor released with Release of its token; the member keeps it and its
// token stays current.
func TestRedTeamRingShardLeaseIsNotAPlainLease(t *testing.T) {
	s := startServeProc(t)
	cn := rrDial(t, s, "")
	ctx := rrCtx(t)
	_, err := cn.c.CreateRing(ctx, "rt", "a", "b:c", "ring:x")
	require.NoError(t, err)
	m := rrJoin(t, cn.c, "rt", "w1", 10*time.Second, true)
	rrOwnedAll(t, cn.c, "rt", 3, m)
	tokA, ok := m.ring.Owns("a")
	require.True(t, ok)

	for _, name := range []string{"ring:rt:a", "ring:rt:b:c", "ring:rt:ring:x", "ring:rt:zzz", "ring:nope:0", "ring:", "ring:rt:"} {
		_, err := cn.raw.Acquire(ctx, &fencerv1.AcquireRequest{Name: name})
		rrCode(t, err, codes.InvalidArgument, name)
		// Through the member's own session.
		_, err = cn.raw.Acquire(ctx, &fencerv1.AcquireRequest{Name: name, SessionId: m.ring.SessionID()})
		rrCode(t, err, codes.InvalidArgument, name)
	}
	// Names that look alike but are not the shard lease are plain leases
	// and do not touch the shard.
	for _, name := range []string{"Ring:rt:a", "ring-rt-a", "xring:rt:a"} {
		r, err := cn.raw.Acquire(ctx, &fencerv1.AcquireRequest{Name: name})
		if err == nil {
			_, _ = cn.raw.Release(ctx, &fencerv1.ReleaseRequest{Target: &fencerv1.ReleaseRequest_SessionId{SessionId: r.GetSessionId()}})
		}
	}
	// Release of the shard's token, with or without the member's session.
	_, err = cn.raw.Release(ctx, rrReleaseTok(tokA.String()))
	rrCode(t, err, codes.InvalidArgument)
	_, err = cn.raw.Release(ctx, &fencerv1.ReleaseRequest{Target: &fencerv1.ReleaseRequest_Token{Token: tokA.String()}, HolderSessionId: m.ring.SessionID()})
	rrCode(t, err, codes.InvalidArgument)
	_, err = cn.c.Release(ctx, tokA)
	require.Error(t, err)

	require.NoError(t, cn.c.Check(ctx, tokA), "the shard's token stopped being current")
	got, ok, err := m.ring.CheckOwns(ctx, "a")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, tokA, got)
	// The token still fences writes.
	_, err = cn.c.Put(ctx, tokA, "rt/a", []byte("w1"))
	require.NoError(t, err)
}

// TestRedTeamRingMovedShardRefusesFormerOwner: a shard moved to a new
// member by a join refuses every guarded call with the former owner's
// token (Put, Delete, Txn, Advance, Check, a Txn whose compare would
// fail, an empty Txn), however late, and keeps the new owner's write;
// the former owner's token released by ReleaseShards stays stale after
// it asks for the shard again.
func TestRedTeamRingMovedShardRefusesFormerOwner(t *testing.T) {
	s := startServeProc(t)
	cn := rrDial(t, s, "")
	ctx := rrCtx(t)
	_, err := cn.c.CreateRingCount(ctx, "mv", 8)
	require.NoError(t, err)
	a := rrJoin(t, cn.c, "mv", "a", 10*time.Second, true)
	rrOwnedAll(t, cn.c, "mv", 8, a)
	old := a.ring.Owned()
	for sh, tok := range old {
		_, err := cn.c.Put(ctx, tok, "mv/"+sh, []byte("a"))
		require.NoError(t, err)
	}
	b := rrJoin(t, cn.c, "mv", "b", 10*time.Second, true)
	rrOwnedAll(t, cn.c, "mv", 8, a, b)
	moved := b.ring.Owned()
	require.NotEmpty(t, moved, "b gained nothing: the test needs a move")
	for sh, tok := range moved {
		_, err := cn.c.Put(ctx, tok, "mv/"+sh, []byte("b"), client.TakeOver())
		require.NoError(t, err, sh)
	}
	for sh := range moved {
		stale := old[sh]
		key := "mv/" + sh
		_, err := cn.c.Put(ctx, stale, key, []byte("late"))
		rrStale(t, err, "put", sh)
		_, err = cn.c.Put(ctx, stale, key, []byte("late"), client.TakeOver())
		rrStale(t, err, "put take-over", sh)
		_, err = cn.c.Put(ctx, stale, "mv/fresh-"+sh, []byte("late"))
		rrStale(t, err, "put of a fresh key", sh)
		_, err = cn.c.Delete(ctx, stale, key)
		rrStale(t, err, "delete", sh)
		err = cn.c.Advance(ctx, "mv-res-"+sh, stale)
		rrStale(t, err, "advance", sh)
		rrStale(t, cn.c.Check(ctx, stale), "check", sh)
		put := &fencerv1.Op{Op: &fencerv1.Op_Put{Put: &fencerv1.PutOp{Key: key, Value: []byte("late")}}}
		_, err = cn.c.Txn(ctx, stale, nil, []*fencerv1.Op{put}, []*fencerv1.Op{put})
		rrStale(t, err, "txn", sh)
		_, err = cn.c.Txn(ctx, stale, nil, nil, nil)
		rrStale(t, err, "empty txn", sh)
		for _, v := range []string{"b", "a", "x"} {
			cmp := &fencerv1.Compare{Key: key, Target: fencerv1.Compare_TARGET_VALUE, Result: fencerv1.Compare_RESULT_EQUAL, Value: []byte(v)}
			_, err = cn.c.Txn(ctx, stale, []*fencerv1.Compare{cmp}, []*fencerv1.Op{put}, []*fencerv1.Op{put}, client.TakeOver())
			rrStale(t, err, "txn with a compare", sh, v)
		}
		// Raw Put with the stale token, as a retried request would be.
		_, err = cn.raw.Put(ctx, &fencerv1.PutRequest{Token: stale.String(), Key: key, Value: []byte("late")})
		require.Error(t, err)
		require.Equal(t, "b", rrValue(t, cn.c, key), sh)
		require.Equal(t, "", rrValue(t, cn.c, "mv/fresh-"+sh))
		// The new owner's token is current, and greater.
		require.NoError(t, cn.c.Check(ctx, moved[sh]))
		c, err := moved[sh].Compare(stale)
		require.NoError(t, err)
		require.Positive(t, c, sh)
	}
	// Shards a kept are untouched, with their old tokens.
	for sh, tok := range a.ring.Owned() {
		require.Equal(t, old[sh], tok, sh)
		require.NoError(t, cn.c.Check(ctx, tok))
	}
}

// TestRedTeamRingReleaseShardsMisuse: ReleaseShards of a shard the
// member owns and is not losing is refused and releases nothing; of
// another member's shard, of an unknown shard, through another session
// (of the same principal) or a session that is not a member, it releases
// nothing; every owner keeps its shards and tokens.
func TestRedTeamRingReleaseShardsMisuse(t *testing.T) {
	s := startServeProc(t)
	cn := rrDial(t, s, "")
	ctx := rrCtx(t)
	_, err := cn.c.CreateRingCount(ctx, "rel", 16)
	require.NoError(t, err)
	a := rrJoin(t, cn.c, "rel", "a", 10*time.Second, false)
	b := rrJoin(t, cn.c, "rel", "b", 10*time.Second, true)
	rrOwnedAll(t, cn.c, "rel", 16, a, b)
	aOwn, bOwn := a.ring.Owned(), b.ring.Owned()
	require.NotEmpty(t, aOwn)
	require.NotEmpty(t, bOwn)
	var aShard, bShard string
	for sh := range aOwn {
		aShard = sh
	}
	for sh := range bOwn {
		bShard = sh
	}

	n, err := a.ring.Release(ctx, aShard)
	require.ErrorIs(t, err, client.ErrNotLosing)
	require.Zero(t, n)
	n, _ = a.ring.Release(ctx, bShard)
	require.Zero(t, n, "a released b's shard")
	// Raw: a's session naming b's shard, b's session naming b's shard
	// (from a's connection), an unknown shard, a non-member session.
	for _, req := range []*fencerv1.ReleaseShardsRequest{
		{Ring: "rel", SessionId: a.ring.SessionID(), Shards: []string{bShard}},
		{Ring: "rel", SessionId: b.ring.SessionID(), Shards: []string{bShard}},
		{Ring: "rel", SessionId: a.ring.SessionID(), Shards: []string{bShard, bShard, aShard}},
		{Ring: "rel", SessionId: a.ring.SessionID(), Shards: []string{"nope"}},
		{Ring: "rel", SessionId: 12345, Shards: []string{aShard}},
		{Ring: "rel", SessionId: 0, Shards: []string{aShard}},
		{Ring: "rel", SessionId: -1, Shards: []string{aShard}},
		{Ring: "rel", SessionId: a.ring.SessionID()},
		{Ring: "nope", SessionId: a.ring.SessionID(), Shards: []string{aShard}},
	} {
		r, err := cn.raw.ReleaseShards(ctx, req)
		require.Zero(t, r.GetReleased(), "%v: %v", req, err)
	}
	// A session of the member's principal that is not a member.
	other, err := cn.c.NewSession()
	require.NoError(t, err)
	t.Cleanup(func() { _ = other.Close(context.Background()) })
	l, err := other.Acquire(ctx, "plain")
	require.NoError(t, err)
	_ = l
	r, err := cn.raw.ReleaseShards(ctx, &fencerv1.ReleaseShardsRequest{Ring: "rel", SessionId: other.ID(), Shards: []string{aShard, bShard}})
	require.Zero(t, r.GetReleased(), "%v", err)

	time.Sleep(500 * time.Millisecond)
	require.Equal(t, aOwn, a.ring.Owned())
	require.Equal(t, bOwn, b.ring.Owned())
	for _, own := range []map[string]token.Token{aOwn, bOwn} {
		for sh, tok := range own {
			require.NoError(t, cn.c.Check(ctx, tok), sh)
		}
	}
	st, err := cn.c.RingStatus(ctx, "rel")
	require.NoError(t, err)
	require.Zero(t, st.Unowned)
}

// TestRedTeamRingLeaveThenWrite: after LeaveRing has handed off every
// shard, the member's tokens are refused, and the shards go to the other
// member, whose writes stand. LeaveRing of another session of the same
// principal, or of a session that is not a member, is refused or
// changes nothing.
func TestRedTeamRingLeaveThenWrite(t *testing.T) {
	s := startServeProc(t)
	cn := rrDial(t, s, "")
	ctx := rrCtx(t)
	_, err := cn.c.CreateRingCount(ctx, "lv", 6)
	require.NoError(t, err)
	a := rrJoin(t, cn.c, "lv", "a", 10*time.Second, true)
	rrOwnedAll(t, cn.c, "lv", 6, a)
	old := a.ring.Owned()
	b := rrJoin(t, cn.c, "lv", "b", 10*time.Second, true)
	rrOwnedAll(t, cn.c, "lv", 6, a, b)
	old = a.ring.Owned()
	require.NotEmpty(t, old)

	// A LeaveRing naming a session that is not a member of the ring.
	_, err = cn.raw.LeaveRing(ctx, &fencerv1.LeaveRingRequest{Ring: "lv", SessionId: 999999})
	require.Error(t, err)
	_, err = cn.raw.LeaveRing(ctx, &fencerv1.LeaveRingRequest{Ring: "nope", SessionId: a.ring.SessionID()})
	require.Error(t, err)

	require.NoError(t, a.ring.Leave(ctx))
	select {
	case <-a.ring.Done():
	case <-time.After(20 * time.Second):
		t.Fatal("leave did not end the ring")
	}
	require.ErrorIs(t, a.ring.Err(), client.ErrRingLeft)
	rrOwnedAll(t, cn.c, "lv", 6, b)
	for sh, tok := range b.ring.Owned() {
		_, err := cn.c.Put(ctx, tok, "lv/"+sh, []byte("b"), client.TakeOver())
		require.NoError(t, err)
	}
	for sh, tok := range old {
		_, err := cn.c.Put(ctx, tok, "lv/"+sh, []byte("a-late"), client.TakeOver())
		rrStale(t, err, sh)
		require.Equal(t, "b", rrValue(t, cn.c, "lv/"+sh))
	}
	// Leaving again, and joining again through the left session, do not
	// revive the old tokens.
	_, _ = cn.raw.LeaveRing(ctx, &fencerv1.LeaveRingRequest{Ring: "lv", SessionId: a.ring.SessionID()})
	for sh, tok := range old {
		rrStale(t, cn.c.Check(ctx, tok), sh)
	}
}

// TestRedTeamRingMemberNameTaken: a member name held by a live session
// is refused to another session (RING_CONFLICT), whatever the drain or
// TTL asked, and the holder keeps its shards and tokens.
func TestRedTeamRingMemberNameTaken(t *testing.T) {
	s := startServeProc(t)
	cn := rrDial(t, s, "")
	cn2 := rrDial(t, s, "")
	ctx := rrCtx(t)
	_, err := cn.c.CreateRingCount(ctx, "nm", 4)
	require.NoError(t, err)
	a := rrJoin(t, cn.c, "nm", "w", 10*time.Second, true)
	rrOwnedAll(t, cn.c, "nm", 4, a)
	old := a.ring.Owned()

	for _, c := range []*rrConn{cn, cn2} {
		sess, err := c.c.NewSession(client.WithTTL(3 * time.Second))
		require.NoError(t, err)
		t.Cleanup(func() { _ = sess.Close(context.Background()) })
		_, err = sess.JoinRing(ctx, "nm", client.WithMember("w"))
		require.ErrorIs(t, err, client.ErrRingConflict)
		stream, err := c.raw.JoinRing(ctx, &fencerv1.JoinRingRequest{Ring: "nm", Member: "w", TtlSeconds: 2, DrainSeconds: 600})
		require.NoError(t, err)
		_, err = stream.Recv()
		rrCode(t, err, codes.AlreadyExists)
	}
	time.Sleep(300 * time.Millisecond)
	require.Equal(t, old, a.ring.Owned())
	for sh, tok := range old {
		require.NoError(t, cn.c.Check(ctx, tok), sh)
	}
	st, err := cn.c.RingStatus(ctx, "nm")
	require.NoError(t, err)
	require.Len(t, st.Members, 1)
}

// TestRedTeamRingSameSessionJoinedTwice: a second JoinRing of the same
// session (from another connection) ends the first stream with
// ABORTED; the member owns each shard once, and its tokens stay current
// (one session holds them).
func TestRedTeamRingSameSessionJoinedTwice(t *testing.T) {
	s := startServeProc(t)
	cn := rrDial(t, s, "")
	cn2 := rrDial(t, s, "")
	ctx := rrCtx(t)
	_, err := cn.c.CreateRingCount(ctx, "tw", 4)
	require.NoError(t, err)
	s1, err := cn.raw.JoinRing(ctx, &fencerv1.JoinRingRequest{Ring: "tw", Member: "w", TtlSeconds: 10})
	require.NoError(t, err)
	first, err := s1.Recv()
	require.NoError(t, err)
	sid := first.GetSessionId()
	require.NotZero(t, sid)
	// Keep the session alive from this side.
	ka, err := cn.raw.KeepAlive(ctx)
	require.NoError(t, err)
	go func() {
		for {
			if ka.Send(&fencerv1.KeepAliveRequest{SessionId: sid}) != nil {
				return
			}
			if _, err := ka.Recv(); err != nil {
				return
			}
			time.Sleep(time.Second)
		}
	}()
	s2, err := cn2.raw.JoinRing(ctx, &fencerv1.JoinRingRequest{Ring: "tw", SessionId: sid, Member: "w"})
	require.NoError(t, err)
	snap2, err := s2.Recv()
	require.NoError(t, err)
	require.True(t, snap2.GetSnapshot())
	// The first stream ends ABORTED (after whatever it still had to say).
	var endErr error
	for endErr == nil {
		_, endErr = s1.Recv()
	}
	rrCode(t, endErr, codes.Aborted)
	// A second join under another name through the same session, in the
	// same ring, must not make the session two members.
	s3, err := cn2.raw.JoinRing(ctx, &fencerv1.JoinRingRequest{Ring: "tw", SessionId: sid, Member: "w-other"})
	require.NoError(t, err)
	_, err3 := s3.Recv()
	t.Logf("join of the same session under another name: %v", err3)
	st, err := cn.c.RingStatus(ctx, "tw")
	require.NoError(t, err)
	total := 0
	for _, m := range st.Members {
		total += m.Owned
	}
	require.LessOrEqual(t, total, 4, "%+v", st)
}

// TestRedTeamRingOneShardFiveMembersChurn: one shard, five members
// joining, leaving and closing their sessions in turn, each writing the
// shard's key with every token it is told Gained. Every successful
// write's token is at least every earlier successful write's (by etcd
// revision order), so a superseded member's write never lands after a
// newer owner's; and once the churn stops the shard is owned.
func TestRedTeamRingOneShardFiveMembersChurn(t *testing.T) {
	s := startServeProc(t)
	cn := rrDial(t, s, "")
	ctx := rrCtx(t)
	_, err := cn.c.CreateRingCount(ctx, "one", 1)
	require.NoError(t, err)

	type write struct {
		rev int64
		tok token.Token
	}
	var (
		wmu    sync.Mutex
		writes []write
		stop   = make(chan struct{})
		wg     sync.WaitGroup
	)
	// writer puts with tok in a loop until stop, recording successes.
	writer := func(tok token.Token) {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			rev, err := cn.c.Put(context.Background(), tok, "one/k", []byte(tok.String()), client.TakeOver())
			if err == nil {
				wmu.Lock()
				writes = append(writes, write{rev, tok})
				wmu.Unlock()
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	type live struct {
		sess *client.Session
		ring *client.Ring
	}
	join := func(name string, release bool) *live {
		sess, err := cn.c.NewSession(client.WithTTL(3 * time.Second))
		require.NoError(t, err)
		r, err := sess.JoinRing(rrCtx(t), "one", client.WithMember(name), client.WithDrain(time.Second))
		require.NoError(t, err)
		go func() {
			for ch := range r.Changes() {
				switch ch.Kind {
				case client.Gained:
					wg.Add(1)
					go writer(ch.Token)
				case client.Losing:
					if release {
						_, _ = r.Release(context.Background(), ch.Shard)
					}
				}
			}
		}()
		return &live{sess, r}
	}
	members := map[string]*live{}
	names := []string{"m0", "m1", "m2", "m3", "m4"}
	for i, n := range names {
		members[n] = join(n, i%2 == 0)
	}
	deadline := time.Now().Add(6 * time.Second)
	for i := 0; time.Now().Before(deadline); i++ {
		n := names[i%len(names)]
		m := members[n]
		switch i % 3 {
		case 0:
			lctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = m.ring.Leave(lctx)
			cancel()
			<-m.ring.Done()
			_ = m.sess.Close(context.Background())
		case 1:
			_ = m.sess.Close(context.Background())
		case 2:
			m.ring.Close()
			_ = m.sess.Close(context.Background())
		}
		members[n] = join(n, i%2 == 1)
		time.Sleep(300 * time.Millisecond)
	}
	// Let the last moves settle, then stop writing.
	require.Eventually(t, func() bool {
		st, err := cn.c.RingStatus(rrCtx(t), "one")
		return err == nil && st.Unowned == 0
	}, 20*time.Second, 50*time.Millisecond, "the shard stayed unowned with five live members")
	time.Sleep(500 * time.Millisecond)
	close(stop)
	wg.Wait()
	for _, m := range members {
		m.ring.Close()
		_ = m.sess.Close(context.Background())
	}

	sort.Slice(writes, func(i, j int) bool { return writes[i].rev < writes[j].rev })
	require.NotEmpty(t, writes)
	owners := 1
	for i := 1; i < len(writes); i++ {
		c, err := writes[i].tok.Compare(writes[i-1].tok)
		require.NoError(t, err)
		require.GreaterOrEqual(t, c, 0, "a superseded token's write at revision %d (%s) landed after a newer token's at %d (%s)",
			writes[i].rev, writes[i].tok, writes[i-1].rev, writes[i-1].tok)
		if c > 0 {
			owners++
		}
	}
	t.Logf("%d writes by %d successive owners", len(writes), owners)
	last := writes[len(writes)-1]
	require.Equal(t, last.tok.String(), rrValue(t, cn.c, "one/k"))
}

// rrWriteFile writes content to dir/name and returns the path.
func rrWriteFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
	return p
}

// TestRedTeamRingAuthorization: with bearer tokens and an authz file,
// a principal without a grant of a ring is refused every ring call
// naming it, and a principal granted the same ring cannot act through
// another principal's session: join, release, leave, owns, nor write
// with its shard tokens; nor take its member name. Nothing changes for
// the victim.
func TestRedTeamRingAuthorization(t *testing.T) {
	dir := t.TempDir()
	tokens := rrWriteFile(t, dir, "tokens", "alice-token-0123456789 alice\nbob-token-0123456789ab bob\n")
	authz := rrWriteFile(t, dir, "authz.yaml", `principals:
  alice:
    leases: ["*"]
    read: ["*"]
    write: ["*"]
    resources: ["*"]
    rings: ["priv", "shared"]
  bob:
    leases: ["*"]
    read: ["*"]
    write: ["*"]
    resources: ["*"]
    rings: ["shared", "bobs"]
`)
	s := startServeProc(t, "--token-file", tokens, "--authz-file", authz)
	alice := rrDial(t, s, "alice-token-0123456789")
	bob := rrDial(t, s, "bob-token-0123456789ab")
	ctx := rrCtx(t)
	for _, r := range []string{"priv", "shared"} {
		_, err := alice.c.CreateRingCount(ctx, r, 4)
		require.NoError(t, err)
	}
	ap := rrJoin(t, alice.c, "priv", "a", 10*time.Second, true)
	as := rrJoin(t, alice.c, "shared", "a", 10*time.Second, true)
	rrOwnedAll(t, alice.c, "priv", 4, ap)
	rrOwnedAll(t, alice.c, "shared", 4, as)
	privOwn, sharedOwn := ap.ring.Owned(), as.ring.Owned()
	var privShard string
	for sh := range privOwn {
		privShard = sh
	}

	// Bob, without a grant of priv.
	_, err := bob.raw.CreateRing(ctx, &fencerv1.CreateRingRequest{Ring: "priv", ShardCount: 4})
	rrCode(t, err, codes.PermissionDenied)
	_, err = bob.raw.CreateRing(ctx, &fencerv1.CreateRingRequest{Ring: "priv2", ShardCount: 4})
	rrCode(t, err, codes.PermissionDenied)
	for _, req := range []*fencerv1.JoinRingRequest{
		{Ring: "priv", Member: "b"},
		{Ring: "priv", Member: "a"},
		{Ring: "priv", SessionId: ap.ring.SessionID()},
	} {
		st, err := bob.raw.JoinRing(ctx, req)
		if err == nil {
			_, err = st.Recv()
		}
		rrCode(t, err, codes.PermissionDenied, req)
	}
	_, err = bob.raw.ReleaseShards(ctx, &fencerv1.ReleaseShardsRequest{Ring: "priv", SessionId: ap.ring.SessionID(), Shards: []string{privShard}})
	rrCode(t, err, codes.PermissionDenied)
	_, err = bob.raw.LeaveRing(ctx, &fencerv1.LeaveRingRequest{Ring: "priv", SessionId: ap.ring.SessionID()})
	rrCode(t, err, codes.PermissionDenied)
	_, err = bob.raw.Owns(ctx, &fencerv1.OwnsRequest{Ring: "priv", SessionId: ap.ring.SessionID(), Shard: privShard})
	rrCode(t, err, codes.PermissionDenied)
	_, err = bob.raw.RingStatus(ctx, &fencerv1.RingStatusRequest{Ring: "priv"})
	rrCode(t, err, codes.PermissionDenied)
	_, err = bob.raw.Acquire(ctx, &fencerv1.AcquireRequest{Name: "ring:priv:" + privShard})
	require.Error(t, err)

	// Bob, granted shared as alice is: alice's session is not his.
	st, err := bob.raw.JoinRing(ctx, &fencerv1.JoinRingRequest{Ring: "shared", SessionId: as.ring.SessionID()})
	if err == nil {
		_, err = st.Recv()
	}
	rrCode(t, err, codes.PermissionDenied)
	var sharedShard string
	for sh := range sharedOwn {
		sharedShard = sh
	}
	r, err := bob.raw.ReleaseShards(ctx, &fencerv1.ReleaseShardsRequest{Ring: "shared", SessionId: as.ring.SessionID(), Shards: []string{sharedShard}})
	require.Error(t, err, "bob released alice's shard: %v", r)
	_, err = bob.raw.LeaveRing(ctx, &fencerv1.LeaveRingRequest{Ring: "shared", SessionId: as.ring.SessionID()})
	require.Error(t, err, "bob made alice's member leave")
	_, err = bob.raw.Owns(ctx, &fencerv1.OwnsRequest{Ring: "shared", SessionId: as.ring.SessionID(), Shard: sharedShard})
	rrCode(t, err, codes.PermissionDenied, "bob's Owns through alice's session")
	_, err = bob.raw.Release(ctx, &fencerv1.ReleaseRequest{Target: &fencerv1.ReleaseRequest_SessionId{SessionId: as.ring.SessionID()}})
	rrCode(t, err, codes.PermissionDenied, "bob revoked alice's member session")
	_, err = bob.raw.Release(ctx, &fencerv1.ReleaseRequest{Target: &fencerv1.ReleaseRequest_SessionId{SessionId: ap.ring.SessionID()}})
	rrCode(t, err, codes.PermissionDenied, "bob revoked alice's member session")
	// Bob taking alice's member name in shared is a conflict.
	bsess, err := bob.c.NewSession(client.WithTTL(3 * time.Second))
	require.NoError(t, err)
	t.Cleanup(func() { _ = bsess.Close(context.Background()) })
	_, err = bsess.JoinRing(ctx, "shared", client.WithMember("a"))
	require.ErrorIs(t, err, client.ErrRingConflict)
	// Bob writing with alice's shard tokens.
	for sh, tok := range sharedOwn {
		_, err := bob.c.Put(ctx, tok, "shared/"+sh, []byte("bob"), client.TakeOver())
		require.Error(t, err, sh)
		require.NotEqual(t, "bob", rrValue(t, alice.c, "shared/"+sh))
		err = bob.c.Advance(ctx, "res-"+sh, tok)
		require.Error(t, err, sh)
		put := &fencerv1.Op{Op: &fencerv1.Op_Put{Put: &fencerv1.PutOp{Key: "shared/" + sh, Value: []byte("bob")}}}
		_, err = bob.c.Txn(ctx, tok, nil, []*fencerv1.Op{put}, nil)
		require.Error(t, err, sh)
		_, err = bob.raw.Release(ctx, rrReleaseTok(tok.String()))
		require.Error(t, err, sh)
	}
	for sh, tok := range privOwn {
		_, err := bob.c.Put(ctx, tok, "priv/"+sh, []byte("bob"), client.TakeOver())
		require.Error(t, err, sh)
	}

	time.Sleep(500 * time.Millisecond)
	require.Equal(t, privOwn, ap.ring.Owned())
	require.Equal(t, sharedOwn, as.ring.Owned())
	for _, own := range []map[string]token.Token{privOwn, sharedOwn} {
		for sh, tok := range own {
			require.NoError(t, alice.c.Check(ctx, tok), sh)
		}
	}
	for sh := range sharedOwn {
		require.Equal(t, "", rrValue(t, alice.c, "shared/"+sh))
	}
}

// TestRedTeamRingBadInput: malformed CreateRing, JoinRing, ReleaseShards,
// Owns and RingStatus requests are refused with INVALID_ARGUMENT (or
// NOT_FOUND), create nothing and do not crash the server.
func TestRedTeamRingBadInput(t *testing.T) {
	s := startServeProc(t)
	cn := rrDial(t, s, "")
	ctx := rrCtx(t)
	long := strings.Repeat("x", 129)
	many := make([]string, 100001)
	for i := range many {
		many[i] = fmt.Sprint(i)
	}
	for i, req := range []*fencerv1.CreateRingRequest{
		{Ring: "bad"},
		{Ring: "bad", ShardCount: -1},
		{Ring: "bad", ShardCount: 100001},
		{Ring: "bad", ShardCount: 2, Shards: []string{"a"}},
		{Ring: "bad", Shards: []string{"a", "a"}},
		{Ring: "bad", Shards: []string{""}},
		{Ring: "bad", Shards: []string{long}},
		{Ring: "bad", Shards: []string{"a/b"}},
		{Ring: "bad", Shards: []string{"a b"}},
		{Ring: "bad", Shards: []string{"a\x00"}},
		{Ring: "bad", Shards: []string{"a\n"}},
		{Ring: "bad", Shards: []string{"a\u2028"}},
		{Ring: "bad", Shards: many},
		{Ring: "", ShardCount: 1},
		{Ring: "Bad", ShardCount: 1},
		{Ring: "bad:x", ShardCount: 1},
		{Ring: "bad/x", ShardCount: 1},
		{Ring: "-bad", ShardCount: 1},
		{Ring: "bad.", ShardCount: 1},
		{Ring: strings.Repeat("b", 64), ShardCount: 1},
	} {
		_, err := cn.raw.CreateRing(ctx, req)
		require.Error(t, err, "case %d", i)
		require.Contains(t, []codes.Code{codes.InvalidArgument, codes.ResourceExhausted}, status.Code(err), "case %d: %v", i, err)
	}
	for _, r := range []string{"bad", "bad.x"} {
		_, err := cn.c.RingStatus(ctx, r)
		require.ErrorIs(t, err, client.ErrRingNotFound)
	}
	_, err := cn.c.CreateRing(ctx, "ok", "s0", "s1", "\u00e9:\u4e2d")
	require.NoError(t, err)
	// A session of the caller's, not a member, for the join cases.
	m0, err := cn.c.NewSession()
	require.NoError(t, err)
	t.Cleanup(func() { _ = m0.Close(context.Background()) })
	_, err = m0.Acquire(ctx, "plain-lease")
	require.NoError(t, err)
	for i, req := range []*fencerv1.JoinRingRequest{
		{Ring: "ok", DrainSeconds: 601},
		{Ring: "ok", DrainSeconds: -1},
		{Ring: "ok", TtlSeconds: -1},
		{Ring: "ok", TtlSeconds: 3601},
		{Ring: "ok", Member: "a/b"},
		{Ring: "ok", Member: long},
		{Ring: "ok", Member: "a b"},
		{Ring: "ok", Member: "\x7f"},
		{Ring: "OK"},
		{Ring: ""},
		{Ring: "nope"},
		{Ring: "ok", SessionId: 424242},
		{Ring: "ok", SessionId: -5},
		{Ring: "ok", SessionId: m0.ID(), TtlSeconds: 5},
	} {
		st, err := cn.raw.JoinRing(ctx, req)
		if err == nil {
			_, err = st.Recv()
		}
		require.Error(t, err, "join case %d", i)
		require.Contains(t, []codes.Code{codes.InvalidArgument, codes.NotFound}, status.Code(err), "join case %d: %v", i, err)
	}
	st, err := cn.c.RingStatus(ctx, "ok")
	require.NoError(t, err)
	require.Empty(t, st.Members, "a refused join left a member")
	require.Equal(t, 3, st.Unowned)

	m := rrJoin(t, cn.c, "ok", "w", 10*time.Second, true)
	rrOwnedAll(t, cn.c, "ok", 3, m)
	tokE, ok := m.ring.Owns("\u00e9:\u4e2d")
	require.True(t, ok)
	_, err = cn.c.Put(ctx, tokE, "ok/e", []byte("v"))
	require.NoError(t, err)
	tooMany := make([]string, 1001)
	for i := range tooMany {
		tooMany[i] = "s0"
	}
	for i, req := range []*fencerv1.ReleaseShardsRequest{
		{Ring: "ok", SessionId: m.ring.SessionID(), Shards: tooMany},
		{Ring: "ok", SessionId: m.ring.SessionID(), Shards: []string{""}},
		{Ring: "ok", SessionId: m.ring.SessionID(), Shards: []string{long}},
		{Ring: "OK", SessionId: m.ring.SessionID(), Shards: []string{"s0"}},
	} {
		r, err := cn.raw.ReleaseShards(ctx, req)
		require.Error(t, err, "release case %d", i)
		require.Zero(t, r.GetReleased())
	}
	for i, req := range []*fencerv1.OwnsRequest{
		{Ring: "ok", SessionId: m.ring.SessionID(), Shard: "nope"},
		{Ring: "ok", SessionId: m.ring.SessionID(), Shard: ""},
		{Ring: "ok", SessionId: 0, Shard: "s0"},
		{Ring: "nope", SessionId: m.ring.SessionID(), Shard: "s0"},
	} {
		r, err := cn.raw.Owns(ctx, req)
		require.False(t, r.GetOwned(), "owns case %d: %v", i, err)
	}
	// Data keys named like fencer's own records are data keys: writing
	// them leaves the shard's lease and the ring alone (checked below).
	for _, key := range []string{"/fencer/holders/ring:ok:s0", "../holders/ring:ok:s0", "ring:ok:s0", "/fencer/rings/ok", "/fencer/epochs/ring:ok:s0"} {
		_, err := cn.c.Put(ctx, tokE, key, []byte("x"), client.TakeOver())
		require.NoError(t, err, key)
	}
	_, err = cn.c.Put(ctx, tokE, "", []byte("x"))
	require.Error(t, err)
	// A shard list over the ring record's limit (random names that do
	// not compress) creates nothing and leaves the server serving.
	rnd := rand.New(rand.NewPCG(1, 2))
	const alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:+=!@#$%^&*()[]{}<>?,;~"
	big := make([]string, 15000)
	for i := range big {
		b := make([]byte, 128)
		for j := range b {
			b[j] = alphabet[rnd.IntN(len(alphabet))]
		}
		big[i] = string(b)
	}
	_, err = cn.raw.CreateRing(ctx, &fencerv1.CreateRingRequest{Ring: "big", Shards: big})
	require.Error(t, err)
	t.Logf("CreateRing of 15000 random 128-byte shards: %v", err)
	_, err = cn.c.RingStatus(ctx, "big")
	require.ErrorIs(t, err, client.ErrRingNotFound)

	_, err = cn.raw.RingStatus(ctx, &fencerv1.RingStatusRequest{Ring: "../x"})
	rrCode(t, err, codes.InvalidArgument)
	// The server is alive and the member unharmed.
	require.Equal(t, 3, len(m.ring.Owned()))
	for sh, tok := range m.ring.Owned() {
		require.NoError(t, cn.c.Check(ctx, tok), sh)
	}
	select {
	case err := <-s.exited:
		t.Fatalf("fencer serve exited: %v: %s", err, s.log)
	default:
	}
}

// TestRedTeamRingSessionRejoinedUnderAnotherName: a session that is
// member w joins the same ring again under another name (w2). A session
// is a member under one name, so the join is refused with RING_CONFLICT
// and w's stream and loop run on: every shard is still owned by a live
// member once x joins and the moves are done. (Before, the second join
// stopped w's loop, and the shards rendezvous hashing gave to w were
// owned by nobody for as long as the session lived.)
func TestRedTeamRingSessionRejoinedUnderAnotherName(t *testing.T) {
	s := startServeProc(t)
	cn := rrDial(t, s, "")
	ctx := rrCtx(t)
	_, err := cn.c.CreateRingCount(ctx, "tw2", 8)
	require.NoError(t, err)
	w := rrJoin(t, cn.c, "tw2", "w", 10*time.Second, true)
	rrOwnedAll(t, cn.c, "tw2", 8, w)
	w2, err := cn.raw.JoinRing(ctx, &fencerv1.JoinRingRequest{Ring: "tw2", SessionId: w.ring.SessionID(), Member: "w2", DrainSeconds: 1})
	require.NoError(t, err)
	_, err = w2.Recv()
	rrCode(t, err, codes.AlreadyExists, "the session joined the ring under a second name")
	require.ErrorContains(t, err, `the session is member "w" of ring "tw2" already`)
	x := rrJoin(t, cn.c, "tw2", "x", 10*time.Second, true)
	var st client.RingStatus
	ok := assertEventually(func() bool {
		st, err = cn.c.RingStatus(rrCtx(t), "tw2")
		return err == nil && st.Unowned == 0 && len(x.ring.Owned()) > 0
	}, 10*time.Second)
	require.True(t, ok, "the ring did not settle with w and x owning every shard: %+v (x owns %d)", st, len(x.ring.Owned()))
	require.NoError(t, w.ring.Err(), "w's ring ended")
	require.NotEmpty(t, w.ring.Owned(), "w owns nothing")
}

// assertEventually polls cond every 50ms for up to d and reports whether
// it became true.
func assertEventually(cond func() bool, d time.Duration) bool {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if cond() {
			return true
		}
	}
	return cond()
}

// rrWriterScript is a ring join CMD that records its pid in dir/pid and
// then, until killed, puts key with the first token of its shards file,
// appending "ok" or "refused" to dir/log for each attempt. With
// ignoreTerm it ignores SIGTERM.
func rrWriterScript(bin, dir, key, value string, ignoreTerm bool) []string {
	trap := ""
	if ignoreTerm {
		trap = "trap '' TERM; "
	}
	return []string{"sh", "-c", trap + `echo $$ > ` + dir + `/pid; while :; do tok=$(head -n 1 "$FENCER_RING_SHARDS_FILE" | cut -d " " -f 2); ` +
		`if [ -n "$tok" ] && ` + bin + ` put --token "$tok" ` + key + ` ` + value + ` >/dev/null 2>&1; then echo ok >> ` + dir + `/log; else echo refused >> ` + dir + `/log; fi; sleep 0.05; done`}
}

// rrPid waits for the pid a rrWriterScript recorded in dir.
func rrPid(t *testing.T, dir string) int {
	t.Helper()
	var pid int
	require.Eventually(t, func() bool {
		b, err := os.ReadFile(filepath.Join(dir, "pid"))
		if err != nil {
			return false
		}
		_, err = fmt.Sscan(string(b), &pid)
		return err == nil
	}, 20*time.Second, 20*time.Millisecond)
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	return pid
}

// rrCount counts the lines equal to word in dir/log.
func rrCount(dir, word string) int {
	b, _ := os.ReadFile(filepath.Join(dir, "log"))
	n := 0
	for _, l := range strings.Split(string(b), "\n") {
		if l == word {
			n++
		}
	}
	return n
}

// TestRedTeamRingPausedMemberPastTTL: fencer ring join is stopped with
// SIGSTOP past its TTL while its CMD keeps writing with the shard's
// token. Once another member gains the shard and writes, the CMD's
// writes are refused and the new owner's value stands; resumed with
// SIGCONT, ring join stops its CMD and exits 9.
func TestRedTeamRingPausedMemberPastTTL(t *testing.T) {
	s := startServeProc(t)
	cn := rrDial(t, s, "")
	ctx := rrCtx(t)
	_, err := cn.c.CreateRingCount(ctx, "pz", 1)
	require.NoError(t, err)
	dir := t.TempDir()
	a := s.startFencer(nil, append([]string{"ring", "join", "pz", "--member", "a", "--ttl", "2s", "--settle", "100ms", "--"},
		rrWriterScript(s.bin, dir, "pz/k", "a", false)...)...)
	pid := rrPid(t, dir)
	require.Eventually(t, func() bool { return rrCount(dir, "ok") > 0 }, 20*time.Second, 20*time.Millisecond, "%s", a.stderr)

	start := time.Now()
	require.NoError(t, a.cmd.Process.Signal(syscall.SIGSTOP))
	defer func() { _ = a.cmd.Process.Signal(syscall.SIGCONT) }()
	b := rrJoin(t, cn.c, "pz", "b", 10*time.Second, true)
	var tokB token.Token
	require.Eventually(t, func() bool {
		var ok bool
		tokB, ok = b.ring.Owns("0")
		return ok
	}, 15*time.Second, 20*time.Millisecond, "b never gained the paused member's shard")
	_, err = cn.c.Put(ctx, tokB, "pz/k", []byte("b"))
	require.NoError(t, err)
	t.Logf("b wrote %s after the pause", time.Since(start).Round(time.Millisecond))
	okBefore := rrCount(dir, "ok")
	refusedBefore := rrCount(dir, "refused")
	time.Sleep(1500 * time.Millisecond)
	require.True(t, alive(pid), "the CMD of the paused member should still run (its fencer is stopped)")
	require.Greater(t, rrCount(dir, "refused"), refusedBefore, "the paused member's CMD made no attempt")
	require.Equal(t, okBefore, rrCount(dir, "ok"), "a write of the superseded member succeeded")
	require.Equal(t, "b", rrValue(t, cn.c, "pz/k"))

	require.NoError(t, a.cmd.Process.Signal(syscall.SIGCONT))
	require.Equal(t, rtExitLeaseLost, a.wait(t, 15*time.Second), a.stderr.String())
	t.Logf("ring join exited %s after the pause", time.Since(start).Round(time.Millisecond))
	require.Eventually(t, func() bool { return !alive(pid) }, 5*time.Second, 20*time.Millisecond, "the CMD outlived its lost session")
	require.Equal(t, "b", rrValue(t, cn.c, "pz/k"))
	require.NoError(t, cn.c.Check(ctx, tokB))
}

// TestRedTeamRingStubbornCMDOnChange: a ring join CMD that ignores
// SIGTERM, writing with its shard's token, is restarted when another
// member joins and takes the shard: it is killed after --grace, the new
// owner gains the shard, and once the new owner has written, no write
// of the old CMD lands.
func TestRedTeamRingStubbornCMDOnChange(t *testing.T) {
	s := startServeProc(t)
	cn := rrDial(t, s, "")
	ctx := rrCtx(t)
	_, err := cn.c.CreateRingCount(ctx, "st", 1)
	require.NoError(t, err)
	dir := t.TempDir()
	a := s.startFencer(nil, append([]string{"ring", "join", "st", "--member", "a", "--grace", "1s", "--settle", "100ms", "--"},
		rrWriterScript(s.bin, dir, "st/k", "a", true)...)...)
	pid := rrPid(t, dir)
	require.Eventually(t, func() bool { return rrCount(dir, "ok") > 0 }, 20*time.Second, 20*time.Millisecond, "%s", a.stderr)

	// b takes the only shard only if rendezvous hashing gives it to b;
	// try names until one does.
	var b *rrMember
	var tokB token.Token
	for _, name := range []string{"b", "c", "d", "e", "f", "g"} {
		m := rrJoin(t, cn.c, "st", name, 10*time.Second, true)
		if assertEventually(func() bool {
			var ok bool
			tokB, ok = m.ring.Owns("0")
			return ok
		}, 12*time.Second) {
			b = m
			break
		}
		lctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_ = m.ring.Leave(lctx)
		cancel()
	}
	require.NotNil(t, b, "no member gained the shard")
	require.False(t, alive(pid), "the stubborn CMD still runs after its shard was handed off: %s", a.stderr)
	_, err = cn.c.Put(ctx, tokB, "st/k", []byte("b"))
	require.NoError(t, err)
	time.Sleep(time.Second)
	require.Equal(t, "b", rrValue(t, cn.c, "st/k"))
	require.Contains(t, a.stderr.String(), "SIGKILL")
	// a still runs as a member owning nothing.
	select {
	case <-a.exited:
		t.Fatalf("ring join exited %d: %s", a.code, a.stderr)
	default:
	}
}

// rrWrite is an acknowledged write of a shard's key.
type rrWrite struct {
	rev int64
	tok token.Token
}

// rrWriters writes each shard's key with every token its members are
// told Gained, in a loop until stopped, recording the acknowledged
// writes by shard.
type rrWriters struct {
	c      *client.Client
	prefix string
	mu     sync.Mutex
	acked  map[string][]rrWrite
	stop   chan struct{}
	wg     sync.WaitGroup
}

// follow joins ring as name through a new session of w.c and writes with
// every token it gains, releasing what it is losing.
func (w *rrWriters) follow(t *testing.T, ring, name string) *client.Ring {
	t.Helper()
	sess, err := w.c.NewSession(client.WithTTL(10 * time.Second))
	require.NoError(t, err)
	t.Cleanup(func() { _ = sess.Close(context.Background()) })
	r, err := sess.JoinRing(rrCtx(t), ring, client.WithMember(name), client.WithDrain(2*time.Second))
	require.NoError(t, err)
	t.Cleanup(r.Close)
	go func() {
		for ch := range r.Changes() {
			switch ch.Kind {
			case client.Gained:
				w.wg.Add(1)
				go w.write(ch.Shard, ch.Token)
			case client.Losing:
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_, _ = r.Release(ctx, ch.Shard)
				cancel()
			}
		}
	}()
	return r
}

// write puts shard's key with tok until w stops or tok is refused.
func (w *rrWriters) write(shard string, tok token.Token) {
	defer w.wg.Done()
	for {
		select {
		case <-w.stop:
			return
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		rev, err := w.c.Put(ctx, tok, w.prefix+shard, []byte(tok.String()))
		cancel()
		if err == nil {
			w.mu.Lock()
			w.acked[shard] = append(w.acked[shard], rrWrite{rev, tok})
			w.mu.Unlock()
		} else if errors.Is(err, token.ErrStale) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// check stops the writers and asserts, for each shard, that acknowledged
// writes in revision order never go back to an older token, and that the
// last acknowledged write is the stored value.
func (w *rrWriters) check(t *testing.T) {
	t.Helper()
	close(w.stop)
	w.wg.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	for shard, ws := range w.acked {
		sort.Slice(ws, func(i, j int) bool { return ws[i].rev < ws[j].rev })
		for i := 1; i < len(ws); i++ {
			c, err := ws[i].tok.Compare(ws[i-1].tok)
			require.NoError(t, err)
			require.GreaterOrEqual(t, c, 0, "shard %s: a superseded token's write at revision %d landed after a newer token's at %d", shard, ws[i].rev, ws[i-1].rev)
		}
		v, found, err := w.c.Get(rrCtx(t), w.prefix+shard)
		require.NoError(t, err)
		require.True(t, found, "shard %s: acknowledged writes are gone", shard)
		last := ws[len(ws)-1]
		require.Equal(t, last.tok.String(), string(v.Data), "shard %s: the last acknowledged write is gone", shard)
		require.Equal(t, last.rev, v.ModRevision, "shard %s", shard)
	}
}

// TestRedTeamRingServerKilledDuringMoves: fencer serve is killed with
// SIGKILL while a join moves shards (and again while they settle), and
// restarted on the same data directory. The members ride it out: every
// shard ends owned, each once; no acknowledged write is lost, and no
// superseded token's write lands after a newer token's.
func TestRedTeamRingServerKilledDuringMoves(t *testing.T) {
	s := startServeProc(t)
	cn := rrDial(t, s, "")
	ctx := rrCtx(t)
	_, err := cn.c.CreateRingCount(ctx, "kill", 12)
	require.NoError(t, err)
	w := &rrWriters{c: cn.c, prefix: "kill/", acked: map[string][]rrWrite{}, stop: make(chan struct{})}
	a := w.follow(t, "kill", "a")
	require.Eventually(t, func() bool { return len(a.Owned()) == 12 }, 20*time.Second, 20*time.Millisecond)
	time.Sleep(300 * time.Millisecond)
	b := w.follow(t, "kill", "b")
	c := w.follow(t, "kill", "c")
	for _, pause := range []time.Duration{200 * time.Millisecond, 1500 * time.Millisecond} {
		time.Sleep(pause)
		require.NoError(t, s.cmd.Process.Kill())
		<-s.exited
		s.start()
	}
	require.Eventually(t, func() bool {
		st, err := cn.c.RingStatus(rrCtx(t), "kill")
		if err != nil || st.Unowned != 0 || len(st.Members) != 3 {
			return false
		}
		n := 0
		for _, r := range []*client.Ring{a, b, c} {
			if len(r.Owned()) == 0 {
				return false
			}
			n += len(r.Owned())
		}
		return n == 12
	}, 40*time.Second, 50*time.Millisecond, "the ring did not settle after the server restarts")
	seen := map[string]bool{}
	for _, r := range []*client.Ring{a, b, c} {
		require.NoError(t, r.Err())
		for sh, tok := range r.Owned() {
			require.False(t, seen[sh], "shard %s owned twice", sh)
			seen[sh] = true
			require.NoError(t, cn.c.Check(ctx, tok), sh)
		}
	}
	time.Sleep(300 * time.Millisecond)
	w.check(t)
}

// TestRedTeamRingBrokenStreamMemberKeepsItsShards: a member whose stream
// is closed (its session still renewed) keeps its shards; a member that
// joins meanwhile gains none of them, so no shard has two owners, and
// the closed member's tokens stay current. When the session ends, the
// other member gains them all, and the old tokens are refused.
func TestRedTeamRingBrokenStreamMemberKeepsItsShards(t *testing.T) {
	s := startServeProc(t)
	cn := rrDial(t, s, "")
	ctx := rrCtx(t)
	_, err := cn.c.CreateRingCount(ctx, "br", 8)
	require.NoError(t, err)
	a := rrJoin(t, cn.c, "br", "a", 10*time.Second, true)
	rrOwnedAll(t, cn.c, "br", 8, a)
	old := a.ring.Owned()
	a.ring.Close()
	b := rrJoin(t, cn.c, "br", "b", 10*time.Second, true)
	time.Sleep(3 * time.Second)
	require.Empty(t, b.ring.Owned(), "b gained a shard that a, its stream closed, still holds")
	for sh, tok := range old {
		require.NoError(t, cn.c.Check(ctx, tok), sh)
	}
	require.NoError(t, a.sess.Close(ctx))
	rrOwnedAll(t, cn.c, "br", 8, b)
	for sh, tok := range old {
		_, err := cn.c.Put(ctx, tok, "br/"+sh, []byte("a"))
		rrStale(t, err, sh)
	}
}

// TestRedTeamRingCLISameMemberTwice: a second fencer ring join with the
// member name of a running one exits 5 without running its CMD, and the
// first keeps its shards.
func TestRedTeamRingCLISameMemberTwice(t *testing.T) {
	s := startServeProc(t)
	code, _, stderr := s.fencer(nil, "ring", "create", "dup", "--shards", "3")
	require.Equal(t, 0, code, stderr)
	dir := t.TempDir()
	a := s.startFencer(nil, "ring", "join", "dup", "--member", "w", "--settle", "100ms", "--", "sh", "-c", "echo $$ > "+dir+"/pid; exec sleep 60")
	rrPid(t, dir)
	marker := filepath.Join(dir, "second-ran")
	code, _, stderr = s.fencer(nil, "ring", "join", "dup", "--member", "w", "--", "sh", "-c", "touch "+marker)
	require.Equal(t, 5, code, stderr)
	_, err := os.Stat(marker)
	require.True(t, os.IsNotExist(err), "the second member's CMD ran")
	st := ringStatusOf(t, s, "dup")
	require.Len(t, st.Members, 1)
	require.Equal(t, 3, st.Members[0].Owned)
	select {
	case <-a.exited:
		t.Fatalf("the first ring join exited %d: %s", a.code, a.stderr)
	default:
	}
}

// TestRedTeamRingShardListOverLimit: docs/service.md says a ring's
// record (its shard list as JSON) must fit in 1,568,768 bytes. A list of
// 12,000 shards of 128 bytes (1.58 MB as JSON) is over it by a little and
// must create nothing; 11,000 such shards fit.
func TestRedTeamRingShardListOverLimit(t *testing.T) {
	s := startServeProc(t)
	cn := rrDial(t, s, "")
	ctx := rrCtx(t)
	shards := func(n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = fmt.Sprintf("%0128d", i)
		}
		return out
	}
	_, err := cn.raw.CreateRing(ctx, &fencerv1.CreateRingRequest{Ring: "over", Shards: shards(12000)})
	rrCode(t, err, codes.InvalidArgument, "a shard list of 1.58 MB was accepted")
	_, err = cn.c.RingStatus(ctx, "over")
	require.ErrorIs(t, err, client.ErrRingNotFound)
	_, err = cn.raw.CreateRing(ctx, &fencerv1.CreateRingRequest{Ring: "under", Shards: shards(11000)})
	require.NoError(t, err, "a shard list within the documented limit was refused")
}

// TestRedTeamRingSameMemberOnTwoServers: two fencer serve processes on
// one etcd; a member's session joins again through the second server
// while its stream on the first still runs, so two loops act for one
// member. A new member must still get its share with each shard owned
// once, the moved shards' old tokens are refused, and ReleaseShards or
// LeaveRing of a member on the server that does not run its stream is
// refused and changes nothing.
func TestRedTeamRingSameMemberOnTwoServers(t *testing.T) {
	ep := startEtcd(t)
	s1 := startServeProc(t, "--etcd-endpoints", ep)
	s2 := startServeProc(t, "--etcd-endpoints", ep)
	c1, c2 := rrDial(t, s1, ""), rrDial(t, s2, "")
	ctx := rrCtx(t)
	_, err := c1.c.CreateRingCount(ctx, "ms", 8)
	require.NoError(t, err)
	a := rrJoin(t, c1.c, "ms", "a", 10*time.Second, true)
	rrOwnedAll(t, c1.c, "ms", 8, a)
	old := a.ring.Owned()
	twin, err := c2.raw.JoinRing(ctx, &fencerv1.JoinRingRequest{Ring: "ms", SessionId: a.ring.SessionID(), Member: "a", DrainSeconds: 2})
	require.NoError(t, err)
	snap, err := twin.Recv()
	require.NoError(t, err)
	require.Len(t, snap.GetChanges(), 8, "the twin's snapshot")
	go func() {
		for {
			if _, err := twin.Recv(); err != nil {
				return
			}
		}
	}()
	b := rrJoin(t, c1.c, "ms", "b", 10*time.Second, true)
	rrOwnedAll(t, c1.c, "ms", 8, a, b)
	st, err := c1.c.RingStatus(ctx, "ms")
	require.NoError(t, err)
	require.Len(t, st.Members, 2)
	require.Equal(t, 8, st.Members[0].Owned+st.Members[1].Owned)
	for sh, tok := range b.ring.Owned() {
		rrStale(t, c1.c.Check(ctx, old[sh]), sh)
		require.NoError(t, c2.c.Check(ctx, tok), sh)
	}
	bOwn := b.ring.Owned()
	var bShard string
	for sh := range bOwn {
		bShard = sh
	}
	_, err = c2.raw.ReleaseShards(ctx, &fencerv1.ReleaseShardsRequest{Ring: "ms", SessionId: b.ring.SessionID(), Shards: []string{bShard}})
	rrCode(t, err, codes.FailedPrecondition)
	_, err = c2.raw.LeaveRing(ctx, &fencerv1.LeaveRingRequest{Ring: "ms", SessionId: b.ring.SessionID()})
	rrCode(t, err, codes.FailedPrecondition)
	time.Sleep(300 * time.Millisecond)
	require.Equal(t, bOwn, b.ring.Owned())
	require.NoError(t, a.ring.Err())
	require.NoError(t, b.ring.Err())
}

// TestRedTeamRingJoinKilledCMDIgnoresTERM: fencer ring join is killed
// with SIGKILL while its CMD, which ignores SIGTERM, writes with its
// shard's token. The CMD must not outlive it (docs/cli.md: the kernel's
// parent-death signal ends CMD on Linux); the shard goes to another
// member after the TTL, and the old token's writes are refused.
func TestRedTeamRingJoinKilledCMDIgnoresTERM(t *testing.T) {
	s := startServeProc(t)
	cn := rrDial(t, s, "")
	ctx := rrCtx(t)
	_, err := cn.c.CreateRingCount(ctx, "kj", 1)
	require.NoError(t, err)
	dir := t.TempDir()
	a := s.startFencer(nil, append([]string{"ring", "join", "kj", "--member", "a", "--ttl", "2s", "--settle", "100ms", "--"},
		rrWriterScript(s.bin, dir, "kj/k", "a", true)...)...)
	pid := rrPid(t, dir)
	require.Eventually(t, func() bool { return rrCount(dir, "ok") > 0 }, 20*time.Second, 20*time.Millisecond, "%s", a.stderr)
	require.NoError(t, a.cmd.Process.Kill())
	a.wait(t, 10*time.Second)
	require.Eventually(t, func() bool { return !alive(pid) }, 3*time.Second, 20*time.Millisecond,
		"the CMD, ignoring SIGTERM, outlived its killed fencer ring join")
	b := rrJoin(t, cn.c, "kj", "b", 10*time.Second, true)
	var tokB token.Token
	require.Eventually(t, func() bool {
		var ok bool
		tokB, ok = b.ring.Owns("0")
		return ok
	}, 15*time.Second, 20*time.Millisecond)
	_, err = cn.c.Put(ctx, tokB, "kj/k", []byte("b"))
	require.NoError(t, err)
	time.Sleep(500 * time.Millisecond)
	require.Equal(t, "b", rrValue(t, cn.c, "kj/k"))
}

// TestRedTeamRingLargeSnapshotAfterRestart: a member owning 50,000
// shards of a ring with a 63-byte name (both within the documented
// limits: 100,000 shards, 63-byte ring names) rides out a fencer serve
// restart. The reopened stream's snapshot lists every shard with its
// token, about 4.8 MB; if it is sent as one message, past gRPC's default
// 4 MiB receive limit, the Go client's Ring ends with RESOURCE_EXHAUSTED
// while its session keeps holding every shard, and no joining member
// could ever gain one while that session lives.
func TestRedTeamRingLargeSnapshotAfterRestart(t *testing.T) {
	const n = 50000
	s := startServeProc(t)
	cn := rrDial(t, s, "")
	ctx := rrCtx(t)
	name := "b" + strings.Repeat("x", 62)
	_, err := cn.c.CreateRingCount(ctx, name, n)
	require.NoError(t, err)
	m := rrJoin(t, cn.c, name, "w", 10*time.Second, true)
	require.Eventually(t, func() bool { return len(m.ring.Owned()) == n }, 40*time.Second, 100*time.Millisecond)
	s.stop()
	s.start()
	// Wait for the member's stream to be reopened on the new server.
	require.Eventually(t, func() bool {
		return strings.Contains(s.log.String(), `msg="join ring"`) || m.ring.Err() != nil
	}, 30*time.Second, 50*time.Millisecond, "the member did not join again: %s", s.log)
	var outcome string
	require.Eventually(t, func() bool {
		if err := m.ring.Err(); err != nil {
			outcome = err.Error()
			return true
		}
		if len(m.ring.Owned()) == n {
			st, err := cn.c.RingStatus(rrCtx(t), name)
			if err == nil && st.Unowned == 0 && len(st.Members) == 1 && st.Members[0].Owned == n {
				return true
			}
		}
		return false
	}, 30*time.Second, 100*time.Millisecond)
	require.NoError(t, m.ring.Err(), "the member's ring ended after the restart: %s", outcome)
}

// TestRedTeamRingJoinManyShardsStartsCMD: fencer ring join of a ring of
// 1,100 shards with 128-byte names (within the documented limits) must
// run its CMD. $FENCER_RING_SHARDS, the shards comma-separated, is then
// about 141 KB, over Linux's 128 KiB limit on one environment string, so
// an exec that passes it fails with "argument list too long" and CMD
// never runs. (A ring of 30,000 shards named "0" to "29999" fails the
// same way.)
func TestRedTeamRingJoinManyShardsStartsCMD(t *testing.T) {
	s := startServeProc(t)
	cn := rrDial(t, s, "")
	ctx := rrCtx(t)
	shards := make([]string, 1100)
	for i := range shards {
		shards[i] = fmt.Sprintf("%0128d", i)
	}
	_, err := cn.c.CreateRing(ctx, "many", shards...)
	require.NoError(t, err)
	marker := filepath.Join(t.TempDir(), "started")
	p := s.startFencer(nil, "ring", "join", "many", "--member", "w", "--settle", "100ms", "--", "sh", "-c",
		`wc -l < "$FENCER_RING_SHARDS_FILE" > `+marker+`; exec sleep 60`)
	// Started, or given up: ring join leaves when CMD cannot start.
	require.Eventually(t, func() bool {
		if _, err := os.Stat(marker); err == nil {
			return true
		}
		st, err := cn.c.RingStatus(rrCtx(t), "many")
		return err == nil && len(st.Members) == 1 && st.Members[0].Leaving
	}, 30*time.Second, 50*time.Millisecond, "%s", p.stderr)
	_, err = os.Stat(marker)
	require.NoError(t, err, "CMD did not run: %s", p.stderr)
}

// TestRedTeamRingOneSessionTwoNamesOnTwoServers: two fencer serve
// processes on one etcd. Member w joins through server 1; another
// JoinRing through server 2 uses w's session (its id is all it takes:
// the same principal, no session secret) under the name w2. Then two
// members run for one session: no shard may be reported owned by both
// at once, and the ring must settle, not hand its shards back and forth.
func TestRedTeamRingOneSessionTwoNamesOnTwoServers(t *testing.T) {
	ep := startEtcd(t)
	s1 := startServeProc(t, "--etcd-endpoints", ep)
	s2 := startServeProc(t, "--etcd-endpoints", ep)
	c1, c2 := rrDial(t, s1, ""), rrDial(t, s2, "")
	ctx := rrCtx(t)
	_, err := c1.c.CreateRingCount(ctx, "nn", 8)
	require.NoError(t, err)
	w := rrJoin(t, c1.c, "nn", "w", 10*time.Second, true)
	rrOwnedAll(t, c1.c, "nn", 8, w)
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w2, err := c2.raw.JoinRing(sctx, &fencerv1.JoinRingRequest{Ring: "nn", SessionId: w.ring.SessionID(), Member: "w2", DrainSeconds: 1})
	require.NoError(t, err)
	var (
		mu      sync.Mutex
		w2Owns  = map[string]string{}
		w2Gains int
	)
	go func() {
		for {
			m, err := w2.Recv()
			if err != nil {
				return
			}
			mu.Lock()
			for _, ch := range m.GetChanges() {
				switch ch.GetKind() {
				case fencerv1.ShardChange_KIND_GAINED:
					w2Owns[ch.GetShard()] = ch.GetToken()
					w2Gains++
				case fencerv1.ShardChange_KIND_LOST:
					delete(w2Owns, ch.GetShard())
				}
			}
			mu.Unlock()
		}
	}()
	both := map[string]string{}
	end := time.Now().Add(4 * time.Second)
	for time.Now().Before(end) {
		mu.Lock()
		for sh, tok := range w.ring.Owned() {
			if t2, ok := w2Owns[sh]; ok {
				both[sh] = tok.String() + " and " + t2
			}
		}
		mu.Unlock()
		time.Sleep(20 * time.Millisecond)
	}
	var maxEpoch uint64
	w.mu.Lock()
	for _, ch := range w.log {
		maxEpoch = max(maxEpoch, ch.Token.Epoch)
	}
	w.mu.Unlock()
	mu.Lock()
	gains := w2Gains
	mu.Unlock()
	t.Logf("in 4 s: w2 was told %d gains; the highest epoch w saw is %d", gains, maxEpoch)
	require.Empty(t, both, "shards reported owned by two members at once")
	require.Less(t, maxEpoch, uint64(10), "the shards were handed back and forth %d times", maxEpoch)
}

// TestRedTeamRingShardsFilePrivate: the shards file that ring join gives
// its CMD (shard tokens) is readable and replaceable by its user only:
// the file is 0600 and its directory 0700.
func TestRedTeamRingShardsFilePrivate(t *testing.T) {
	s := startServeProc(t)
	code, _, stderr := s.fencer(nil, "ring", "create", "priv", "--shards", "2")
	require.Equal(t, 0, code, stderr)
	code, stdout, stderr := s.fencer(nil, "ring", "join", "priv", "--member", "w", "--settle", "100ms", "--", "sh", "-c",
		`stat -c %a "$FENCER_RING_SHARDS_FILE" "$(dirname "$FENCER_RING_SHARDS_FILE")"`)
	require.Equal(t, 0, code, stderr)
	require.Equal(t, []string{"600", "700"}, strings.Fields(stdout))
}

// TestRedTeamRingPartitionedMemberFailsClosed: a Go-client member (TTL
// 3 s) cut off from the server (its connection swallowing everything)
// stops reporting its shards owned, on its own clock, before another
// member gains any of them; and once the other member has gained them,
// the cut-off member's tokens, used over a connection that still works,
// are refused. (The cut-off member never hears its LOSING: the server
// released the shards after the 2 s drain, while the member believed it
// owned them until its session's deadline, up to 3 s after the cut. A
// drain is now never shorter than the session's TTL plus a second.)
func TestRedTeamRingPartitionedMemberFailsClosed(t *testing.T) {
	s := startServeProc(t)
	cn := rrDial(t, s, "")
	ctx := rrCtx(t)
	_, err := cn.c.CreateRingCount(ctx, "cut", 4)
	require.NoError(t, err)
	bh := startBlackhole(t, s.addr, 0)
	via := rrDialAddr(t, bh.ln.Addr().String(), "")
	a := rrJoin(t, via.c, "cut", "a", 3*time.Second, false)
	rrOwnedAll(t, cn.c, "cut", 4, a)
	old := a.ring.Owned()
	bh.cut.Store(true)
	cutAt := time.Now()
	var aLost atomic.Int64 // nanoseconds after the cut
	go func() {
		for len(a.ring.Owned()) > 0 {
			time.Sleep(time.Millisecond)
		}
		aLost.Store(int64(time.Since(cutAt)))
	}()
	go func() {
		<-a.sess.Done()
		t.Logf("a's session ended %s after the cut: %v", time.Since(cutAt).Round(time.Millisecond), a.sess.Err())
	}()
	b := rrJoin(t, cn.c, "cut", "b", 10*time.Second, true)
	var bGained time.Duration
	require.Eventually(t, func() bool {
		if len(b.ring.Owned()) > 0 {
			bGained = time.Since(cutAt)
			return true
		}
		return false
	}, 15*time.Second, time.Millisecond)
	lost := time.Duration(aLost.Load())
	require.NotZero(t, lost, "b gained a shard %s after the cut while a still believed it owned shards", bGained)
	require.Less(t, lost, bGained)
	t.Logf("a lost its shards %s after the cut, b gained one %s after it", lost.Round(time.Millisecond), bGained.Round(time.Millisecond))
	rrOwnedAll(t, cn.c, "cut", 4, b)
	for sh, tok := range old {
		_, err := cn.c.Put(ctx, tok, "cut/"+sh, []byte("a"))
		rrStale(t, err, sh)
	}
}
