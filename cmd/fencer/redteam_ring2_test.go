package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"

	"github.com/fencer-dev/fencer/client"
	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
	"github.com/fencer-dev/fencer/token"
)

// Second red-team pass on rings: one name per session, the drain's floor
// for a member that cannot hear its LOSING, and batches split across
// JoinRing messages. Each test asserts the safe outcome; a failure is a
// hole.

// rr2Raw is a raw JoinRing stream's view: the shards it was told it owns
// (snapshot or GAINED, until LOSING or LOST).
type rr2Raw struct {
	mu     sync.Mutex
	owns   map[string]string
	losing map[string]bool
	err    error
	done   chan struct{}
}

// rr2Follow opens a JoinRing stream on raw and follows it until it ends.
// The first message's error, if any, is returned.
func rr2Follow(ctx context.Context, raw fencerv1.FencerServiceClient, req *fencerv1.JoinRingRequest) (*rr2Raw, error) {
	st, err := raw.JoinRing(ctx, req)
	if err != nil {
		return nil, err
	}
	first, err := st.Recv()
	if err != nil {
		return nil, err
	}
	r := &rr2Raw{owns: map[string]string{}, losing: map[string]bool{}, done: make(chan struct{})}
	r.apply(first)
	go func() {
		defer close(r.done)
		for {
			m, err := st.Recv()
			if err != nil {
				r.mu.Lock()
				r.err = err
				r.mu.Unlock()
				return
			}
			r.apply(m)
		}
	}()
	return r, nil
}

func (r *rr2Raw) apply(m *fencerv1.JoinRingResponse) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, ch := range m.GetChanges() {
		switch ch.GetKind() {
		case fencerv1.ShardChange_KIND_GAINED:
			r.owns[ch.GetShard()] = ch.GetToken()
			delete(r.losing, ch.GetShard())
		case fencerv1.ShardChange_KIND_LOSING:
			r.losing[ch.GetShard()] = true
		case fencerv1.ShardChange_KIND_LOST:
			delete(r.owns, ch.GetShard())
			delete(r.losing, ch.GetShard())
		default:
			r.owns[ch.GetShard()] = ch.GetToken()
		}
	}
}

// held returns the shards the stream owns and has not been told LOSING.
func (r *rr2Raw) held() map[string]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]string{}
	for sh, tok := range r.owns {
		if !r.losing[sh] {
			out[sh] = tok
		}
	}
	return out
}

// rr2Session opens a session of c with ttl (by acquiring a lease through
// it), kept alive until the test ends.
func rr2Session(t *testing.T, c *client.Client, ttl time.Duration) *client.Session {
	t.Helper()
	sess, err := c.NewSession(client.WithTTL(ttl))
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = sess.Close(ctx)
	})
	_, err = sess.Acquire(rrCtx(t), fmt.Sprintf("rr2-open-%d", time.Now().UnixNano()))
	require.NoError(t, err)
	require.NotZero(t, sess.ID())
	return sess
}

// rr2Members returns the names of ring's members.
func rr2Members(t *testing.T, c *client.Client, ring string) []string {
	t.Helper()
	st, err := c.RingStatus(rrCtx(t), ring)
	require.NoError(t, err)
	var out []string
	for _, m := range st.Members {
		out = append(out, m.Member)
	}
	return out
}

// TestRedTeamRing2LeaveThenRejoinUnderAnotherName: a member w leaves
// (LeaveRing, its stream ended OK); its session then joins the ring under
// another name, w2, and another session joins under w. A member that
// has left holds no name: both joins succeed, and the ring settles with
// every shard owned once.
func TestRedTeamRing2LeaveThenRejoinUnderAnotherName(t *testing.T) {
	s := startServeProc(t)
	cn := rrDial(t, s, "")
	ctx := rrCtx(t)
	_, err := cn.c.CreateRingCount(ctx, "lr", 4)
	require.NoError(t, err)
	w := rrJoin(t, cn.c, "lr", "w", 10*time.Second, true)
	rrOwnedAll(t, cn.c, "lr", 4, w)
	require.NoError(t, w.ring.Leave(ctx))
	<-w.done
	w2, err := w.sess.JoinRing(ctx, "lr", client.WithMember("w2"), client.WithDrain(2*time.Second))
	require.NoError(t, err, "the session that left as w was refused a join as w2")
	t.Cleanup(w2.Close)
	require.Eventually(t, func() bool { return len(w2.Owned()) == 4 }, 10*time.Second, 20*time.Millisecond)
	again := rrJoin(t, cn.c, "lr", "w", 10*time.Second, true)
	require.Eventually(t, func() bool {
		n, m := len(w2.Owned()), len(again.ring.Owned())
		st, err := cn.c.RingStatus(rrCtx(t), "lr")
		return n+m == 4 && m > 0 && err == nil && st.Unowned == 0 && len(st.Members) == 2
	}, 15*time.Second, 20*time.Millisecond, "w2 %v, w %v", w2.Owned(), again.ring.Owned())
	require.ElementsMatch(t, []string{"w", "w2"}, rr2Members(t, cn.c, "lr"))
	require.NoError(t, w2.Err())
}

