package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/fencer-dev/fencer/client"
	"github.com/fencer-dev/fencer/fencertest"
	"github.com/fencer-dev/fencer/internal/testkit/faultproxy"
	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
	"github.com/fencer-dev/fencer/token"
)

// Red-team tests of the Sessions stream of fencer serve, which carries the
// renewals and lease watches of many sessions, through raw gRPC and the Go
// client. Each asserts the safe outcome; a failure is a hole.

// rxStream is a Sessions stream whose every reply a goroutine records.
type rxStream struct {
	t  *testing.T
	st fencerv1.FencerService_SessionsClient

	mu   sync.Mutex
	msgs []*fencerv1.SessionsResponse
	err  error         // why the stream ended; nil while it runs
	news chan struct{} // signalled on every message and at the end
	done chan struct{} // closed when the stream has ended
}

// rxOpen opens a Sessions stream of c.
func rxOpen(t *testing.T, ctx context.Context, c *rrConn) *rxStream {
	t.Helper()
	st, err := c.raw.Sessions(ctx)
	require.NoError(t, err)
	x := &rxStream{t: t, st: st, news: make(chan struct{}, 1), done: make(chan struct{})}
	go func() {
		for {
			m, err := st.Recv()
			x.mu.Lock()
			if err != nil {
				x.err = err
				x.mu.Unlock()
				close(x.done)
				return
			}
			x.msgs = append(x.msgs, m)
			x.mu.Unlock()
			select {
			case x.news <- struct{}{}:
			default:
			}
		}
	}()
	return x
}

func (x *rxStream) send(req *fencerv1.SessionsRequest) error { return x.st.Send(req) }

func rxRenewReq(id int64) *fencerv1.SessionsRequest {
	return &fencerv1.SessionsRequest{Request: &fencerv1.SessionsRequest_Renew{Renew: &fencerv1.KeepAliveRequest{SessionId: id}}}
}

func rxWatchReq(wid, sid, from int64) *fencerv1.SessionsRequest {
	return &fencerv1.SessionsRequest{Request: &fencerv1.SessionsRequest_Watch{Watch: &fencerv1.SessionsWatch{WatchId: wid, Watch: &fencerv1.WatchLeaseRequest{SessionId: sid, StartRevision: from}}}}
}

func rxUnwatchReq(wid int64) *fencerv1.SessionsRequest {
	return &fencerv1.SessionsRequest{Request: &fencerv1.SessionsRequest_Unwatch{Unwatch: &fencerv1.SessionsUnwatch{WatchId: wid}}}
}

// mark is the number of replies so far: await from it sees only later ones.
func (x *rxStream) mark() int {
	x.mu.Lock()
	defer x.mu.Unlock()
	return len(x.msgs)
}

// since returns the replies from index i on.
func (x *rxStream) since(i int) []*fencerv1.SessionsResponse {
	x.mu.Lock()
	defer x.mu.Unlock()
	return append([]*fencerv1.SessionsResponse(nil), x.msgs[min(i, len(x.msgs)):]...)
}

// await returns the index and value of the first reply at or after index
// from that pred accepts, or fails after rsEnd or when the stream ends
// first.
func (x *rxStream) await(from int, what string, pred func(*fencerv1.SessionsResponse) bool) (int, *fencerv1.SessionsResponse) {
	x.t.Helper()
	i, m, err := x.awaitOrEnd(from, what, pred)
	if m == nil {
		x.t.Fatalf("%s: the stream ended first: %v", what, err)
	}
	return i, m
}

// awaitOrEnd is await that returns the stream's error, with a nil reply,
// if the stream ends first.
func (x *rxStream) awaitOrEnd(from int, what string, pred func(*fencerv1.SessionsResponse) bool) (int, *fencerv1.SessionsResponse, error) {
	x.t.Helper()
	timeout := time.After(rsEnd)
	for {
		x.mu.Lock()
		for i := from; i < len(x.msgs); i++ {
			if pred(x.msgs[i]) {
				m := x.msgs[i]
				x.mu.Unlock()
				return i, m, nil
			}
		}
		from = max(from, len(x.msgs))
		err := x.err
		x.mu.Unlock()
		if err != nil {
			return -1, nil, err
		}
		select {
		case <-x.news:
		case <-x.done:
		case <-timeout:
			x.t.Fatalf("%s: no such reply within %s", what, rsEnd)
		}
	}
}

// renew renews session id and returns its answer: renewed or renew_failed.
func (x *rxStream) renew(id int64) *fencerv1.SessionsResponse {
	x.t.Helper()
	m := x.mark()
	require.NoError(x.t, x.send(rxRenewReq(id)))
	_, r := x.await(m, fmt.Sprintf("the answer to a renewal of session %d", id), func(r *fencerv1.SessionsResponse) bool {
		return r.GetRenewed().GetSessionId() == id || r.GetRenewFailed().GetSessionId() == id
	})
	return r
}

// renewOK renews session id and fails unless it was renewed.
func (x *rxStream) renewOK(id int64) {
	x.t.Helper()
	r := x.renew(id)
	require.NotNil(x.t, r.GetRenewed(), "session %d was not renewed: %v", id, r)
	require.Positive(x.t, r.GetRenewed().GetTtlSeconds())
}

// watch starts watch wid of session sid from revision from and waits for
// its SYNCED.
func (x *rxStream) watch(wid, sid, from int64) {
	x.t.Helper()
	m := x.mark()
	require.NoError(x.t, x.send(rxWatchReq(wid, sid, from)))
	_, r := x.await(m, fmt.Sprintf("watch %d of session %d: its first reply", wid, sid), func(r *fencerv1.SessionsResponse) bool {
		return r.GetEvent().GetWatchId() == wid || r.GetWatchEnded().GetWatchId() == wid
	})
	require.Equal(x.t, fencerv1.WatchLeaseResponse_TYPE_SYNCED, r.GetEvent().GetEvent().GetType(), "watch %d of session %d did not start with SYNCED: %v", wid, sid, r)
}

// ended waits for watch wid's watch_ended from index from and returns its
// error.
func (x *rxStream) ended(from int, wid int64) *fencerv1.SessionsError {
	x.t.Helper()
	_, r := x.await(from, fmt.Sprintf("watch_ended of watch %d", wid), func(r *fencerv1.SessionsResponse) bool {
		return r.GetWatchEnded() != nil && r.GetWatchEnded().GetWatchId() == wid
	})
	return r.GetWatchEnded().GetError()
}

// lost waits for a LOST event of tok under watch wid from index from.
func (x *rxStream) lost(from int, wid int64, tok string) int {
	x.t.Helper()
	i, _ := x.await(from, fmt.Sprintf("LOST of %s under watch %d", tok, wid), func(r *fencerv1.SessionsResponse) bool {
		return r.GetEvent().GetWatchId() == wid && r.GetEvent().GetEvent().GetType() == fencerv1.WatchLeaseResponse_TYPE_LOST && r.GetEvent().GetEvent().GetToken() == tok
	})
	return i
}

