package server_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fencer-dev/fencer/client"
	"github.com/fencer-dev/fencer/etcdstore"
	"github.com/fencer-dev/fencer/fencertest"
	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
	"github.com/fencer-dev/fencer/server"
	"github.com/fencer-dev/fencer/token"
)

// ringWait bounds the waits for a ring to settle.
const ringWait = 15 * time.Second

// ringStream follows one JoinRing stream: the shards it owns, with
// tokens, and the changes it reported. With autoRelease it releases each
// shard reported LOSING at once, as a member that has nothing to drain.
type ringStream struct {
	t           *testing.T
	rpc         fencerv1.FencerServiceClient
	ring        string
	autoRelease bool
	cancel      context.CancelFunc

	first *fencerv1.JoinRingResponse
	done  chan struct{} // closed when the stream has ended
	err   error         // why, set before done closes

	mu      sync.Mutex
	owned   map[string]string
	losing  map[string]bool
	changes []*fencerv1.ShardChange
}

// join opens a JoinRing stream of req and waits for its snapshot.
func join(t *testing.T, rpc fencerv1.FencerServiceClient, req *fencerv1.JoinRingRequest, autoRelease bool) *ringStream {
	t.Helper()
	s, err := tryJoin(t, rpc, req, autoRelease)
	require.NoError(t, err)
	return s
}

// tryJoin is join, returning the error of a stream that ends before its
// snapshot.
func tryJoin(t *testing.T, rpc fencerv1.FencerServiceClient, req *fencerv1.JoinRingRequest, autoRelease bool) (*ringStream, error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := rpc.JoinRing(ctx, req)
	if err != nil {
		cancel()
		return nil, err
	}
	first, err := stream.Recv()
	if err != nil {
		cancel()
		return nil, err
	}
	require.True(t, first.GetSnapshot(), "the first message is a snapshot")
	s := &ringStream{t: t, rpc: rpc, ring: req.GetRing(), autoRelease: autoRelease, cancel: cancel, first: first,
		done: make(chan struct{}), owned: map[string]string{}, losing: map[string]bool{}}
	s.apply(first)
	go func() {
		defer close(s.done)
		for {
			msg, err := stream.Recv()
			if err != nil {
				s.err = err
				return
			}
			s.apply(msg)
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-s.done
	})
	return s, nil
}

func (s *ringStream) apply(msg *fencerv1.JoinRingResponse) {
	var release []string
	s.mu.Lock()
	for _, c := range msg.GetChanges() {
		s.changes = append(s.changes, c)
		switch c.GetKind() {
		case fencerv1.ShardChange_KIND_GAINED:
			s.owned[c.GetShard()] = c.GetToken()
		case fencerv1.ShardChange_KIND_LOSING:
			s.losing[c.GetShard()] = true
			release = append(release, c.GetShard())
		case fencerv1.ShardChange_KIND_LOST:
			delete(s.owned, c.GetShard())
			delete(s.losing, c.GetShard())
		}
	}
	s.mu.Unlock()
	if s.autoRelease && len(release) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, _ = s.rpc.ReleaseShards(ctx, &fencerv1.ReleaseShardsRequest{Ring: s.ring, SessionId: s.session(), Shards: release})
	}
}

func (s *ringStream) session() int64 { return s.first.GetSessionId() }

// ownedNow returns a copy of the shards the stream owns.
func (s *ringStream) ownedNow() map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]string, len(s.owned))
	for k, v := range s.owned {
		out[k] = v
	}
	return out
}

// changesOf returns the shards of the changes of kind reported so far.
func (s *ringStream) changesOf(kind fencerv1.ShardChange_Kind) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, c := range s.changes {
		if c.GetKind() == kind {
			out = append(out, c.GetShard())
		}
	}
	return out
}

// ended waits for the stream's end and returns its error (nil for OK).
func (s *ringStream) ended(what string) error {
	s.t.Helper()
	fencertest.WaitClosed(s.t, s.done, ringWait, what)
	if errors.Is(s.err, io.EOF) {
		return nil
	}
	return s.err
}

// shardNames are "0" to "<n-1>".
func shardNames(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprint(i)
	}
	return out
}

// requirePartition waits until the streams own every one of n shards
// between them, each exactly once, and returns who owns what.
func requirePartition(t *testing.T, n int, streams ...*ringStream) map[string]int {
	t.Helper()
	var owners map[string]int
	require.Eventually(t, func() bool {
		var ok bool
		owners, ok = partition(n, streams...)
		return ok
	}, ringWait, 10*time.Millisecond, "every shard owned by exactly one member")
	return owners
}