// TestRedTeamRing2BrokenStreamThenAnotherName: a member's stream breaks
// (its client cancels it) while its session lives. The session is still
// the member a: a join under b is RING_CONFLICT, while a join under a
// again succeeds with a's shards in its snapshot, and the ring lists a
// only.
func TestRedTeamRing2BrokenStreamThenAnotherName(t *testing.T) {
	s := startServeProc(t)
	cn := rrDial(t, s, "")
	ctx := rrCtx(t)
	_, err := cn.c.CreateRingCount(ctx, "bs", 4)
	require.NoError(t, err)
	sess := rr2Session(t, cn.c, 10*time.Second)
	sctx, cancel := context.WithCancel(ctx)
	a, err := rr2Follow(sctx, cn.raw, &fencerv1.JoinRingRequest{Ring: "bs", SessionId: sess.ID(), Member: "a", DrainSeconds: 1})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return len(a.held()) == 4 }, 10*time.Second, 20*time.Millisecond)
	cancel()
	<-a.done
	time.Sleep(200 * time.Millisecond)
	b, err := rr2Follow(ctx, cn.raw, &fencerv1.JoinRingRequest{Ring: "bs", SessionId: sess.ID(), Member: "b", DrainSeconds: 1})
	if err == nil {
		time.Sleep(time.Second)
		st, serr := cn.c.RingStatus(ctx, "bs")
		b.mu.Lock()
		t.Logf("joined as b: b owns %d, stream err %v; status %+v %v", len(b.owns), b.err, st, serr)
		b.mu.Unlock()
	}
	rrCode(t, err, codes.AlreadyExists, "the session, member a with its stream broken, joined as b")
	again, err := rr2Follow(ctx, cn.raw, &fencerv1.JoinRingRequest{Ring: "bs", SessionId: sess.ID(), Member: "a", DrainSeconds: 1})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return len(again.held()) == 4 }, 10*time.Second, 20*time.Millisecond)
	require.Equal(t, []string{"a"}, rr2Members(t, cn.c, "bs"))
}

// TestRedTeamRing2TwoNamesRacedOnTwoServers: two fencer serve processes
// on one etcd; one session joins a ring as x through one and as y through
// the other at the same moment, several times over. At most one join
// succeeds, the ring lists at most one member for the session, and no
// shard is told owned by both streams.
func TestRedTeamRing2TwoNamesRacedOnTwoServers(t *testing.T) {
	ep := startEtcd(t)
	s1 := startServeProc(t, "--etcd-endpoints", ep)
	s2 := startServeProc(t, "--etcd-endpoints", ep)
	c1, c2 := rrDial(t, s1, ""), rrDial(t, s2, "")
	ctx := rrCtx(t)
	for i := range 6 {
		ring := fmt.Sprintf("race%d", i)
		_, err := c1.c.CreateRingCount(ctx, ring, 4)
		require.NoError(t, err)
		sess := rr2Session(t, c1.c, 10*time.Second)
		var (
			wg   sync.WaitGroup
			rs   [2]*rr2Raw
			errs [2]error
		)
		start := make(chan struct{})
		for j, cn := range []*rrConn{c1, c2} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				rs[j], errs[j] = rr2Follow(ctx, cn.raw, &fencerv1.JoinRingRequest{Ring: ring, SessionId: sess.ID(), Member: []string{"x", "y"}[j], DrainSeconds: 1})
			}()
		}
		close(start)
		wg.Wait()
		time.Sleep(time.Second)
		for j := range 2 {
			if rs[j] != nil {
				rs[j].mu.Lock()
				t.Logf("%s: %s joined: owns %d, stream err %v", ring, []string{"x", "y"}[j], len(rs[j].owns), rs[j].err)
				rs[j].mu.Unlock()
			} else {
				t.Logf("%s: %s refused: %v", ring, []string{"x", "y"}[j], errs[j])
			}
		}
		st, serr := c1.c.RingStatus(ctx, ring)
		t.Logf("%s: status %+v %v", ring, st, serr)
		require.False(t, errs[0] == nil && errs[1] == nil, "%s: one session joined as x on one server and as y on the other", ring)
		for j := range 2 {
			if errs[j] != nil {
				rrCode(t, errs[j], codes.AlreadyExists, ring)
			}
		}
		time.Sleep(300 * time.Millisecond)
		require.LessOrEqual(t, len(rr2Members(t, c1.c, ring)), 1, "%s: %v", ring, rr2Members(t, c1.c, ring))
	}
}