// end waits for the stream to end and returns why.
func (x *rxStream) end(what string) error {
	x.t.Helper()
	select {
	case <-x.done:
	case <-time.After(rsEnd):
		x.t.Fatalf("%s: the stream did not end within %s", what, rsEnd)
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.err
}

// running fails if the stream has ended.
func (x *rxStream) running(what string) {
	x.t.Helper()
	x.mu.Lock()
	defer x.mu.Unlock()
	require.NoError(x.t, x.err, "%s: the stream ended", what)
}

// rxErr asserts that a Sessions error has code c and reason r.
func rxErr(t *testing.T, e *fencerv1.SessionsError, c codes.Code, r string, msgAndArgs ...any) {
	t.Helper()
	require.NotNil(t, e, msgAndArgs...)
	require.Equal(t, c, codes.Code(e.GetCode()), "%v %v", e, fmt.Sprint(msgAndArgs...))
	require.Equal(t, r, e.GetReason(), "%v %v", e, fmt.Sprint(msgAndArgs...))
}

// rxLease acquires lease name through c's existing session sid and returns
// its token.
func rxLease(t *testing.T, c *rrConn, sid int64, name string) string {
	t.Helper()
	r, err := c.raw.Acquire(rrCtx(t), &fencerv1.AcquireRequest{Name: name, SessionId: sid})
	require.NoError(t, err, name)
	return r.GetToken()
}

// rxRelease releases tok as anyone holding it may.
func rxRelease(t *testing.T, c *rrConn, tok string) {
	t.Helper()
	_, err := c.raw.Release(rrCtx(t), rrReleaseTok(tok))
	require.NoError(t, err, tok)
}

// rxRevoke releases session id (its owner's Release of the session).
func rxRevoke(t *testing.T, c *rrConn, id int64) {
	t.Helper()
	_, err := c.raw.Release(rrCtx(t), &fencerv1.ReleaseRequest{Target: &fencerv1.ReleaseRequest_SessionId{SessionId: id}})
	require.NoError(t, err)
}

// rxForeign fails for every reply of msgs that names a session of
// sessions, a watch of watches, or a token of tokens.
func rxForeign(t *testing.T, msgs []*fencerv1.SessionsResponse, sessions []int64, watches []int64, tokens []string, what string) {
	t.Helper()
	for i, m := range msgs {
		for _, id := range sessions {
			if m.GetRenewed().GetSessionId() == id {
				t.Errorf("%s: reply %d renewed session %d: %v", what, i, id, m)
			}
		}
		for _, w := range watches {
			if m.GetEvent() != nil && m.GetEvent().GetWatchId() == w || m.GetWatchEnded() != nil && m.GetWatchEnded().GetWatchId() == w {
				t.Errorf("%s: reply %d is of watch %d: %v", what, i, w, m)
			}
		}
		for _, tok := range tokens {
			if m.GetEvent().GetEvent().GetToken() == tok {
				t.Errorf("%s: reply %d carries token %s: %v", what, i, tok, m)
			}
		}
	}
}

// rxRevision is the store revision of token tok.
func rxRevision(t *testing.T, tok string) int64 {
	t.Helper()
	p, err := token.Parse(tok)
	require.NoError(t, err)
	return p.Revision
}

// Another principal's session on a shared stream: bob cannot renew it
// (renew_failed PERMISSION_DENIED, and it still expires), cannot watch it
// (watch_ended PERMISSION_DENIED, from now or from its history), and sees
// none of its events, while his own sessions, renewed and watched on the
// same stream, keep working.
func TestRedTeamSessionsCrossPrincipal(t *testing.T) {
	s, _ := rsServer(t)
	alice, bob := rrDial(t, s, rsAliceTok), rrDial(t, s, rsBobTok)
	a := rsSession(t, alice, "x-a", 3)
	a2 := rxLease(t, alice, a.SessionId, "x-a2")
	b1, b2 := rsSession(t, bob, "x-b1", 30), rsSession(t, bob, "x-b2", 30)
	ctx := rrCtx(t)

	ax := rxOpen(t, ctx, alice)
	ax.watch(7, a.SessionId, 0)

	x := rxOpen(t, ctx, bob)
	x.renewOK(b1.SessionId)
	denied := x.renew(a.SessionId).GetRenewFailed().GetError()
	rxErr(t, denied, codes.PermissionDenied, "PERMISSION_DENIED", "bob renewing alice's session")
	require.NotContains(t, fmt.Sprint(denied), "alice", "the refusal names the session's owner")
	for i, from := range []int64{0, rxRevision(t, a.Token), 1} {
		m := x.mark()
		wid := int64(i + 1)
		require.NoError(t, x.send(rxWatchReq(wid, a.SessionId, from)))
		e := x.ended(m, wid)
		rxErr(t, e, codes.PermissionDenied, "PERMISSION_DENIED", "bob watching alice's session from", from, i)
		require.NotContains(t, fmt.Sprint(e), "alice", "the refusal names the session's owner")
	}
	x.watch(4, b2.SessionId, 0)
	x.watch(5, b1.SessionId, 0)
	x.renewOK(b2.SessionId)

	// Alice's lease lost: her watch hears it, bob's stream does not.
	rxRelease(t, alice, a2)
	ax.lost(0, 7, a2)

	// Bob renews alice's session every 100 ms, his own in between: hers
	// expires after its 3 s TTL all the same.
	start := time.Now()
	expired := false
	for time.Since(start) < 15*time.Second && !expired {
		r := x.renew(a.SessionId)
		require.Nil(t, r.GetRenewed(), "bob renewed alice's session: %v", r)
		x.renewOK(b1.SessionId)
		_, err := alice.raw.Check(ctx, &fencerv1.CheckRequest{Token: a.Token})
		expired = err != nil
		time.Sleep(100 * time.Millisecond)
	}
	require.True(t, expired, "alice's session, renewed only by bob, never expired")
	t.Logf("alice's session expired %s after bob started renewing it", time.Since(start))
	rxErr(t, ax.ended(0, 7), codes.NotFound, "SESSION_NOT_FOUND", "alice's watch of her expired session")

	// Bob's own sessions still work, and nothing of alice's reached him.
	x.renewOK(b1.SessionId)
	x.renewOK(b2.SessionId)
	rxB := rxLease(t, bob, b1.SessionId, "x-b3")
	rxRelease(t, bob, rxB)
	m := x.lost(0, 5, rxB)
	require.NotContains(t, fmt.Sprint(x.since(0)), "x-a", "an event of alice's leases reached bob's stream")
	rxForeign(t, x.since(0), []int64{a.SessionId}, []int64{7}, []string{a.Token, a2}, "bob's stream")
	for _, r := range x.since(0)[:m] {
		if r.GetEvent().GetWatchId() == 4 && r.GetEvent().GetEvent().GetType() == fencerv1.WatchLeaseResponse_TYPE_LOST {
			t.Errorf("bob's watch 4 (of session b2, whose lease was never lost) got %v", r)
		}
	}
	x.running("bob's stream")
}

// One stream watches three sessions of alice's under increasing
// watch_ids: each watch gets the events of its own session only, the same
// session watched twice gets them under both, a huge watch_id works,
// nothing comes under a watch_id after its unwatch, a watch_id not above
// every one used before (reused after its unwatch, or lower) ends that
// stream with INVALID_ARGUMENT and no other, and unwatches of ended or
// unknown watches change nothing.
func TestRedTeamSessionsRouting(t *testing.T) {
	s, _ := rsServer(t)
	alice := rrDial(t, s, rsAliceTok)
	ctx := rrCtx(t)
	s1, s2, s3 := rsSession(t, alice, "r1", 30), rsSession(t, alice, "r2", 30), rsSession(t, alice, "r3", 30)
	r1a, r1b, r1c := rxLease(t, alice, s1.SessionId, "r1a"), rxLease(t, alice, s1.SessionId, "r1b"), rxLease(t, alice, s1.SessionId, "r1c")
	r2a, r2b := rxLease(t, alice, s2.SessionId, "r2a"), rxLease(t, alice, s2.SessionId, "r2b")
	const huge, maxID = int64(1) << 62, int64(math.MaxInt64)

	x := rxOpen(t, ctx, alice)
	x.watch(10, s1.SessionId, 0)
	x.watch(20, s2.SessionId, 0)
	x.watch(30, s1.SessionId, 0) // the same session, twice
	x.watch(40, s3.SessionId, 0)
	x.watch(50, s2.SessionId, 0)
	x.renewOK(s1.SessionId)

	rxRelease(t, alice, r1a)
	x.lost(0, 10, r1a)
	x.lost(0, 30, r1a)
	rxRelease(t, alice, r2a)
	x.lost(0, 20, r2a)
	x.lost(0, 50, r2a)

	// Unwatch 10; the renewal after it is answered once the server has
	// handled the unwatch: nothing of watch 10 may follow that answer.
	require.NoError(t, x.send(rxUnwatchReq(10)))
	x.renewOK(s2.SessionId)
	cut := x.mark()
	rxRelease(t, alice, r1b)
	x.lost(0, 30, r1b)
	x.renewOK(s2.SessionId)
	rxForeign(t, x.since(cut), nil, []int64{10}, nil, "after the unwatch of watch 10")

	// A new watch of s2 carries s2's losses, not s1's.
	cut = x.mark()
	x.watch(60, s2.SessionId, 0)
	rxRelease(t, alice, r1c)
	x.lost(cut, 30, r1c)
	rxRelease(t, alice, r2b)
	x.lost(cut, 60, r2b)
	x.lost(cut, 20, r2b)
	x.lost(cut, 50, r2b)
	x.renewOK(s2.SessionId)
	for _, m := range x.since(cut) {
		if m.GetEvent().GetWatchId() == 60 && (m.GetEvent().GetEvent().GetToken() == r1c || m.GetEvent().GetEvent().GetToken() == r1b) {
			t.Errorf("watch 60, of session %d, got session %d's loss: %v", s2.SessionId, s1.SessionId, m)
		}
	}

	// s3 ends: only its watch ends.
	cut = x.mark()
	rxRevoke(t, alice, s3.SessionId)
	rxErr(t, x.ended(cut, 40), codes.NotFound, "SESSION_NOT_FOUND", "the watch of the released session s3")
	rxErr(t, x.renew(s3.SessionId).GetRenewFailed().GetError(), codes.NotFound, "SESSION_NOT_FOUND", "renewing the released session s3")
	x.renewOK(s1.SessionId)
	for _, m := range x.since(cut) {
		if we := m.GetWatchEnded(); we != nil && we.GetWatchId() != 40 {
			t.Errorf("the end of session s3 ended watch %d: %v", we.GetWatchId(), m)
		}
	}
	cut = x.mark()
	x.watch(huge, s1.SessionId, 0)

	// Unwatches of an unwatched, a never used and an ended id, the first
	// twice over: the stream and its live watches go on.
	for _, id := range []int64{10, 10, 12345, 40} {
		require.NoError(t, x.send(rxUnwatchReq(id)))
	}
	x.renewOK(s1.SessionId)
	x.running("after unwatches of unknown watch_ids")
	r1d := rxLease(t, alice, s1.SessionId, "r1d")
	rxRelease(t, alice, r1d)
	x.lost(cut, 30, r1d)
	x.lost(cut, huge, r1d)
	x.watch(maxID, s2.SessionId, 0)
	x.renewOK(s2.SessionId)

	// Every watch's first reply was SYNCED, and no watch got an event
	// after its watch_ended.
	seen, endedIDs := map[int64]bool{}, map[int64]bool{}
	for i, m := range x.since(0) {
		if e := m.GetEvent(); e != nil {
			if !seen[e.GetWatchId()] {
				require.Equal(t, fencerv1.WatchLeaseResponse_TYPE_SYNCED, e.GetEvent().GetType(), "reply %d: the first of watch %d is %v", i, e.GetWatchId(), m)
				seen[e.GetWatchId()] = true
			}
			if endedIDs[e.GetWatchId()] {
				t.Errorf("reply %d: an event of watch %d after its watch_ended: %v", i, e.GetWatchId(), m)
			}
		}
		if we := m.GetWatchEnded(); we != nil {
			endedIDs[we.GetWatchId()] = true
		}
	}

	// A watch_id not above every one used before ends its stream, reused
	// after its unwatch or lower; other streams go on.
	for name, ids := range map[string][]int64{"reused after its unwatch": {5, 5}, "lower": {9, 8}} {
		y := rxOpen(t, ctx, alice)
		y.watch(ids[0], s1.SessionId, 0)
		require.NoError(t, y.send(rxUnwatchReq(ids[0])))
		require.NoError(t, y.send(rxWatchReq(ids[1], s1.SessionId, 0)))
		rrCode(t, y.end("a watch_id "+name), codes.InvalidArgument, "a watch_id", name)
	}
	x.renewOK(s1.SessionId)
	x.running("after other streams reused watch_ids")
}

// Watch, unwatch and renew interleaved at a high rate on one stream,
// while another session's leases are acquired and released all along:
// a watch of the quiet session s2 never gets a LOST event (s2 loses
// nothing), no watch_id gets a reply after the answer to the renewal sent
// right after its unwatch, and the stream survives.
func TestRedTeamSessionsChurn(t *testing.T) {
	s, _ := rsServer(t)
	alice := rrDial(t, s, rsAliceTok)
	ctx := rrCtx(t)
	s1, s2 := rsSession(t, alice, "c1", 30), rsSession(t, alice, "c2", 30)
	x := rxOpen(t, ctx, alice)

	// Churn s1's leases in the background.
	stop := make(chan struct{})
	var churned atomic.Int64
	var wg sync.WaitGroup
	for g := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; ; k++ {
				select {
				case <-stop:
					return
				default:
				}
				r, err := alice.raw.Acquire(ctx, &fencerv1.AcquireRequest{Name: fmt.Sprintf("churn-%d-%d", g, k%5), SessionId: s1.SessionId})
				if err != nil {
					continue
				}
				if _, err := alice.raw.Release(ctx, rrReleaseTok(r.GetToken())); err == nil {
					churned.Add(1)
				}
			}
		}()
	}
	defer func() { close(stop); wg.Wait() }()

	// sessOf is the session each watch_id incarnation watches, in the
	// order of the barriers: barrier j (the j-th renewal of s2) follows
	// the requests in reqs[j].
	type step struct {
		unwatched []int64 // unwatched just before barrier j
		watched   map[int64]int64
	}
	var steps []step
	const rounds = 400
	live := map[int64]int64{}
	next := int64(1)
	for j := range rounds {
		st := step{watched: map[int64]int64{}}
		// Start two watches, one of each session.
		for _, sid := range []int64{s1.SessionId, s2.SessionId} {
			require.NoError(t, x.send(rxWatchReq(next, sid, 0)))
			live[next], st.watched[next] = sid, sid
			next++
		}
		// Unwatch the oldest live one, and every fourth round watch its
		// session's other at once under the next id (ids are never
		// reused).
		var oldest int64 = math.MaxInt64
		for id := range live {
			oldest = min(oldest, id)
		}
		if len(live) > 6 {
			require.NoError(t, x.send(rxUnwatchReq(oldest)))
			st.unwatched = append(st.unwatched, oldest)
			sid := live[oldest]
			delete(live, oldest)
			if j%4 == 0 {
				other := s1.SessionId
				if sid == s1.SessionId {
					other = s2.SessionId
				}
				require.NoError(t, x.send(rxWatchReq(next, other, 0)))
				live[next], st.watched[next] = other, other
				next++
			}
		}
		require.NoError(t, x.send(rxRenewReq(s2.SessionId)))
		steps = append(steps, st)
	}
	// Wait for every barrier's answer.
	x.await(0, "the last barrier", func() func(*fencerv1.SessionsResponse) bool {
		n := 0
		return func(r *fencerv1.SessionsResponse) bool {
			if r.GetRenewed().GetSessionId() == s2.SessionId || r.GetRenewFailed().GetSessionId() == s2.SessionId {
				n++
			}
			return n == rounds
		}
	}())
	// Let the churn's losses flow a moment more, then a last barrier.
	time.Sleep(500 * time.Millisecond)
	x.renewOK(s2.SessionId)
	x.running("after the churn")
	t.Logf("%d watches started, %d leases of s1 churned", next-1, churned.Load())

	// Replay: the session of each watch_id as the server had it after
	// each barrier, and the ids unwatched and not reused.
	sess := map[int64]int64{}
	dead := map[int64]bool{}
	barrier := -1
	fellBehind := 0
	var holes []string
	for i, m := range x.since(0) {
		if r := m.GetRenewed(); r != nil && r.GetSessionId() == s2.SessionId || m.GetRenewFailed().GetSessionId() == s2.SessionId {
			if f := m.GetRenewFailed(); f != nil {
				holes = append(holes, fmt.Sprintf("reply %d: barrier renewal of s2 failed: %v", i, f))
			}
			barrier++
			if barrier < len(steps) {
				for _, id := range steps[barrier].unwatched {
					dead[id] = true
				}
				for id, sid := range steps[barrier].watched {
					sess[id] = sid
					dead[id] = false
				}
			}
			continue
		}
		var wid int64
		switch {
		case m.GetEvent() != nil:
			wid = m.GetEvent().GetWatchId()
		case m.GetWatchEnded() != nil:
			// A watch may end UNAVAILABLE when it falls behind (the
			// client then watches again); a watch of the quiet session
			// s2, which loses nothing, has nothing to fall behind on.
			wid = m.GetWatchEnded().GetWatchId()
			fellBehind++
			if e := m.GetWatchEnded().GetError(); codes.Code(e.GetCode()) != codes.Unavailable || sess[wid] == s2.SessionId {
				holes = append(holes, fmt.Sprintf("reply %d: watch %d of session %d ended though its session lives: %v", i, wid, sess[wid], m))
			}
		default:
			continue
		}
		if dead[wid] {
			holes = append(holes, fmt.Sprintf("reply %d: watch %d got a reply after its unwatch had been handled: %v", i, wid, m))
		}
		if m.GetEvent().GetEvent().GetType() == fencerv1.WatchLeaseResponse_TYPE_LOST && sess[wid] == s2.SessionId && barrier >= 0 {
			// The watch's session is s2 for sure once the barrier after
			// its (re)start has been answered.
			holes = append(holes, fmt.Sprintf("reply %d: watch %d of the quiet session s2 got a LOST event: %v", i, wid, m))
		}
	}
	t.Logf("%d watches of the churned session ended UNAVAILABLE (fell behind)", fellBehind)
	require.Empty(t, holes, "%d misrouted replies, first ones: %v", len(holes), holes[:min(len(holes), 5)])
}