// partition returns which stream owns each shard, and whether the streams
// own every one of n shards between them, each exactly once, as they have
// been told so far. (During a move, the new owner's GAINED may arrive
// before the old owner's LOST: a shard then shows twice for a moment.)
func partition(n int, streams ...*ringStream) (map[string]int, bool) {
	owners := map[string]int{}
	for i, s := range streams {
		for shard := range s.ownedNow() {
			if _, dup := owners[shard]; dup {
				return owners, false
			}
			owners[shard] = i
		}
	}
	return owners, len(owners) == n
}

// requireCode checks err's gRPC code and ErrorInfo reason.
func requireCode(t *testing.T, err error, code codes.Code, reason fencerv1.ErrorReason) {
	t.Helper()
	require.Error(t, err)
	st := status.Convert(err)
	require.Equal(t, code, st.Code(), st.Message())
	require.Equal(t, reason, client.Reason(err), st.Message())
}

func TestRingJoinSnapshotAndGain(t *testing.T) {
	ctx := fencertest.Context(t)
	st := fencertest.SharedStore(t)
	addr, srv := startServer(t, st)
	rpc := fencerv1.NewFencerServiceClient(dial(t, alice, addr))
	created, err := rpc.CreateRing(ctx, &fencerv1.CreateRingRequest{Ring: "orders", ShardCount: 8})
	require.NoError(t, err)
	require.True(t, created.GetCreated())
	again, err := rpc.CreateRing(ctx, &fencerv1.CreateRingRequest{Ring: "orders", Shards: shardNames(8)})
	require.NoError(t, err)
	require.False(t, again.GetCreated(), "the same shards again change nothing")

	m := join(t, rpc, &fencerv1.JoinRingRequest{Ring: "orders", Member: "w1"}, false)
	require.Equal(t, "w1", m.first.GetMember())
	require.NotZero(t, m.session())
	require.Len(t, m.first.GetSessionSecret(), server.SessionSecretLen)
	require.Equal(t, int64(server.DefaultTTLSeconds), m.first.GetTtlSeconds())
	keepAlive(t, rpc, m.session())
	requirePartition(t, 8, m)

	// Owns from the member's memory, and its token fences a write.
	owned := m.ownedNow()
	resp, err := rpc.Owns(ctx, &fencerv1.OwnsRequest{Ring: "orders", SessionId: m.session(), Shard: "3"})
	require.NoError(t, err)
	require.True(t, resp.GetOwned())
	require.Equal(t, owned["3"], resp.GetToken())
	tok, err := token.Parse(resp.GetToken())
	require.NoError(t, err)
	require.Equal(t, "ring:orders:3", tok.Lease)
	_, err = rpc.Put(ctx, &fencerv1.PutRequest{Token: tok.String(), Key: "orders/3", Value: []byte("x")})
	require.NoError(t, err)

	// Another server answers Owns from etcd, the same.
	addr2, _ := startServer(t, st)
	rpc2 := fencerv1.NewFencerServiceClient(dial(t, alice, addr2))
	resp2, err := rpc2.Owns(ctx, &fencerv1.OwnsRequest{Ring: "orders", SessionId: m.session(), Shard: "3"})
	require.NoError(t, err)
	require.True(t, resp2.GetOwned())
	require.Equal(t, tok.String(), resp2.GetToken())
	// ReleaseShards and LeaveRing need the server of the member's stream.
	_, err = rpc2.LeaveRing(ctx, &fencerv1.LeaveRingRequest{Ring: "orders", SessionId: m.session()})
	requireCode(t, err, codes.FailedPrecondition, fencerv1.ErrorReason_ERROR_REASON_LEASE_NOT_HELD)
	_, err = rpc2.ReleaseShards(ctx, &fencerv1.ReleaseShardsRequest{Ring: "orders", SessionId: m.session(), Shards: []string{"3"}})
	requireCode(t, err, codes.FailedPrecondition, fencerv1.ErrorReason_ERROR_REASON_LEASE_NOT_HELD)
	require.Contains(t, status.Convert(err).Message(), "does not run on this server")

	rs, err := rpc.RingStatus(ctx, &fencerv1.RingStatusRequest{Ring: "orders"})
	require.NoError(t, err)
	require.Equal(t, int32(8), rs.GetShardCount())
	require.Zero(t, rs.GetUnowned())
	require.Len(t, rs.GetMembers(), 1)
	require.Equal(t, "w1", rs.GetMembers()[0].GetMember())
	require.Equal(t, int32(8), rs.GetMembers()[0].GetOwned())
	require.True(t, strings.HasPrefix(rs.GetMembers()[0].GetHolder(), "alice/"))

	require.Equal(t, 1.0, scrape(t, srv, "fencer_server_ring_members"))
	require.Equal(t, 8.0, scrape(t, srv, "fencer_server_ring_shards_owned"))

	// A plain Acquire, or a Release of a shard's token, of a ring's lease
	// name is refused, and changes nothing.
	_, err = rpc.Acquire(ctx, &fencerv1.AcquireRequest{Name: "ring:orders:3"})
	requireCode(t, err, codes.InvalidArgument, fencerv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT)
	require.Contains(t, status.Convert(err).Message(), "belong to rings")
	_, err = rpc.Release(ctx, &fencerv1.ReleaseRequest{Target: &fencerv1.ReleaseRequest_Token{Token: tok.String()}})
	requireCode(t, err, codes.InvalidArgument, fencerv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT)
	_, err = rpc.Check(ctx, &fencerv1.CheckRequest{Token: tok.String()})
	require.NoError(t, err, "the shard's token is still current")
}