// TestRedTeamRing2NameReusedAfterExpiry: a member w's session (opened by
// JoinRing, TTL 2 s) is never kept alive. While it lives, another
// session's join as w is RING_CONFLICT; once it has expired, a new
// session joins as w and gains every shard, and w's old tokens are
// refused.
func TestRedTeamRing2NameReusedAfterExpiry(t *testing.T) {
	s := startServeProc(t)
	cn := rrDial(t, s, "")
	ctx := rrCtx(t)
	_, err := cn.c.CreateRingCount(ctx, "ex", 4)
	require.NoError(t, err)
	old, err := rr2Follow(ctx, cn.raw, &fencerv1.JoinRingRequest{Ring: "ex", Member: "w", TtlSeconds: 2, DrainSeconds: 1})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return len(old.held()) == 4 }, 10*time.Second, 20*time.Millisecond)
	oldToks := old.held()
	sess := rr2Session(t, cn.c, 10*time.Second)
	_, err = sess.JoinRing(ctx, "ex", client.WithMember("w"))
	require.ErrorIs(t, err, client.ErrRingConflict, "w's name was taken while its session lived")
	select {
	case <-old.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the unrenewed session's stream did not end")
	}
	r, err := sess.JoinRing(ctx, "ex", client.WithMember("w"))
	require.NoError(t, err, "w's name, its session expired, was refused to a new session")
	t.Cleanup(r.Close)
	require.Eventually(t, func() bool { return len(r.Owned()) == 4 }, 10*time.Second, 20*time.Millisecond)
	for sh, tok := range oldToks {
		_, err := cn.raw.Check(ctx, &fencerv1.CheckRequest{Token: tok})
		rrCode(t, err, codes.FailedPrecondition, sh)
	}
}

// TestRedTeamRing2StreamCutKeepaliveRuns: member a's session is kept
// alive over one connection while its JoinRing stream runs over another,
// which is then cut (a partition that swallows everything). Member b
// joins. a never hears LOSING and its session does not end, so the
// drain's floor (the session's TTL plus a second) does not end its view:
// b is told GAINED while a still believes it holds the shards, the limit
// docs/ring.md states for a member whose renewals and stream take
// different connections (the Go, Python and CLI clients share one). What
// must hold: a's tokens are refused once b holds the shards.
func TestRedTeamRing2StreamCutKeepaliveRuns(t *testing.T) {
	s := startServeProc(t)
	cn := rrDial(t, s, "")
	ctx := rrCtx(t)
	_, err := cn.c.CreateRingCount(ctx, "ka", 4)
	require.NoError(t, err)
	sess := rr2Session(t, cn.c, 2*time.Second)
	bh := startBlackhole(t, s.addr, 0)
	via := rrDialAddr(t, bh.ln.Addr().String(), "")
	a, err := rr2Follow(ctx, via.raw, &fencerv1.JoinRingRequest{Ring: "ka", SessionId: sess.ID(), Member: "a", DrainSeconds: 1})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return len(a.held()) == 4 }, 10*time.Second, 20*time.Millisecond)
	bh.cut.Store(true)
	cutAt := time.Now()
	b := rrJoin(t, cn.c, "ka", "b", 10*time.Second, true)
	var both map[string]string
	ok := assertEventually(func() bool {
		both = map[string]string{}
		ah := a.held()
		for sh := range b.ring.Owned() {
			if tok, ok := ah[sh]; ok {
				both[sh] = tok
			}
		}
		return len(both) > 0
	}, 10*time.Second)
	require.True(t, ok, "b never gained a shard of a's after the cut")
	require.NoError(t, sess.Err(), "a's session ended: the attack did not keep it alive")
	t.Logf("%s after the cut, b was told GAINED of %v while a, its session alive and its stream cut, had heard no LOSING (the documented limit)",
		time.Since(cutAt).Round(100*time.Millisecond), both)
	for sh, text := range both {
		tok, err := token.Parse(text)
		require.NoError(t, err)
		_, err = cn.c.Put(ctx, tok, "ka/"+sh, []byte("a"))
		rrStale(t, err, sh)
	}
}