// The end of one session, by its Release, by expiry, or by an operator's
// revocation in etcd, ends that session's watch (watch_ended
// SESSION_NOT_FOUND, once, and nothing after it) and fails its renewals
// (renew_failed SESSION_NOT_FOUND), and nothing of the other sessions on
// the stream.
func TestRedTeamSessionsOneSessionEnds(t *testing.T) {
	s, _ := rsServer(t)
	alice := rrDial(t, s, rsAliceTok)
	ctx := rrCtx(t)
	released, kept1, kept2 := rsSession(t, alice, "e1", 30), rsSession(t, alice, "e2", 30), rsSession(t, alice, "e3", 30)
	expiring := rsSession(t, alice, "e4", 2)
	revoked := rsSession(t, alice, "e5", 30)
	x := rxOpen(t, ctx, alice)
	ids := map[int64]int64{1: released.SessionId, 2: kept1.SessionId, 3: kept2.SessionId, 4: expiring.SessionId, 5: revoked.SessionId}
	for wid := int64(1); wid <= 5; wid++ {
		x.watch(wid, ids[wid], 0)
	}
	// A second watch of each kept session.
	x.watch(12, kept1.SessionId, 0)
	x.watch(13, kept2.SessionId, 0)

	rxRevoke(t, alice, released.SessionId)
	rxErr(t, x.ended(0, 1), codes.NotFound, "SESSION_NOT_FOUND", "the watch of the released session")
	rxErr(t, x.renew(released.SessionId).GetRenewFailed().GetError(), codes.NotFound, "SESSION_NOT_FOUND", "renewing the released session")

	etcd := fencertest.Client(t, s.etcdEndpoint())
	_, err := etcd.Revoke(ctx, clientv3.LeaseID(revoked.SessionId))
	require.NoError(t, err, "the operator's revocation")
	rxErr(t, x.ended(0, 5), codes.NotFound, "SESSION_NOT_FOUND", "the watch of the session revoked in etcd")
	rxErr(t, x.renew(revoked.SessionId).GetRenewFailed().GetError(), codes.NotFound, "SESSION_NOT_FOUND", "renewing the session revoked in etcd")

	// The kept sessions renew meanwhile; the expiring one does not.
	for x.mark() >= 0 {
		x.renewOK(kept1.SessionId)
		x.renewOK(kept2.SessionId)
		if _, err := alice.raw.Check(ctx, &fencerv1.CheckRequest{Token: expiring.Token}); err != nil {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	rxErr(t, x.ended(0, 4), codes.NotFound, "SESSION_NOT_FOUND", "the watch of the expired session")
	rxErr(t, x.renew(expiring.SessionId).GetRenewFailed().GetError(), codes.NotFound, "SESSION_NOT_FOUND", "renewing the expired session")

	// The kept sessions' watches still deliver, and never ended.
	tok := rxLease(t, alice, kept1.SessionId, "e2b")
	rxRelease(t, alice, tok)
	x.lost(0, 2, tok)
	x.lost(0, 12, tok)
	tok = rxLease(t, alice, kept2.SessionId, "e3b")
	rxRelease(t, alice, tok)
	x.lost(0, 3, tok)
	x.lost(0, 13, tok)
	x.renewOK(kept1.SessionId)
	x.renewOK(kept2.SessionId)
	ends := map[int64]int{}
	for i, m := range x.since(0) {
		if we := m.GetWatchEnded(); we != nil {
			ends[we.GetWatchId()]++
			continue
		}
		if e := m.GetEvent(); e != nil && ends[e.GetWatchId()] > 0 {
			t.Errorf("reply %d: an event of watch %d after its watch_ended: %v", i, e.GetWatchId(), m)
		}
		if r := m.GetRenewed(); r != nil && (r.GetSessionId() == released.SessionId || r.GetSessionId() == revoked.SessionId || r.GetSessionId() == expiring.SessionId) {
			t.Errorf("reply %d: an ended session renewed: %v", i, m)
		}
	}
	require.Equal(t, map[int64]int{1: 1, 4: 1, 5: 1}, ends, "watch_ended per watch_id")
	x.running("after three of its sessions ended")
}

// rxStreamErr is the error that ends x: its code and fencer reason.
func rxStreamErr(t *testing.T, x *rxStream, c codes.Code, what string) {
	t.Helper()
	err := x.end(what)
	rrCode(t, err, c, what)
	if c == codes.InvalidArgument {
		require.Equal(t, fencerv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT, client.Reason(err), "%s: %v", what, err)
	}
}

// Malformed requests end the stream that sent them with INVALID_ARGUMENT,
// or, for a watch or renewal whose arguments alone are wrong, fail that
// watch or renewal with INVALID_ARGUMENT, and never renew or start
// anything; another stream of the same principal, with a live watch and
// renewals, is untouched, and so are the sessions the bad stream named.
func TestRedTeamSessionsMalformed(t *testing.T) {
	s, _ := rsServer(t)
	alice := rrDial(t, s, rsAliceTok)
	ctx := rrCtx(t)
	s1, s2 := rsSession(t, alice, "m1", 30), rsSession(t, alice, "m2", 30)
	victim := rxOpen(t, ctx, alice)
	victim.watch(1, s1.SessionId, 0)
	victim.renewOK(s1.SessionId)

	for _, c := range []struct {
		name string
		req  *fencerv1.SessionsRequest
	}{
		{"empty request", &fencerv1.SessionsRequest{}},
		{"watch_id 0", rxWatchReq(0, s1.SessionId, 0)},
		{"watch_id -1", rxWatchReq(-1, s1.SessionId, 0)},
		{"watch_id MinInt64", rxWatchReq(math.MinInt64, s1.SessionId, 0)},
		{"watch without its WatchLeaseRequest", &fencerv1.SessionsRequest{Request: &fencerv1.SessionsRequest_Watch{Watch: &fencerv1.SessionsWatch{WatchId: 3}}}},
		{"empty watch", &fencerv1.SessionsRequest{Request: &fencerv1.SessionsRequest_Watch{}}},
	} {
		x := rxOpen(t, ctx, alice)
		x.watch(1, s2.SessionId, 0) // a live watch, to be dropped with the stream
		require.NoError(t, x.send(c.req))
		_ = x.send(rxRenewReq(s2.SessionId))
		rxStreamErr(t, x, codes.InvalidArgument, c.name)
	}

	// A watch_id already live ends the stream.
	x := rxOpen(t, ctx, alice)
	x.watch(5, s2.SessionId, 0)
	require.NoError(t, x.send(rxWatchReq(5, s1.SessionId, 0)))
	rxStreamErr(t, x, codes.InvalidArgument, "a watch_id already live")
	require.Len(t, x.since(0), 1, "a second SYNCED for the duplicate watch_id: %v", x.since(0))

	// Renewals and watches whose arguments alone are wrong: each fails
	// alone with INVALID_ARGUMENT (or ends the stream so), and nothing is
	// renewed or started.
	store := rxRevision(t, rxLease(t, alice, s2.SessionId, "m-rev"))
	for _, c := range []struct {
		name    string
		req     *fencerv1.SessionsRequest
		renewal bool
	}{
		{"renew of session 0", rxRenewReq(0), true},
		{"renew of session -1", rxRenewReq(-1), true},
		{"renew without its KeepAliveRequest", &fencerv1.SessionsRequest{Request: &fencerv1.SessionsRequest_Renew{}}, true},
		{"watch of session 0", rxWatchReq(7, 0, 0), false},
		{"watch of session -1", rxWatchReq(7, -1, 0), false},
		{"watch from revision -1", rxWatchReq(7, s2.SessionId, -1), false},
		{"watch from MinInt64", rxWatchReq(7, s2.SessionId, math.MinInt64), false},
		{"watch from the store's revision + 1000000", rxWatchReq(7, s2.SessionId, store+1000000), false},
		{"watch from MaxInt64", rxWatchReq(7, s2.SessionId, math.MaxInt64), false},
	} {
		x := rxOpen(t, ctx, alice)
		x.renewOK(s2.SessionId)
		m := x.mark()
		require.NoError(t, x.send(c.req))
		_ = x.send(rxRenewReq(s2.SessionId))
		_, r, err := x.awaitOrEnd(m, c.name, func(r *fencerv1.SessionsResponse) bool {
			return r.GetRenewFailed() != nil || r.GetWatchEnded() != nil || r.GetEvent() != nil || r.GetRenewed() != nil && r.GetRenewed().GetSessionId() != s2.SessionId
		})
		if r == nil {
			rrCode(t, err, codes.InvalidArgument, c.name)
			t.Logf("%s: the stream ended: %v", c.name, err)
			continue
		}
		t.Logf("%s: answered %v", c.name, r)
		switch {
		case c.renewal:
			require.NotNil(t, r.GetRenewFailed(), "%s: answered %v", c.name, r)
			rxErr(t, r.GetRenewFailed().GetError(), codes.InvalidArgument, "INVALID_ARGUMENT", c.name)
		default:
			require.NotNil(t, r.GetWatchEnded(), "%s: answered %v", c.name, r)
			rxErr(t, r.GetWatchEnded().GetError(), codes.InvalidArgument, "INVALID_ARGUMENT", c.name)
		}
		x.renewOK(s2.SessionId)
	}

	// Unwatches of ids no watch can have (0, negative): ignored, or the
	// stream ends INVALID_ARGUMENT; never another watch ended.
	for _, id := range []int64{0, -1, math.MinInt64} {
		x := rxOpen(t, ctx, alice)
		x.watch(1, s2.SessionId, 0)
		require.NoError(t, x.send(rxUnwatchReq(id)))
		m := x.mark()
		_ = x.send(rxRenewReq(s2.SessionId))
		_, r, err := x.awaitOrEnd(m, "the renewal after an unwatch of a bad id", func(r *fencerv1.SessionsResponse) bool {
			return r.GetRenewed() != nil || r.GetRenewFailed() != nil
		})
		if r == nil {
			rrCode(t, err, codes.InvalidArgument, "unwatch", id)
			t.Logf("unwatch %d: the stream ended: %v", id, err)
			continue
		}
		require.NotNil(t, r.GetRenewed(), "unwatch %d: %v", id, r)
		tok := rxLease(t, alice, s2.SessionId, "m-uw")
		rxRelease(t, alice, tok)
		x.lost(0, 1, tok)
		t.Logf("unwatch %d: ignored", id)
	}

	// The start revision the docs allow, the store's next one, works.
	store = rxRevision(t, rxLease(t, alice, s2.SessionId, "m-rev2"))
	x = rxOpen(t, ctx, alice)
	x.watch(9, s2.SessionId, store+1)

	// The victim's stream saw nothing of all that, and still works.
	victim.renewOK(s1.SessionId)
	tok := rxLease(t, alice, s1.SessionId, "m1b")
	rxRelease(t, alice, tok)
	victim.lost(0, 1, tok)
	victim.renewOK(s1.SessionId)
	for _, m := range victim.since(0) {
		require.Nil(t, m.GetWatchEnded(), "the victim's watch ended: %v", m)
		require.Nil(t, m.GetRenewFailed(), "a renewal on the victim's stream failed: %v", m)
	}
	victim.running("the victim's stream")
}

// rxFlood opens a Sessions stream of c that sends renewals of id without
// reading the answers after the first, until the server stops taking
// them, and returns the stream with the count of the requests sent.
func rxFlood(t *testing.T, ctx context.Context, c *rrConn, id int64) (fencerv1.FencerService_SessionsClient, *atomic.Int64) {
	t.Helper()
	st, err := c.raw.Sessions(ctx)
	require.NoError(t, err)
	require.NoError(t, st.Send(rxRenewReq(id)))
	_, err = st.Recv()
	require.NoError(t, err, "the first renewal on a flooded stream")
	var sent atomic.Int64
	go func() {
		for st.Send(rxRenewReq(id)) == nil {
			sent.Add(1)
		}
	}()
	return st, &sent
}

// rxFlooding lets the floods of counts run until the server stops
// reading them or for 2 s, and logs how far they got.
func rxFlooding(t *testing.T, counts []*atomic.Int64) {
	t.Helper()
	stalled := rxStalled(counts, 2*time.Second)
	var sent []int64
	for _, c := range counts {
		sent = append(sent, c.Load())
	}
	t.Logf("floods: requests sent %v; the server stopped reading them: %v", sent, stalled)
}

// rxStalled reports whether, within d, none of the counts moved for a
// second: the server stopped reading every flooded stream.
func rxStalled(counts []*atomic.Int64, d time.Duration) bool {
	prev := make([]int64, len(counts))
	still := time.Now()
	return assertEventually(func() bool {
		for i, c := range counts {
			if n := c.Load(); n != prev[i] {
				prev[i], still = n, time.Now()
			}
		}
		return time.Since(still) > time.Second
	}, d)
}

// rxRSS is the resident memory of process pid, in MiB.
func rxRSS(t *testing.T, pid int) float64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(t, err)
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) == 3 && f[0] == "VmRSS:" {
			kb, err := strconv.ParseFloat(f[1], 64)
			require.NoError(t, err)
			return kb / 1024
		}
	}
	t.Fatalf("no VmRSS in /proc/%d/status", pid)
	return 0
}