// keepAlive renews session id over a KeepAlive stream until the test ends.
func keepAlive(t *testing.T, rpc fencerv1.FencerServiceClient, id int64) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ka, err := rpc.KeepAlive(ctx)
	require.NoError(t, err)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			if ka.Send(&fencerv1.KeepAliveRequest{SessionId: id}) != nil {
				return
			}
			if _, err := ka.Recv(); err != nil {
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
}

func TestRingThreeSessionsOwnEveryShardOnce(t *testing.T) {
	ctx := fencertest.Context(t)
	st := fencertest.SharedStore(t)
	addr, _ := startServer(t, st)
	rpc := fencerv1.NewFencerServiceClient(dial(t, alice, addr))
	_, err := rpc.CreateRing(ctx, &fencerv1.CreateRingRequest{Ring: "jobs", ShardCount: 60})
	require.NoError(t, err)
	var members []*ringStream
	for i := range 3 {
		m := join(t, rpc, &fencerv1.JoinRingRequest{Ring: "jobs", Member: fmt.Sprintf("w%d", i)}, true)
		keepAlive(t, rpc, m.session())
		members = append(members, m)
	}
	// Once the moves are done, every shard is owned by exactly one member,
	// each member owns its share, and the store agrees, member by member.
	require.Eventually(t, func() bool {
		owners, ok := partition(60, members...)
		if !ok {
			return false
		}
		counts := make([]int, 3)
		for _, i := range owners {
			counts[i]++
		}
		rs, err := rpc.RingStatus(ctx, &fencerv1.RingStatusRequest{Ring: "jobs"})
		require.NoError(t, err)
		if rs.GetUnowned() != 0 || len(rs.GetMembers()) != 3 {
			return false
		}
		for i, m := range rs.GetMembers() {
			if counts[i] == 0 || int(m.GetOwned()) != counts[i] {
				return false
			}
		}
		return true
	}, ringWait, 20*time.Millisecond, "each member owns its share")
}