// rr2Cutter is a TCP proxy to a server whose server-to-client copy of
// each of the next cuts connections closes both ends after limit bytes.
type rr2Cutter struct {
	ln    net.Listener
	limit int64
	cuts  atomic.Int32
	mu    sync.Mutex
	cs    []net.Conn
}

func startCutter(t *testing.T, to string, limit int64) *rr2Cutter {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &rr2Cutter{ln: ln, limit: limit}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", to)
			if err != nil {
				_ = c.Close()
				continue
			}
			p.mu.Lock()
			p.cs = append(p.cs, c, u)
			p.mu.Unlock()
			cut := p.cuts.Add(-1) >= 0
			go func() { _, _ = io.Copy(u, c); _ = u.Close() }()
			go func() {
				if cut {
					_, _ = io.CopyN(c, u, p.limit)
					_ = c.Close()
					_ = u.Close()
					return
				}
				_, _ = io.Copy(c, u)
				_ = c.Close()
			}()
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); p.drop() })
	return p
}

// drop closes every connection so far.
func (p *rr2Cutter) drop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.cs {
		_ = c.Close()
	}
	p.cs = nil
}

// TestRedTeamRing2SnapshotCutMidBatch: a Go-client member owns every
// shard of a ring of 11,000 shards with 128-byte names (a snapshot of
// about 2 MB, split across JoinRing messages). Its connection is dropped,
// and the reopened stream is cut after 1.5 MiB of what the server sends, in
// the middle of the split snapshot, twice; then a third connection goes
// through. The member must never report a shard Lost nor own fewer than
// every shard, and must end owning all with its ring running.
func TestRedTeamRing2SnapshotCutMidBatch(t *testing.T) {
	const n = 11000
	s := startServeProc(t)
	cn := rrDial(t, s, "")
	ctx := rrCtx(t)
	shards := make([]string, n)
	for i := range shards {
		shards[i] = fmt.Sprintf("%0128d", i)
	}
	_, err := cn.c.CreateRing(ctx, "cutmid", shards...)
	require.NoError(t, err)
	p := startCutter(t, s.addr, 3<<19)
	via := rrDialAddr(t, p.ln.Addr().String(), "")
	m := rrJoin(t, via.c, "cutmid", "w", 10*time.Second, false)
	require.Eventually(t, func() bool { return len(m.ring.Owned()) == n }, 40*time.Second, 50*time.Millisecond)
	var minOwned atomic.Int64
	minOwned.Store(n)
	stop := make(chan struct{})
	go func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if k := int64(len(m.ring.Owned())); k < minOwned.Load() {
				minOwned.Store(k)
			}
			time.Sleep(time.Millisecond)
		}
	}()
	p.cuts.Store(2)
	p.drop()
	require.Eventually(t, func() bool { return p.cuts.Load() < 0 }, 20*time.Second, 20*time.Millisecond, "the client did not reconnect three times")
	time.Sleep(2 * time.Second)
	close(stop)
	m.mu.Lock()
	lost := 0
	for _, ch := range m.log {
		if ch.Kind == client.Lost {
			lost++
		}
	}
	m.mu.Unlock()
	require.NoError(t, m.ring.Err())
	require.Zero(t, lost, "shards reported Lost after a snapshot cut mid-batch")
	require.Equal(t, int64(n), minOwned.Load(), "the member owned fewer than every shard during the cut snapshots")
	require.Len(t, m.ring.Owned(), n)
}

// rr2BigRing creates ring with n shards of 128-byte names, so that a
// batch of every shard is about 2 MB, over the 1 MiB a JoinRing message
// carries.
func rr2BigRing(t *testing.T, c *client.Client, ring string, n int) {
	t.Helper()
	shards := make([]string, n)
	for i := range shards {
		shards[i] = fmt.Sprintf("%0128d", i)
	}
	_, err := c.CreateRing(rrCtx(t), ring, shards...)
	require.NoError(t, err)
}