// A client that sends renewals on a Sessions stream and never reads the
// answers must be held back by flow control: the server stops reading
// its requests once its answers cannot be sent, as it does on a
// KeepAlive stream, rather than queueing answers without bound.
func TestRedTeamSessionsUnreadFloodIsBounded(t *testing.T) {
	s, _ := rsServer(t)
	alice := rrDial(t, s, rsAliceTok)
	ctx := rrCtx(t)
	a := rsSession(t, alice, "fl", 30)
	// The control: a KeepAlive stream flooded the same way stalls.
	_, kaSent := rsFlood(t, ctx, alice, a.SessionId)
	require.True(t, rxStalled([]*atomic.Int64{kaSent}, 15*time.Second), "the control: the server never stopped reading a flooded KeepAlive stream")
	t.Logf("the flooded KeepAlive stream stalled after %d requests", kaSent.Load())

	before := rxRSS(t, s.cmd.Process.Pid)
	var counts []*atomic.Int64
	for range 2 {
		_, k := rxFlood(t, ctx, alice, a.SessionId)
		counts = append(counts, k)
	}
	start := time.Now()
	stalled := rxStalled(counts, 6*time.Second)
	after := rxRSS(t, s.cmd.Process.Pid)
	t.Logf("after %s: requests sent %d and %d, server RSS %.0f MiB -> %.0f MiB", time.Since(start), counts[0].Load(), counts[1].Load(), before, after)
	// The server stops reading a Sessions stream whose client reads
	// nothing once its queue of answers is full; before that bound it read
	// without end, its memory growing with the answers it held.
	require.True(t, stalled, "the server never stopped reading 2 Sessions streams whose clients read nothing: %d and %d requests taken in %s, RSS %.0f MiB -> %.0f MiB", counts[0].Load(), counts[1].Load(), time.Since(start), before, after)
}