// A member that joins moves shards: the old owner is told LOSING,
// releases them, and the new member gains them; the old token is then
// stale for every guarded write.
func TestRingJoinMovesShardsThroughLosing(t *testing.T) {
	ctx := fencertest.Context(t)
	st := fencertest.SharedStore(t)
	addr, srv := startServer(t, st)
	rpc := fencerv1.NewFencerServiceClient(dial(t, alice, addr))
	_, err := rpc.CreateRing(ctx, &fencerv1.CreateRingRequest{Ring: "moves", ShardCount: 16})
	require.NoError(t, err)
	a := join(t, rpc, &fencerv1.JoinRingRequest{Ring: "moves", Member: "a", DrainSeconds: 600}, false)
	keepAlive(t, rpc, a.session())
	requirePartition(t, 16, a)
	before := a.ownedNow()
	for shard, tok := range before {
		_, err := rpc.Put(ctx, &fencerv1.PutRequest{Token: tok, Key: "moves/" + shard, Value: []byte("a")})
		require.NoError(t, err)
	}

	b := join(t, rpc, &fencerv1.JoinRingRequest{Ring: "moves", Member: "b"}, false)
	keepAlive(t, rpc, b.session())
	var losing []string
	require.Eventually(t, func() bool {
		losing = a.changesOf(fencerv1.ShardChange_KIND_LOSING)
		return len(losing) > 0 && len(losing) < 16
	}, ringWait, 10*time.Millisecond, "a is told it is losing some shards")
	time.Sleep(200 * time.Millisecond) // every LOSING of the move has come
	losing = a.changesOf(fencerv1.ShardChange_KIND_LOSING)
	require.Empty(t, b.ownedNow(), "b gains nothing that a still holds (drain 600s)")

	// Releasing a shard a is not losing is refused, and changes nothing.
	var kept string
	for shard := range before {
		if !contains(losing, shard) {
			kept = shard
			break
		}
	}
	_, err = rpc.ReleaseShards(ctx, &fencerv1.ReleaseShardsRequest{Ring: "moves", SessionId: a.session(), Shards: []string{kept}})
	requireCode(t, err, codes.FailedPrecondition, fencerv1.ErrorReason_ERROR_REASON_LEASE_NOT_HELD)
	require.Contains(t, a.ownedNow(), kept)

	rel, err := rpc.ReleaseShards(ctx, &fencerv1.ReleaseShardsRequest{Ring: "moves", SessionId: a.session(), Shards: losing})
	require.NoError(t, err)
	require.Equal(t, int32(len(losing)), rel.GetReleased())
	require.Eventually(t, func() bool { return len(b.ownedNow()) == len(losing) && len(a.ownedNow()) == 16-len(losing) },
		ringWait, 10*time.Millisecond, "b gains what a released")
	requirePartition(t, 16, a, b)
	require.ElementsMatch(t, losing, shardKeys(b.ownedNow()), "b gained exactly what a released")
	require.ElementsMatch(t, losing, a.changesOf(fencerv1.ShardChange_KIND_LOST))
	require.Positive(t, scrape(t, srv, `fencer_server_ring_shard_changes_total{kind="losing"}`))

	// a's old token of a moved shard is stale for every guarded call;
	// b's token writes.
	moved := losing[0]
	_, err = rpc.Put(ctx, &fencerv1.PutRequest{Token: before[moved], Key: "moves/" + moved, Value: []byte("late")})
	requireCode(t, err, codes.FailedPrecondition, fencerv1.ErrorReason_ERROR_REASON_STALE_TOKEN)
	_, err = rpc.Check(ctx, &fencerv1.CheckRequest{Token: before[moved]})
	requireCode(t, err, codes.FailedPrecondition, fencerv1.ErrorReason_ERROR_REASON_STALE_TOKEN)
	_, err = rpc.Put(ctx, &fencerv1.PutRequest{Token: b.ownedNow()[moved], Key: "moves/" + moved, Value: []byte("b")})
	require.NoError(t, err)
	got, err := rpc.Get(ctx, &fencerv1.GetRequest{Key: "moves/" + moved})
	require.NoError(t, err)
	require.Equal(t, "b", string(got.GetValue()))
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func shardKeys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// LeaveRing hands everything off; the stream ends OK after a LOST of
// every shard, and the other member owns them all.
func TestRingLeaveEndsTheStreamAfterLostOfAll(t *testing.T) {
	ctx := fencertest.Context(t)
	st := fencertest.SharedStore(t)
	addr, srv := startServer(t, st)
	rpc := fencerv1.NewFencerServiceClient(dial(t, alice, addr))
	_, err := rpc.CreateRing(ctx, &fencerv1.CreateRingRequest{Ring: "leave", ShardCount: 12})
	require.NoError(t, err)
	a := join(t, rpc, &fencerv1.JoinRingRequest{Ring: "leave", Member: "a"}, true)
	keepAlive(t, rpc, a.session())
	b := join(t, rpc, &fencerv1.JoinRingRequest{Ring: "leave", Member: "b"}, true)
	keepAlive(t, rpc, b.session())
	requirePartition(t, 12, a, b)
	had := shardKeys(a.ownedNow())
	require.NotEmpty(t, had)

	_, err = rpc.LeaveRing(ctx, &fencerv1.LeaveRingRequest{Ring: "leave", SessionId: a.session()})
	require.NoError(t, err)
	require.NoError(t, a.ended("a's stream after LeaveRing"))
	require.Empty(t, a.ownedNow())
	require.Subset(t, a.changesOf(fencerv1.ShardChange_KIND_LOST), had)
	requirePartition(t, 12, b)
	require.Eventually(t, func() bool {
		rs, err := rpc.RingStatus(ctx, &fencerv1.RingStatusRequest{Ring: "leave"})
		require.NoError(t, err)
		return len(rs.GetMembers()) == 1 && rs.GetMembers()[0].GetMember() == "b" && rs.GetUnowned() == 0
	}, ringWait, 10*time.Millisecond)
	require.Eventually(t, func() bool {
		return scrape(t, srv, "fencer_server_ring_members") == 1 && scrape(t, srv, "fencer_server_ring_shards_owned") == 12
	}, ringWait, 10*time.Millisecond, "the gauges count b alone")
}

// A member whose session expires: its stream ends SESSION_NOT_FOUND, and
// the other member owns its shards.
func TestRingSessionExpiryEndsTheStreamAndFreesShards(t *testing.T) {
	ctx := fencertest.Context(t)
	st := fencertest.SharedStore(t)
	addr, _ := startServer(t, st)
	rpc := fencerv1.NewFencerServiceClient(dial(t, alice, addr))
	_, err := rpc.CreateRing(ctx, &fencerv1.CreateRingRequest{Ring: "expiry", ShardCount: 10})
	require.NoError(t, err)
	short := join(t, rpc, &fencerv1.JoinRingRequest{Ring: "expiry", Member: "short", TtlSeconds: 2}, true) // never renewed
	long := join(t, rpc, &fencerv1.JoinRingRequest{Ring: "expiry", Member: "long"}, true)
	keepAlive(t, rpc, long.session())
	err = short.ended("the stream of a member whose session expires")
	requireCode(t, err, codes.NotFound, fencerv1.ErrorReason_ERROR_REASON_SESSION_NOT_FOUND)
	requirePartition(t, 10, long)
}

// A second JoinRing of the same session and ring replaces the first,
// whose stream ends ABORTED.
func TestRingJoinAgainReplacesTheStream(t *testing.T) {
	ctx := fencertest.Context(t)
	st := fencertest.SharedStore(t)
	addr, srv := startServer(t, st)
	rpc := fencerv1.NewFencerServiceClient(dial(t, alice, addr))
	_, err := rpc.CreateRing(ctx, &fencerv1.CreateRingRequest{Ring: "rejoin", ShardCount: 4})
	require.NoError(t, err)
	first := join(t, rpc, &fencerv1.JoinRingRequest{Ring: "rejoin", Member: "w"}, true)
	keepAlive(t, rpc, first.session())
	requirePartition(t, 4, first)
	second := join(t, rpc, &fencerv1.JoinRingRequest{Ring: "rejoin", Member: "w", SessionId: first.session()}, true)
	err = first.ended("the replaced stream")
	requireCode(t, err, codes.Aborted, fencerv1.ErrorReason_ERROR_REASON_RING_CONFLICT)
	require.Equal(t, first.ownedNow(), second.ownedNow(), "the snapshot of the new stream is what the member holds")
	require.Empty(t, second.first.GetSessionSecret(), "no session was opened")
	require.Equal(t, 1.0, scrape(t, srv, "fencer_server_ring_members"))
}

// Bad input fails with its code, and writes nothing.
func TestRingBadInput(t *testing.T) {
	ctx := fencertest.Context(t)
	st := fencertest.SharedStore(t)
	addr, _ := startServer(t, st)
	rpc := fencerv1.NewFencerServiceClient(dial(t, alice, addr))
	bobs := fencerv1.NewFencerServiceClient(dial(t, bob, addr))
	_, err := rpc.CreateRing(ctx, &fencerv1.CreateRingRequest{Ring: "bad", ShardCount: 3})
	require.NoError(t, err)
	w := join(t, rpc, &fencerv1.JoinRingRequest{Ring: "bad", Member: "w"}, true)
	keepAlive(t, rpc, w.session())
	requirePartition(t, 3, w)
	before := storeRevision(t, st)

	invalid := func(err error, field string) {
		t.Helper()
		requireCode(t, err, codes.InvalidArgument, fencerv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT)
		require.Equal(t, field, fieldOf(t, err), status.Convert(err).Message())
	}
	_, err = rpc.CreateRing(ctx, &fencerv1.CreateRingRequest{Ring: "x", Shards: []string{""}})
	invalid(err, "shards[0]")
	_, err = rpc.CreateRing(ctx, &fencerv1.CreateRingRequest{Ring: "x", Shards: []string{"a", strings.Repeat("s", 129)}})
	invalid(err, "shards[1]")
	_, err = rpc.CreateRing(ctx, &fencerv1.CreateRingRequest{Ring: "x", Shards: []string{"a", "a"}})
	invalid(err, "shards[1]")
	_, err = rpc.CreateRing(ctx, &fencerv1.CreateRingRequest{Ring: "x", ShardCount: 2, Shards: []string{"a"}})
	invalid(err, "shards")
	_, err = rpc.CreateRing(ctx, &fencerv1.CreateRingRequest{Ring: "x", ShardCount: 100001})
	invalid(err, "shard_count")
	_, err = rpc.CreateRing(ctx, &fencerv1.CreateRingRequest{Ring: "Bad:Name", ShardCount: 1})
	invalid(err, "ring")
	_, err = rpc.CreateRing(ctx, &fencerv1.CreateRingRequest{Ring: "bad", ShardCount: 4})
	requireCode(t, err, codes.AlreadyExists, fencerv1.ErrorReason_ERROR_REASON_RING_CONFLICT)
	_, err = rpc.Owns(ctx, &fencerv1.OwnsRequest{Ring: "bad", SessionId: w.session(), Shard: "7"})
	invalid(err, "shard")
	_, err = rpc.ReleaseShards(ctx, &fencerv1.ReleaseShardsRequest{Ring: "bad", SessionId: w.session()})
	invalid(err, "shards")
	_, err = tryJoin(t, rpc, &fencerv1.JoinRingRequest{Ring: "bad", DrainSeconds: 601}, false)
	invalid(err, "drain_seconds")
	_, err = tryJoin(t, rpc, &fencerv1.JoinRingRequest{Ring: "bad", Member: "a/b"}, false)
	invalid(err, "member")
	_, err = tryJoin(t, rpc, &fencerv1.JoinRingRequest{Ring: "bad", SessionId: w.session(), TtlSeconds: 5}, false)
	invalid(err, "ttl_seconds")
	_, err = rpc.Acquire(ctx, &fencerv1.AcquireRequest{Name: "ring:bad:0"})
	invalid(err, "name")

	_, err = tryJoin(t, rpc, &fencerv1.JoinRingRequest{Ring: "nowhere"}, false)
	requireCode(t, err, codes.NotFound, fencerv1.ErrorReason_ERROR_REASON_RING_NOT_FOUND)
	_, err = rpc.RingStatus(ctx, &fencerv1.RingStatusRequest{Ring: "nowhere"})
	requireCode(t, err, codes.NotFound, fencerv1.ErrorReason_ERROR_REASON_RING_NOT_FOUND)

	// The member name is taken by w's session.
	_, err = tryJoin(t, rpc, &fencerv1.JoinRingRequest{Ring: "bad", Member: "w"}, false)
	requireCode(t, err, codes.AlreadyExists, fencerv1.ErrorReason_ERROR_REASON_RING_CONFLICT)
	// Another principal's session.
	_, err = tryJoin(t, bobs, &fencerv1.JoinRingRequest{Ring: "bad", SessionId: w.session()}, false)
	requireCode(t, err, codes.PermissionDenied, fencerv1.ErrorReason_ERROR_REASON_PERMISSION_DENIED)
	_, err = bobs.LeaveRing(ctx, &fencerv1.LeaveRingRequest{Ring: "bad", SessionId: w.session()})
	requireCode(t, err, codes.PermissionDenied, fencerv1.ErrorReason_ERROR_REASON_PERMISSION_DENIED)
	_, err = bobs.Owns(ctx, &fencerv1.OwnsRequest{Ring: "bad", SessionId: w.session(), Shard: "0"})
	requireCode(t, err, codes.PermissionDenied, fencerv1.ErrorReason_ERROR_REASON_PERMISSION_DENIED)

	// Failed joins that opened a session revoked it, and nothing else
	// was written: the revisions since are those revocations alone.
	require.Equal(t, 3, len(w.ownedNow()))
	rs, err := rpc.RingStatus(ctx, &fencerv1.RingStatusRequest{Ring: "bad"})
	require.NoError(t, err)
	require.Len(t, rs.GetMembers(), 1)
	requireNoKeysSince(t, st, before)
}

// storeRevision is the store's current revision.
func storeRevision(t *testing.T, st *etcdstore.Store) int64 {
	t.Helper()
	resp, err := st.Client().Get(context.Background(), st.Prefix(), clientv3.WithCountOnly())
	require.NoError(t, err)
	return resp.Header.Revision
}

// requireNoKeysSince checks that no key under the store's prefix exists
// that was created or changed after revision rev.
func requireNoKeysSince(t *testing.T, st *etcdstore.Store, rev int64) {
	t.Helper()
	resp, err := st.Client().Get(context.Background(), st.Prefix(), clientv3.WithPrefix(), clientv3.WithMinModRev(rev+1))
	require.NoError(t, err)
	var names []string
	for _, kv := range resp.Kvs {
		names = append(names, string(kv.Key))
	}
	require.Empty(t, names, "keys written since revision %d", rev)
}

// fieldOf returns the field an INVALID_ARGUMENT names in its metadata.
func fieldOf(t *testing.T, err error) string {
	t.Helper()
	for _, d := range status.Convert(err).Details() {
		if ei, ok := d.(interface{ GetMetadata() map[string]string }); ok {
			return ei.GetMetadata()["field"]
		}
	}
	return ""
}

// Under an Authorization, a principal without a grant of the ring is
// refused every ring call, and nothing is written; a ring grant covers
// the ring's shard leases in guarded calls.
func TestRingAuthorization(t *testing.T) {
	ctx := fencertest.Context(t)
	auth, err := server.NewBearerTokens(testTokens)
	require.NoError(t, err)
	dir := t.TempDir()
	path := filepath.Join(dir, "authz.yaml")
	require.NoError(t, os.WriteFile(path, []byte(`
principals:
  alice:
    rings: ["orders*"]
    write: ["orders/*"]
  bob:
    rings: ["billing"]
    write: ["*"]
`), 0o600))
	authz, err := server.LoadAuthorization(path)
	require.NoError(t, err)
	st := fencertest.SharedStore(t)
	addr, _ := serve(t, server.Config{Store: st, Authenticator: auth, Authorization: authz})
	rpc := fencerv1.NewFencerServiceClient(dial(t, alice, addr))
	bobs := fencerv1.NewFencerServiceClient(dial(t, bob, addr))

	_, err = rpc.CreateRing(ctx, &fencerv1.CreateRingRequest{Ring: "orders", ShardCount: 2})
	require.NoError(t, err)
	m := join(t, rpc, &fencerv1.JoinRingRequest{Ring: "orders", Member: "w"}, true)
	keepAlive(t, rpc, m.session())
	requirePartition(t, 2, m)
	tok := m.ownedNow()["0"]
	_, err = rpc.Put(ctx, &fencerv1.PutRequest{Token: tok, Key: "orders/0", Value: []byte("v")})
	require.NoError(t, err)
	_, err = rpc.Check(ctx, &fencerv1.CheckRequest{Token: tok})
	require.NoError(t, err, "the ring grant covers its shards' leases")
	leases, err := rpc.ListLeases(ctx, &fencerv1.ListLeasesRequest{NamePrefix: "ring:orders:"})
	require.NoError(t, err)
	require.Len(t, leases.GetLeases(), 2)

	before := storeRevision(t, st)
	denied := func(err error) {
		t.Helper()
		requireCode(t, err, codes.PermissionDenied, fencerv1.ErrorReason_ERROR_REASON_PERMISSION_DENIED)
	}
	_, err = bobs.CreateRing(ctx, &fencerv1.CreateRingRequest{Ring: "orders-2", ShardCount: 2})
	denied(err)
	_, err = tryJoin(t, bobs, &fencerv1.JoinRingRequest{Ring: "orders"}, false)
	denied(err)
	_, err = bobs.RingStatus(ctx, &fencerv1.RingStatusRequest{Ring: "orders"})
	denied(err)
	_, err = bobs.Owns(ctx, &fencerv1.OwnsRequest{Ring: "orders", SessionId: m.session(), Shard: "0"})
	denied(err)
	_, err = bobs.ReleaseShards(ctx, &fencerv1.ReleaseShardsRequest{Ring: "orders", SessionId: m.session(), Shards: []string{"0"}})
	denied(err)
	_, err = bobs.LeaveRing(ctx, &fencerv1.LeaveRingRequest{Ring: "orders", SessionId: m.session()})
	denied(err)
	_, err = bobs.Check(ctx, &fencerv1.CheckRequest{Token: tok})
	denied(err)
	_, err = bobs.Put(ctx, &fencerv1.PutRequest{Token: tok, Key: "x", Value: []byte("v")})
	denied(err)
	requireNoKeysSince(t, st, before)
}

// The ring's writes have their audit records: the ring created, the
// member joined and left, each shard acquired and handed off; a hand-off
// is no loss, for the records and for fencer_server_leases_lost_total.
func TestRingAuditRecords(t *testing.T) {
	ctx := fencertest.Context(t)
	st := fencertest.SharedStore(t)
	rec := newRecorder()
	auth, err := server.NewBearerTokens(testTokens)
	require.NoError(t, err)
	addr, srv := serve(t, server.Config{Store: st, Authenticator: auth, Logger: slog.New(rec)})
	// The server's holder-key watch, which would record losses, runs from
	// the first passed readiness check.
	require.Eventually(t, func() bool { return scrape(t, srv, "fencer_etcd_up") == 1 }, 10*time.Second, 10*time.Millisecond)
	rpc := fencerv1.NewFencerServiceClient(dial(t, alice, addr))
	_, err = rpc.CreateRing(ctx, &fencerv1.CreateRingRequest{Ring: "audited", ShardCount: 2})
	require.NoError(t, err)
	_, err = rpc.CreateRing(ctx, &fencerv1.CreateRingRequest{Ring: "audited", ShardCount: 2})
	require.NoError(t, err)
	requireRecords(t, rec.audit("create ring"), map[string]any{"principal": "alice", "ring": "audited", "shards": int64(2)})

	m := join(t, rpc, &fencerv1.JoinRingRequest{Ring: "audited", Member: "w"}, true)
	keepAlive(t, rpc, m.session())
	owned := requirePartition(t, 2, m)
	require.Len(t, owned, 2)
	holder := rec.audit("join ring")[0]["holder"]
	requireRecords(t, rec.audit("join ring"), map[string]any{"principal": "alice", "ring": "audited", "member": "w"})
	require.True(t, strings.HasPrefix(holder.(string), "alice/"))
	toks := m.ownedNow()
	require.Eventually(t, func() bool { return len(rec.audit("acquire")) == 2 }, ringWait, 10*time.Millisecond)
	for _, r := range rec.audit("acquire") {
		shard := r["shard"].(string)
		require.Equal(t, map[string]any{"principal": "alice", "lease": "ring:audited:" + shard, "token": toks[shard], "holder": holder, "ring": "audited"},
			map[string]any{"principal": r["principal"], "lease": r["lease"], "token": r["token"], "holder": r["holder"], "ring": r["ring"]})
	}

	_, err = rpc.LeaveRing(ctx, &fencerv1.LeaveRingRequest{Ring: "audited", SessionId: m.session()})
	require.NoError(t, err)
	require.NoError(t, m.ended("the stream after LeaveRing"))
	requireRecords(t, rec.audit("leave ring"), map[string]any{"principal": "alice", "ring": "audited", "member": "w", "holder": holder})
	require.Len(t, rec.audit("release"), 2)
	for _, r := range rec.audit("release") {
		require.Equal(t, toks[r["shard"].(string)], r["token"])
	}
	time.Sleep(200 * time.Millisecond) // what the holder-key watch would record comes by now
	require.Empty(t, rec.audit("lost"))
	require.Zero(t, scrape(t, srv, "fencer_server_leases_lost_total"))
}

// JoinRings of one session and ring that race take turns: one stream
// survives, each other ends ABORTED, and one member runs.
func TestRingConcurrentJoinsOfOneSessionLeaveOneMember(t *testing.T) {
	ctx := fencertest.Context(t)
	st := fencertest.SharedStore(t)
	addr, srv := startServer(t, st)
	rpc := fencerv1.NewFencerServiceClient(dial(t, alice, addr))
	_, err := rpc.CreateRing(ctx, &fencerv1.CreateRingRequest{Ring: "race", ShardCount: 4})
	require.NoError(t, err)
	first := join(t, rpc, &fencerv1.JoinRingRequest{Ring: "race", Member: "w"}, true)
	keepAlive(t, rpc, first.session())
	const n = 5
	streams := make([]*ringStream, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := tryJoin(t, rpc, &fencerv1.JoinRingRequest{Ring: "race", Member: "w", SessionId: first.session()}, true)
			if err == nil {
				streams[i] = s
			} else {
				requireCode(t, err, codes.Aborted, fencerv1.ErrorReason_ERROR_REASON_RING_CONFLICT) // replaced before its snapshot
			}
		}()
	}
	wg.Wait()
	requireCode(t, first.ended("the first stream"), codes.Aborted, fencerv1.ErrorReason_ERROR_REASON_RING_CONFLICT)
	require.Eventually(t, func() bool {
		running := 0
		for _, s := range streams {
			if s == nil {
				continue
			}
			select {
			case <-s.done:
				requireCode(t, s.err, codes.Aborted, fencerv1.ErrorReason_ERROR_REASON_RING_CONFLICT)
			default:
				running++
			}
		}
		return running == 1
	}, ringWait, 10*time.Millisecond, "one stream survives")
	require.Equal(t, 1.0, scrape(t, srv, "fencer_server_ring_members"))
	var alive *ringStream
	for _, s := range streams {
		if s == nil {
			continue
		}
		select {
		case <-s.done:
		default:
			alive = s
		}
	}
	requirePartition(t, 4, alive)
}