// TestRedTeamRing2PeerDiesManyGained: member d owns every shard of a ring
// of 11,000 shards with 128-byte names; Go-client member a joins and d is
// cut off (its session's keepalive and stream swallowed), so its session
// expires and a is told GAINED of about 11,000 shards at once (about
// 2 MB of changes). a must end owning every shard, each told GAINED
// once, none Lost, its ring running.
func TestRedTeamRing2PeerDiesManyGained(t *testing.T) {
	const n = 11000
	s := startServeProc(t)
	cn := rrDial(t, s, "")
	ctx := rrCtx(t)
	rr2BigRing(t, cn.c, "die", n)
	bh := startBlackhole(t, s.addr, 0)
	via := rrDialAddr(t, bh.ln.Addr().String(), "")
	dSess := rr2Session(t, via.c, 2*time.Second)
	_, err := rr2Follow(ctx, via.raw, &fencerv1.JoinRingRequest{Ring: "die", SessionId: dSess.ID(), Member: "d", DrainSeconds: 1})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		st, err := cn.c.RingStatus(rrCtx(t), "die")
		return err == nil && st.Unowned == 0
	}, 40*time.Second, 100*time.Millisecond, "d never owned every shard")
	a := rrJoin(t, cn.c, "die", "a", 10*time.Second, true)
	bh.cut.Store(true)
	require.Eventually(t, func() bool { return len(a.ring.Owned()) == n || a.ring.Err() != nil }, 40*time.Second, 50*time.Millisecond,
		"a owns %d of %d", len(a.ring.Owned()), n)
	require.NoError(t, a.ring.Err())
	time.Sleep(500 * time.Millisecond)
	a.mu.Lock()
	gained, lost := map[string]int{}, 0
	for _, ch := range a.log {
		switch ch.Kind {
		case client.Gained:
			gained[ch.Shard]++
		case client.Lost:
			lost++
		}
	}
	a.mu.Unlock()
	require.Zero(t, lost)
	require.Len(t, gained, n)
	for sh, k := range gained {
		require.Equal(t, 1, k, "shard %s told GAINED %d times", sh, k)
	}
	require.Len(t, a.ring.Owned(), n)
}

// rr2PyWorker is a Python member: it joins ring as p, prints "ready" once
// it owns n shards, and on a line on stdin prints how many LOST it was
// told, how many shards it owns, and its ring's error.
const rr2PyWorker = `
import os, sys, threading, fencer
ring, n = sys.argv[1], int(sys.argv[2])
c = fencer.Client(timeout=20)
r = c.join(ring, member="p", drain=1)
lost = []
def follow():
    for ch in r.changes():
        if ch.kind == fencer.LOST:
            lost.append(ch.shard.name)
threading.Thread(target=follow, daemon=True).start()
import time
end = time.monotonic() + 60
while len(r.shards()) < n and time.monotonic() < end:
    time.sleep(0.05)
print("ready" if len(r.shards()) == n else "owns %d" % len(r.shards()), flush=True)
sys.stdin.readline()
print("lost=%d owned=%d error=%s" % (len(lost), len(r.shards()), r.error), flush=True)
os._exit(0)
`

// TestRedTeamRing2PythonSnapshotCutMidBatch: a Python member gains every
// shard of a ring of 11,000 shards with 128-byte names (about 2 MB of
// GAINED, split across messages), then its connection is dropped and the
// reopened stream is cut after 1.5 MiB of what the server sends, in the
// middle of the split snapshot, twice. It must never be told a shard
// LOST, and must end owning every shard with no error.
func TestRedTeamRing2PythonSnapshotCutMidBatch(t *testing.T) {
	requirePython(t, "grpc", "google.protobuf")
	const n = 11000
	s := startServeProc(t)
	cn := rrDial(t, s, "")
	rr2BigRing(t, cn.c, "pycut", n)
	p := startCutter(t, s.addr, 3<<19)
	pyDir, err := filepath.Abs("../../python")
	require.NoError(t, err)
	cmd := exec.Command(python, "-c", rr2PyWorker, "pycut", fmt.Sprint(n))
	cmd.Env = cleanEnv("FENCER_SERVER="+p.ln.Addr().String(), "PYTHONPATH="+pyDir, "PYTHONDONTWRITEBYTECODE=1")
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	lines := make(chan string, 4)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	next := func() string {
		select {
		case l, ok := <-lines:
			require.True(t, ok, "the Python member ended: %s", stderr.String())
			return l
		case <-time.After(60 * time.Second):
			t.Fatalf("the Python member said nothing: %s", stderr.String())
			return ""
		}
	}
	require.Equal(t, "ready", next(), stderr.String())
	p.cuts.Store(2)
	p.drop()
	require.Eventually(t, func() bool { return p.cuts.Load() < 0 }, 20*time.Second, 20*time.Millisecond, "the client did not reconnect three times")
	time.Sleep(2 * time.Second)
	_, err = io.WriteString(stdin, "report\n")
	require.NoError(t, err)
	require.Equal(t, fmt.Sprintf("lost=0 owned=%d error=None", n), next(), stderr.String())
}