// rxBusy renews id on x without waiting for the answers, until x ends.
func rxBusy(x *rxStream, id int64) {
	go func() {
		for x.send(rxRenewReq(id)) == nil {
			time.Sleep(time.Millisecond)
		}
	}()
}

// rxDrain reads st until it ends and returns why, or fails after rsEnd.
func rxDrain(t *testing.T, st fencerv1.FencerService_SessionsClient, what string) error {
	t.Helper()
	return rsRecvErr(t, st.Recv, what)
}

// SIGTERM ends every Sessions stream: an idle one with watches, a busy
// one, each with SHUTTING_DOWN, and streams whose clients read nothing
// (the server's sends blocked) with UNAVAILABLE; fencer serve exits 0
// within its grace.
func TestRedTeamSessionsShutdown(t *testing.T) {
	s, _ := rsServer(t)
	alice := rrDial(t, s, rsAliceTok)
	ctx := rrCtx(t)
	a, b := rsSession(t, alice, "sd-a", 30), rsSession(t, alice, "sd-b", 30)
	idle := rxOpen(t, ctx, alice)
	idle.watch(1, a.SessionId, 0)
	idle.watch(2, b.SessionId, 0)
	idle.renewOK(a.SessionId)
	busy := rxOpen(t, ctx, alice)
	busy.watch(1, b.SessionId, 0)
	rxBusy(busy, b.SessionId)
	var floods []fencerv1.FencerService_SessionsClient
	var counts []*atomic.Int64
	for range 3 {
		st, n := rxFlood(t, ctx, alice, a.SessionId)
		floods, counts = append(floods, st), append(counts, n)
	}
	rxFlooding(t, counts)

	start := time.Now()
	require.NoError(t, s.cmd.Process.Signal(syscall.SIGTERM))
	for what, x := range map[string]*rxStream{"idle Sessions stream": idle, "busy Sessions stream": busy} {
		err := x.end(what + " at shutdown")
		rsReason(t, err, codes.Unavailable, fencerv1.ErrorReason_ERROR_REASON_SHUTTING_DOWN, what)
	}
	code := s.waitExit(t)
	took := time.Since(start)
	for i, st := range floods {
		rrCode(t, rxDrain(t, st, "unread Sessions stream at shutdown"), codes.Unavailable, "unread stream", i)
	}
	require.Equal(t, 0, code, "fencer serve exited %d on SIGTERM with Sessions streams open:\n%s", code, s.log)
	require.Less(t, took, 2*time.Second+5*time.Second, "fencer serve took %s to exit, past its 2 s grace", took)
	t.Logf("exited 0 %s after SIGTERM", took)
}

// Withdrawing bob's token ends all his Sessions streams with
// UNAUTHENTICATED: idle with watches, busy, and unread (the server's
// sends blocked), the last as soon as the server reloads, before their
// clients read; alice's stream goes on.
func TestRedTeamSessionsTokenWithdrawn(t *testing.T) {
	s, tokens := rsServer(t)
	alice, bob := rrDial(t, s, rsAliceTok), rrDial(t, s, rsBobTok)
	ctx := rrCtx(t)
	a, b := rsSession(t, alice, "tw-a", 30), rsSession(t, bob, "tw-b", 30)
	ax := rxOpen(t, ctx, alice)
	ax.watch(1, a.SessionId, 0)
	idle := rxOpen(t, ctx, bob)
	idle.watch(1, b.SessionId, 0)
	idle.renewOK(b.SessionId)
	busy := rxOpen(t, ctx, bob)
	rxBusy(busy, b.SessionId)
	const n = 3
	var floods []fencerv1.FencerService_SessionsClient
	var counts []*atomic.Int64
	for range n {
		st, k := rxFlood(t, ctx, bob, b.SessionId)
		floods, counts = append(floods, st), append(counts, k)
	}
	rxFlooding(t, counts)

	require.NoError(t, writeTokens(tokens, rsAliceTok+" alice\n"))
	revoked := time.Now()
	rsReason(t, idle.end("bob's idle Sessions stream"), codes.Unauthenticated, fencerv1.ErrorReason_ERROR_REASON_UNAUTHENTICATED)
	rsReason(t, busy.end("bob's busy Sessions stream"), codes.Unauthenticated, fencerv1.ErrorReason_ERROR_REASON_UNAUTHENTICATED)
	ended := func() int {
		k := 0
		for _, line := range strings.Split(s.log.String(), "\n") {
			if strings.Contains(line, "method=Sessions") && strings.Contains(line, "code=Unauthenticated") && strings.Contains(line, "principal=bob") {
				k++
			}
		}
		return k
	}
	ok := assertEventually(func() bool { return ended() >= n+2 }, rsEnd)
	require.True(t, ok, "%s after bob's token was removed the server had ended %d of his %d Sessions streams (%d of them unread):\n%s", time.Since(revoked), ended(), n+2, n, s.log)
	for i, st := range floods {
		rrCode(t, rxDrain(t, st, "bob's unread Sessions stream"), codes.Unauthenticated, "unread stream", i)
	}

	st, err := bob.raw.Sessions(ctx)
	if err == nil {
		// Send fails with io.EOF once the server has refused the
		// stream; Recv says why.
		_ = st.Send(rxRenewReq(b.SessionId))
		_, err = st.Recv()
	}
	rrCode(t, err, codes.Unauthenticated, "bob opening a Sessions stream after his token was removed")

	ax.renewOK(a.SessionId)
	tok := rxLease(t, alice, a.SessionId, "tw-a2")
	rxRelease(t, alice, tok)
	ax.lost(0, 1, tok)
	ax.running("alice's stream")
}

// writeTokens replaces the token file at path with content, atomically.
func writeTokens(path, content string) error {
	if err := os.WriteFile(path+".new", []byte(content), 0o600); err != nil {
		return err
	}
	return os.Rename(path+".new", path)
}

// Thousands of watches on one stream, and hundreds of streams abandoned
// (cancelled with watches live, half-closed, never used, flooded and
// unread), leave no goroutines behind on the server once they end.
func TestRedTeamSessionsResourceAbuse(t *testing.T) {
	s, _ := rsServer(t)
	alice := rrDial(t, s, rsAliceTok)
	ctx := rrCtx(t)
	var sids []int64
	for i := range 3 {
		sids = append(sids, rsSession(t, alice, fmt.Sprintf("ra-%d", i), 60).SessionId)
	}
	base := rsGoroutines(t, s)

	// One stream, 3000 watches.
	const many = 3000
	big := rxOpen(t, ctx, alice)
	for wid := int64(1); wid <= many; wid++ {
		require.NoError(t, big.send(rxWatchReq(wid, sids[wid%3], 0)))
	}
	big.await(0, "every watch's SYNCED", func() func(*fencerv1.SessionsResponse) bool {
		n := 0
		return func(r *fencerv1.SessionsResponse) bool {
			if r.GetEvent().GetEvent().GetType() == fencerv1.WatchLeaseResponse_TYPE_SYNCED {
				n++
			}
			return n == many
		}
	}())
	tok := rxLease(t, alice, sids[1], "ra-x")
	rxRelease(t, alice, tok)
	big.lost(0, 1, tok)
	big.lost(0, many-2, tok)
	withBig := rsGoroutines(t, s)

	// Abandoned streams.
	actx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var halfClosed []fencerv1.FencerService_SessionsClient
	for i := range 300 {
		st, err := alice.raw.Sessions(actx)
		require.NoError(t, err)
		switch i % 3 {
		case 0: // watches live, then cancelled
			for w := int64(1); w <= 10; w++ {
				require.NoError(t, st.Send(rxWatchReq(w, sids[w%3], 0)))
			}
			require.NoError(t, st.Send(rxRenewReq(sids[0])))
		case 1: // watches live, then half-closed
			require.NoError(t, st.Send(rxWatchReq(1, sids[0], 0)))
			require.NoError(t, st.CloseSend())
			halfClosed = append(halfClosed, st)
		case 2: // never used
		}
	}
	var counts []*atomic.Int64
	for range 3 {
		_, k := rxFlood(t, actx, alice, sids[2])
		counts = append(counts, k)
	}
	rxFlooding(t, counts)
	peak := rsGoroutines(t, s)
	for i, st := range halfClosed {
		require.ErrorIs(t, rxDrain(t, st, "a half-closed Sessions stream"), io.EOF, "half-closed stream %d", i)
	}
	cancel()
	for wid := int64(1); wid <= many; wid++ {
		require.NoError(t, big.send(rxUnwatchReq(wid)))
	}
	big.renewOK(sids[0])
	require.NoError(t, big.st.CloseSend())
	require.ErrorIs(t, big.end("the big stream, half-closed"), io.EOF)

	var last float64
	ok := assertEventually(func() bool {
		last = rsGoroutines(t, s)
		return last <= base+10
	}, 20*time.Second)
	t.Logf("goroutines: baseline %v, with %d watches on one stream %v, with 300 abandoned streams and 3 unread floods %v, after %v", base, many, withBig, peak, last)
	require.True(t, ok, "goroutines did not return to baseline: baseline %v, peak %v, now %v", base, peak, last)

	x := rxOpen(t, rrCtx(t), alice)
	for _, id := range sids {
		x.renewOK(id)
	}
}

// rxHeld is a Go-client session and the lease it holds.
type rxHeld struct {
	sess *client.Session
	l    *client.Lease
}

// rxHold opens n sessions of c with ttl, each holding lease prefix-i.
func rxHold(t *testing.T, c *client.Client, n int, ttl time.Duration, prefix string) []rxHeld {
	t.Helper()
	ctx := rrCtx(t)
	var hs []rxHeld
	for i := range n {
		sess, err := c.NewSession(client.WithTTL(ttl))
		require.NoError(t, err)
		t.Cleanup(func() { _ = sess.Close(context.Background()) })
		l, err := sess.Acquire(ctx, fmt.Sprintf("%s-%d", prefix, i))
		require.NoError(t, err)
		hs = append(hs, rxHeld{sess, l})
	}
	return hs
}

// rxEnded reports whether done is closed.
func rxEnded(done <-chan struct{}) bool {
	select {
	case <-done:
		return true
	default:
		return false
	}
}

// rxSafe fails for every lease of hs that its holder still believes it
// holds while the server says its token is not current.
func rxSafe(t *testing.T, raw fencerv1.FencerServiceClient, hs []rxHeld, what string) {
	t.Helper()
	for i, h := range hs {
		if rxEnded(h.l.Done()) {
			continue
		}
		_, err := raw.Check(rrCtx(t), &fencerv1.CheckRequest{Token: h.l.Token().String()})
		if err != nil && !rxEnded(h.l.Done()) {
			t.Errorf("%s: lease %d (%s) still believes it holds, but Check says %v", what, i, h.l.Token(), err)
		}
	}
}

// Many sessions of one Go client share its Sessions stream. The stream's
// connection is cut twice, briefly (no renewal due meanwhile) and past a
// renewal; during each cut another client releases one of the leases by
// token and revokes one session. After each recovery those are reported
// lost (Done closes), the others stay held, and no holder believes it
// holds a lease whose token is not current.
func TestRedTeamSessionsClientStreamBroken(t *testing.T) {
	s, _ := rsServer(t)
	p := faultproxy.New(t, s.addr)
	// gRPC's own reconnect backoff (1 s, then 1.6 times longer each time)
	// could keep the connection down past a session's deadline after the
	// cut; the client resets it when a renewal fails, so the holder dials
	// with gRPC's defaults.
	holder := rxDialWith(t, p.Addr(), rsAliceTok)
	other := rrDial(t, s, rsAliceTok)
	const ttl = 6 * time.Second
	hs := rxHold(t, holder.c, 20, ttl, "cb")

	for k, outage := range []time.Duration{300 * time.Millisecond, ttl/3 + 500*time.Millisecond} {
		released, revoked := hs[2*k], hs[2*k+1]
		p.Isolate()
		rxRelease(t, other, released.l.Token().String())
		rxRevoke(t, other, revoked.sess.ID())
		time.Sleep(outage)
		require.False(t, rxEnded(released.l.Done()), "cut %d: the lease released during the cut ended before the stream came back: the cut did not hold", k)
		p.Heal()
		back := time.Now()
		for what, done := range map[string]<-chan struct{}{"the lease released by token": released.l.Done(), "the lease of the revoked session": revoked.l.Done()} {
			select {
			case <-done:
			case <-time.After(ttl):
				t.Errorf("cut %d (%s): %s during the cut still believes it holds %s after the stream came back", k, outage, what, time.Since(back))
			}
		}
		t.Logf("cut %d (%s): the losses were reported %s after the stream came back", k, outage, time.Since(back))
		rxSafe(t, other.raw, hs, fmt.Sprintf("after cut %d", k))
	}
	time.Sleep(ttl / 2)
	for i, h := range hs[4:] {
		require.NoError(t, h.l.Err(), "lease %d, never released, ended", i+4)
	}
	rxSafe(t, other.raw, hs, "at the end")
}

// A Go client's sessions fail closed when the server is gone: killed
// (connections refused), killed with something silent listening on its
// address (connections accepted, never answered), or stopped (SIGSTOP: the
// connection stays up, nothing is answered). Every lease's Done closes no
// later than the TTL after the last moment the server could have renewed
// it, here the kill; a server killed and restarted at once keeps them.
func TestRedTeamSessionsClientFailsClosed(t *testing.T) {
	const ttl = 3 * time.Second
	const slack = 1500 * time.Millisecond
	for _, mode := range []string{"refused", "silent", "stopped", "silent-legacy"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			s, _ := rsServer(t)
			c := rrDial(t, s, rsAliceTok)
			label := mode
			if mode == "silent-legacy" {
				// The client as against a server without Sessions: a
				// KeepAlive and a WatchLease stream per session.
				c = rxDialLegacy(t, s.addr, rsAliceTok)
				mode = "silent"
			}
			hs := rxHold(t, c.c, 10, ttl, "fc")
			if mode == "refused" {
				// Killed and restarted at once: the sessions survive.
				require.NoError(t, s.cmd.Process.Kill())
				<-s.exited
				s.cmd = nil
				s.start()
				time.Sleep(ttl + time.Second)
				rxSafe(t, c.raw, hs, "after a restart")
				alive := 0
				for _, h := range hs {
					if h.l.Err() == nil {
						alive++
					}
				}
				t.Logf("%d of %d leases held across the server's restart", alive, len(hs))
			}
			var gone time.Time
			switch mode {
			case "refused", "silent":
				require.NoError(t, s.cmd.Process.Kill())
				gone = time.Now()
				<-s.exited
				s.cmd = nil
				if mode == "silent" {
					rxSilent(t, s.addr)
				}
			case "stopped":
				require.NoError(t, s.cmd.Process.Signal(syscall.SIGSTOP))
				gone = time.Now()
				t.Cleanup(func() { _ = s.cmd.Process.Signal(syscall.SIGCONT) })
			}
			for _, h := range hs {
				select {
				case <-h.l.Done():
				case <-time.After(time.Until(gone.Add(ttl + slack))):
				}
			}
			var late []int
			for i, h := range hs {
				if !rxEnded(h.l.Done()) {
					late = append(late, i)
				}
			}
			t.Logf("%s after the server went, %d of %d leases still believed held", time.Since(gone), len(late), len(hs))
			if len(late) > 0 {
				// How long they go on believing it, up to 8 s.
				for _, i := range late {
					select {
					case <-hs[i].l.Done():
					case <-time.After(time.Until(gone.Add(8 * time.Second))):
					}
				}
				still := 0
				for _, i := range late {
					if !rxEnded(hs[i].l.Done()) {
						still++
					}
				}
				// A session whose stream cannot be reopened (the
				// connection is accepted but never answered: opening a
				// stream waits out gRPC's 20 s connect timeout) must still
				// end at its local deadline, on the Sessions stream and on
				// the fallback's KeepAlive stream alike; before renewals
				// stopped waiting for the opening, its leases went on
				// believing they were held long after etcd expired the
				// session.
				t.Errorf("leases %v still believed held %s after the server went %s, past the %s TTL (+%s slack); %d of them still at %s", late, ttl+slack, label, ttl, slack, still, time.Since(gone).Round(time.Second))
				return
			}
			for i, h := range hs {
				require.ErrorIs(t, h.sess.Err(), token.ErrSessionExpired, "session %d", i)
			}
		})
	}
}

// rxDialWith connects to addr as rrDialAddr does, with extra options.
func rxDialWith(t *testing.T, addr, bearer string, extra ...grpc.DialOption) *rrConn {
	t.Helper()
	opts := append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithPerRPCCredentials(client.BearerToken(bearer, false))}, extra...)
	cc, err := grpc.NewClient(addr, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = cc.Close() })
	return &rrConn{c: client.New(cc), raw: fencerv1.NewFencerServiceClient(cc)}
}

// rxDialLegacy connects to addr as rrDialAddr does, but the connection
// answers every Sessions call UNIMPLEMENTED, as a server without it
// would, so that the Go client falls back to streams per session.
func rxDialLegacy(t *testing.T, addr, bearer string) *rrConn {
	t.Helper()
	noSessions := func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		if method == fencerv1.FencerService_Sessions_FullMethodName {
			return nil, status.Error(codes.Unimplemented, "unknown method Sessions")
		}
		return streamer(ctx, desc, cc, method, opts...)
	}
	return rxDialWith(t, addr, bearer, grpc.WithStreamInterceptor(noSessions))
}

// rxSilent listens on addr, accepting connections and never answering,
// until the test ends.
func rxSilent(t *testing.T, addr string) {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	require.NoError(t, err)
	var mu sync.Mutex
	var held []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, conn)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		<-done
		mu.Lock()
		for _, conn := range held {
			_ = conn.Close()
		}
		mu.Unlock()
	})
}

// Two servers on one etcd. A Go client holds a lease through server A;
// A is killed and its address answers TCP but never speaks (a hung
// process, a half-dead load balancer). etcd expires the session after its
// TTL and another client acquires the lease through server B: the first
// holder must have stopped believing it holds by then.
func TestRedTeamSessionsClientSilentServerTwoHolders(t *testing.T) {
	member := fencertest.Etcd(t)
	a := startServeProc(t, "--etcd-endpoints", member.Endpoint())
	b := startServeProc(t, "--etcd-endpoints", member.Endpoint())
	first, second := rrDial(t, a, ""), rrDial(t, b, "")
	const ttl = 3 * time.Second
	hs := rxHold(t, first.c, 1, ttl, "two")
	old := hs[0].l

	require.NoError(t, a.cmd.Process.Kill())
	gone := time.Now()
	<-a.exited
	a.cmd = nil
	rxSilent(t, a.addr)

	sess, err := second.c.NewSession(client.WithTTL(ttl))
	require.NoError(t, err)
	t.Cleanup(func() { _ = sess.Close(context.Background()) })
	ctx, cancel := context.WithTimeout(rrCtx(t), 15*time.Second)
	defer cancel()
	l, err := sess.Acquire(ctx, "two-0")
	require.NoError(t, err, "the second client's acquisition through server B")
	acquired := time.Since(gone)
	believed := !rxEnded(old.Done())
	t.Logf("the second client acquired %s after A went; the first holder then believed it held: %v (token %s vs %s)", acquired, believed, old.Token(), l.Token())
	select {
	case <-old.Done():
	case <-time.After(time.Until(gone.Add(8 * time.Second))):
	}
	// The first holder's session must end at its local deadline, not
	// wait in the Sessions stream's reopening (gRPC's connect timeout,
	// 20 s): otherwise two holders believe they hold the lease at once.
	require.False(t, believed, "two holders at once: the second client acquired %s through server B, %s after server A went silent, while the first holder (%s) still believed it held it (its Done still open %s after A went, past its %s TTL: %v)", l.Token(), acquired, old.Token(), time.Since(gone).Round(100*time.Millisecond), ttl, !rxEnded(old.Done()))
}

// One Go client, many sessions on its one Sessions stream: sessions
// released or revoked by another connection end (Done), the others go
// on; the server holds a few goroutines for them all, not two streams per
// session.
func TestRedTeamSessionsClientManySessions(t *testing.T) {
	s, _ := rsServer(t)
	base := rsGoroutines(t, s)
	holder, other := rrDial(t, s, rsAliceTok), rrDial(t, s, rsAliceTok)
	const n = 40
	hs := rxHold(t, holder.c, n, 3*time.Second, "many")
	time.Sleep(time.Second)
	with := rsGoroutines(t, s)
	t.Logf("server goroutines: %v before, %v with %d sessions of one client", base, with, n)
	require.Less(t, with-base, float64(20), "%d sessions of one client cost the server %v goroutines", n, with-base)

	etcd := fencertest.Client(t, s.etcdEndpoint())
	for i := 0; i < 6; i++ {
		switch i % 3 {
		case 0:
			rxRevoke(t, other, hs[i].sess.ID())
		case 1:
			_, err := etcd.Revoke(rrCtx(t), clientv3.LeaseID(hs[i].sess.ID()))
			require.NoError(t, err)
		case 2:
			rxRelease(t, other, hs[i].l.Token().String())
		}
	}
	for i := range 6 {
		select {
		case <-hs[i].l.Done():
		case <-time.After(rsEnd):
			t.Fatalf("lease %d, whose session was ended or token released, still believed held", i)
		}
	}
	time.Sleep(3500 * time.Millisecond) // past a TTL: the others renew meanwhile
	for i, h := range hs[6:] {
		require.NoError(t, h.l.Err(), "lease %d of a session nobody ended", i+6)
	}
	rxSafe(t, other.raw, hs, "at the end")
}

// A watch from a compacted revision ends alone, watch_ended
// WATCH_COMPACTED; the stream and its other watches go on.
func TestRedTeamSessionsCompactedStart(t *testing.T) {
	s, _ := rsServer(t)
	alice := rrDial(t, s, rsAliceTok)
	ctx := rrCtx(t)
	s1 := rsSession(t, alice, "k1", 30)
	first := rxRevision(t, s1.Token)
	for i := range 5 {
		rxRelease(t, alice, rxLease(t, alice, s1.SessionId, fmt.Sprintf("k-%d", i)))
	}
	last := rxRevision(t, rxLease(t, alice, s1.SessionId, "k-last"))
	etcd := fencertest.Client(t, s.etcdEndpoint())
	_, err := etcd.Compact(ctx, last, clientv3.WithCompactPhysical())
	require.NoError(t, err)

	x := rxOpen(t, ctx, alice)
	x.watch(1, s1.SessionId, 0)
	m := x.mark()
	require.NoError(t, x.send(rxWatchReq(2, s1.SessionId, first)))
	_, r, err := x.awaitOrEnd(m, "a watch from a compacted revision", func(r *fencerv1.SessionsResponse) bool {
		return r.GetEvent().GetWatchId() == 2 || r.GetWatchEnded().GetWatchId() == 2
	})
	require.NotNil(t, r, "a watch from a compacted revision ended the stream: %v", err)
	t.Logf("a watch from compacted revision %d (compacted at %d): %v", first, last, r)
	if r.GetWatchEnded() != nil {
		rxErr(t, r.GetWatchEnded().GetError(), codes.OutOfRange, "WATCH_COMPACTED", "a watch from a compacted revision")
	} else {
		// Served from the server's own record of recent losses: then it
		// must replay them, every one since first.
		for i := range 5 {
			x.await(m, fmt.Sprintf("the replayed loss of k-%d", i), func(r *fencerv1.SessionsResponse) bool {
				return r.GetEvent().GetWatchId() == 2 && strings.HasSuffix(r.GetEvent().GetEvent().GetToken(), fmt.Sprintf(":k-%d", i))
			})
		}
	}
	x.renewOK(s1.SessionId)
	tok := rxLease(t, alice, s1.SessionId, "k-after")
	rxRelease(t, alice, tok)
	x.lost(0, 1, tok)
	x.running("after a watch from a compacted revision")
}

// A half-close right after requests gets their answers first, then the
// end of the stream (OK), as on a KeepAlive stream
// (TestRedTeamSessionHalfClose): every renewal sent before the half-close
// is answered. Each round sends 30 renewals of 10 sessions and
// half-closes at once; the test stops at the first round short of an
// answer, or after 100 rounds. (A server with etcd's answers delayed by
// 150 ms answered every renewal: what is lost is not a renewal still at
// etcd.)
func TestRedTeamSessionsHalfClose(t *testing.T) {
	s, _ := rsServer(t)
	alice := rrDial(t, s, rsAliceTok)
	ctx := rrCtx(t)
	var ids []int64
	for i := range 10 {
		ids = append(ids, rsSession(t, alice, fmt.Sprintf("h%d", i), 30).SessionId)
	}
	var hole string
	rounds := 0
	for start := time.Now(); rounds < 100 && time.Since(start) < 8*time.Second && hole == ""; rounds++ {
		x := rxOpen(t, ctx, alice)
		require.NoError(t, x.send(rxWatchReq(1, ids[0], 0)))
		for k := range 30 {
			require.NoError(t, x.send(rxRenewReq(ids[k%len(ids)])))
		}
		require.NoError(t, x.st.CloseSend())
		end := x.end("a half-closed Sessions stream")
		answered := 0
		for _, m := range x.since(0) {
			if m.GetRenewed() != nil || m.GetRenewFailed() != nil {
				answered++
			}
		}
		if answered != 30 || end != io.EOF {
			hole = fmt.Sprintf("round %d: %d of 30 renewals answered, then %v", rounds, answered, end)
		}
	}
	// Every renewal sent ahead of a half-close is answered before the
	// stream ends; before the server sent its queued answers at a
	// half-close, a few rounds in a hundred lost some.
	require.Empty(t, hole, "renewals sent before a half-close were not all answered before the stream ended (%d rounds)", rounds)
	t.Logf("%d rounds, every renewal answered", rounds)
}

// A token whose line now names another principal (mallory) ends alice's
// Sessions stream with UNAUTHENTICATED, and on a new stream the token
// cannot renew or watch alice's session.
func TestRedTeamSessionsTokenRemapped(t *testing.T) {
	s, tokens := rsServer(t)
	alice := rrDial(t, s, rsAliceTok)
	ctx := rrCtx(t)
	a := rsSession(t, alice, "rm", 30)
	x := rxOpen(t, ctx, alice)
	x.watch(1, a.SessionId, 0)
	x.renewOK(a.SessionId)

	require.NoError(t, writeTokens(tokens, rsAliceTok+" mallory\n"+rsBobTok+" bob\n"))
	rsReason(t, x.end("alice's Sessions stream, her token now mallory's"), codes.Unauthenticated, fencerv1.ErrorReason_ERROR_REASON_UNAUTHENTICATED)

	y := rxOpen(t, ctx, alice)
	rxErr(t, y.renew(a.SessionId).GetRenewFailed().GetError(), codes.PermissionDenied, "PERMISSION_DENIED", "mallory renewing alice's session")
	m := y.mark()
	require.NoError(t, y.send(rxWatchReq(1, a.SessionId, 0)))
	rxErr(t, y.ended(m, 1), codes.PermissionDenied, "PERMISSION_DENIED", "mallory watching alice's session")
	y.running("mallory's stream")
}

// Many watches of busy and ending sessions on one stream: every watch of
// the churned session either reports every loss of it (none is dropped
// silently) or ends with watch_ended UNAVAILABLE, after which the client
// knows to check and watch again; and when a session watched 500 times
// ends, each of its watches gets exactly one watch_ended.
func TestRedTeamSessionsNoSilentLoss(t *testing.T) {
	s, _ := rsServer(t)
	alice := rrDial(t, s, rsAliceTok)
	ctx := rrCtx(t)
	busy, ending := rsSession(t, alice, "nl-busy", 30), rsSession(t, alice, "nl-end", 30)
	x := rxOpen(t, ctx, alice)
	const nb, ne = 100, 500
	for w := int64(1); w <= nb+ne; w++ {
		sid := busy.SessionId
		if w > nb {
			sid = ending.SessionId
		}
		require.NoError(t, x.send(rxWatchReq(w, sid, 0)))
	}
	x.await(0, "every watch's SYNCED", func() func(*fencerv1.SessionsResponse) bool {
		n := 0
		return func(r *fencerv1.SessionsResponse) bool {
			if r.GetEvent().GetEvent().GetType() == fencerv1.WatchLeaseResponse_TYPE_SYNCED {
				n++
			}
			return n == nb+ne
		}
	}())
	cut := x.mark()

	var toks []string
	var mu sync.Mutex
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range 20 {
				r, err := alice.raw.Acquire(ctx, &fencerv1.AcquireRequest{Name: fmt.Sprintf("nl-%d-%d", g, k%3), SessionId: busy.SessionId})
				if err != nil {
					t.Errorf("acquire: %v", err)
					return
				}
				if _, err := alice.raw.Release(ctx, rrReleaseTok(r.GetToken())); err != nil {
					t.Errorf("release: %v", err)
					return
				}
				mu.Lock()
				toks = append(toks, r.GetToken())
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	rxRevoke(t, alice, ending.SessionId)
	// Every watch of the ending session ends; then the busy ones have
	// had their losses, or ended.
	x.await(cut, "every watch_ended of the ending session", func() func(*fencerv1.SessionsResponse) bool {
		n := 0
		return func(r *fencerv1.SessionsResponse) bool {
			if we := r.GetWatchEnded(); we != nil && we.GetWatchId() > nb {
				n++
			}
			return n == ne
		}
	}())
	time.Sleep(time.Second)
	x.renewOK(busy.SessionId)

	got := map[int64]map[string]bool{}
	ended := map[int64]int{}
	for i, m := range x.since(cut) {
		if we := m.GetWatchEnded(); we != nil {
			ended[we.GetWatchId()]++
			if we.GetWatchId() > nb {
				rxErr(t, we.GetError(), codes.NotFound, "SESSION_NOT_FOUND", "reply", i)
			} else {
				require.Equal(t, codes.Unavailable, codes.Code(we.GetError().GetCode()), "reply %d: a watch of the busy session ended: %v", i, m)
			}
			continue
		}
		if e := m.GetEvent(); e != nil && e.GetEvent().GetType() == fencerv1.WatchLeaseResponse_TYPE_LOST {
			if got[e.GetWatchId()] == nil {
				got[e.GetWatchId()] = map[string]bool{}
			}
			got[e.GetWatchId()][e.GetEvent().GetToken()] = true
		}
	}
	behind, silent := 0, 0
	for w := int64(1); w <= nb; w++ {
		if ended[w] > 0 {
			behind++
			continue
		}
		var missing []string
		for _, tok := range toks {
			if !got[w][tok] {
				missing = append(missing, tok)
			}
		}
		if len(missing) > 0 {
			silent++
			t.Errorf("watch %d of the busy session is live but never reported %d of its %d losses, e.g. %v", w, len(missing), len(toks), missing[:min(3, len(missing))])
		}
	}
	for w := int64(nb + 1); w <= nb+ne; w++ {
		if ended[w] != 1 {
			t.Errorf("watch %d of the ended session got %d watch_ended", w, ended[w])
		}
	}
	t.Logf("%d losses; of %d watches of the busy session %d ended UNAVAILABLE, %d lost events silently", len(toks), nb, behind, silent)
}

// A watch started while its session is being revoked, at every offset
// from just before to just after the revocation: it must end with
// watch_ended SESSION_NOT_FOUND (after a SYNCED or not), never stay live
// and silent for a session that is gone; a renewal sent after the
// revocation returned must fail.
func TestRedTeamSessionsWatchRacesSessionEnd(t *testing.T) {
	s, _ := rsServer(t)
	alice := rrDial(t, s, rsAliceTok)
	ctx := rrCtx(t)
	x := rxOpen(t, ctx, alice)
	const rounds = 24
	for i := range rounds {
		sess := rsSession(t, alice, fmt.Sprintf("race-%d", i), 30)
		wid := int64(i + 1)
		m := x.mark()
		revoked := make(chan struct{})
		go func() {
			defer close(revoked)
			time.Sleep(time.Duration(i%8) * 250 * time.Microsecond)
			_, err := alice.raw.Release(ctx, &fencerv1.ReleaseRequest{Target: &fencerv1.ReleaseRequest_SessionId{SessionId: sess.SessionId}})
			if err != nil {
				t.Errorf("round %d: release: %v", i, err)
			}
		}()
		time.Sleep(time.Duration(i%5) * 300 * time.Microsecond)
		require.NoError(t, x.send(rxWatchReq(wid, sess.SessionId, 0)))
		<-revoked
		rxErr(t, x.renew(sess.SessionId).GetRenewFailed().GetError(), codes.NotFound, "SESSION_NOT_FOUND", "round", i, "renewal after the revocation")
		_, r, err := x.awaitOrEnd(m, fmt.Sprintf("round %d: the end of a watch raced with its session's revocation", i), func(r *fencerv1.SessionsResponse) bool {
			return r.GetWatchEnded().GetWatchId() == wid
		})
		require.NotNil(t, r, "round %d: the stream ended: %v", i, err)
		rxErr(t, r.GetWatchEnded().GetError(), codes.NotFound, "SESSION_NOT_FOUND", "round", i)
	}
	x.running("after the races")
}

// Watches that replay history (start_revision in the past), both from
// before the server's first watch (read back from etcd) and from its own
// record of recent losses: each replays only its own session's losses,
// never another session's or another principal's.
func TestRedTeamSessionsReplayRouting(t *testing.T) {
	s, _ := rsServer(t)
	alice, bob := rrDial(t, s, rsAliceTok), rrDial(t, s, rsBobTok)
	ctx := rrCtx(t)
	s1, s2 := rsSession(t, alice, "rp1", 30), rsSession(t, alice, "rp2", 30)
	b := rsSession(t, bob, "rpb", 30)
	from := rxRevision(t, s1.Token)
	var s1Toks, bToks []string
	churn := func(tag string) {
		for i := range 3 {
			tok := rxLease(t, alice, s1.SessionId, fmt.Sprintf("rp1-%s-%d", tag, i))
			rxRelease(t, alice, tok)
			s1Toks = append(s1Toks, tok)
			tok = rxLease(t, bob, b.SessionId, fmt.Sprintf("rpb-%s-%d", tag, i))
			rxRelease(t, bob, tok)
			bToks = append(bToks, tok)
		}
	}
	churn("before") // before any watch: replayed from etcd

	x := rxOpen(t, ctx, alice)
	x.watch(1, s2.SessionId, 0)
	churn("after") // recorded by the server's shared watch
	y := rxOpen(t, ctx, bob)
	for round, wid := range []int64{10} {
		m := x.mark()
		x.watch(wid, s1.SessionId, from)
		x.watch(wid+1, s2.SessionId, from)
		for _, tok := range s1Toks {
			x.lost(m, wid, tok)
		}
		ym := y.mark()
		y.watch(wid, b.SessionId, from)
		for _, tok := range bToks {
			y.lost(ym, wid, tok)
		}
		x.renewOK(s2.SessionId)
		y.renewOK(b.SessionId)
		t.Logf("round %d: replays complete", round)
	}
	for _, m := range x.since(0) {
		if e := m.GetEvent(); e != nil && e.GetEvent().GetType() == fencerv1.WatchLeaseResponse_TYPE_LOST && (e.GetWatchId() == 1 || e.GetWatchId() == 11) {
			t.Errorf("a watch of session s2, which lost nothing, replayed %v", m)
		}
	}
	rxForeign(t, x.since(0), []int64{b.SessionId}, nil, bToks, "alice's replaying stream")
	rxForeign(t, y.since(0), []int64{s1.SessionId, s2.SessionId}, nil, s1Toks, "bob's replaying stream")
}
