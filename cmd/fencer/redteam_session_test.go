package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fencer-dev/fencer/client"
	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
)

// Red-team tests of the session streams (KeepAlive, WatchLease) of fencer
// serve, through raw gRPC. Each asserts the safe outcome; a failure is a
// hole.

const (
	rsAliceTok = "alice-token-0123456789"
	rsBobTok   = "bob-token-0123456789ab"
	rsTokens   = rsAliceTok + " alice\n" + rsBobTok + " bob\n"
	// rsEnd bounds how long a stream may take to end after the event that
	// must end it.
	rsEnd = 10 * time.Second
)

// rsServer runs fencer serve with a token file naming alice and bob, and
// metrics, and returns it with the token file's path.
func rsServer(t *testing.T) (*serveProc, string) {
	t.Helper()
	dir := t.TempDir()
	tokens := rrWriteFile(t, dir, "tokens", rsTokens)
	s := &serveProc{t: t, bin: fencerBinary(t), addr: freeAddr(t), metrics: freeAddr(t), dataDir: t.TempDir(),
		args: []string{"--token-file", tokens, "--authz-allow-all"}}
	s.start()
	t.Cleanup(s.stop)
	return s, tokens
}

// rsSession opens a session of c with ttl seconds by acquiring lease name.
func rsSession(t *testing.T, c *rrConn, name string, ttl int64) *fencerv1.AcquireResponse {
	t.Helper()
	r, err := c.raw.Acquire(rrCtx(t), &fencerv1.AcquireRequest{Name: name, TtlSeconds: ttl})
	require.NoError(t, err, name)
	return r
}

// rsReason asserts that err has gRPC code c and fencer reason r.
func rsReason(t *testing.T, err error, c codes.Code, r fencerv1.ErrorReason, msgAndArgs ...any) {
	t.Helper()
	rrCode(t, err, c, msgAndArgs...)
	require.Equal(t, r, client.Reason(err), "%v %v", err, fmt.Sprint(msgAndArgs...))
}

// rsRecvErr returns the error that ends st's receive side, or fails after
// rsEnd; responses before it are discarded.
func rsRecvErr[T any](t *testing.T, recv func() (T, error), what string) error {
	t.Helper()
	ch := make(chan error, 1)
	go func() {
		for {
			if _, err := recv(); err != nil {
				ch <- err
				return
			}
		}
	}()
	select {
	case err := <-ch:
		return err
	case <-time.After(rsEnd):
		t.Fatalf("%s: the stream did not end within %s", what, rsEnd)
		return nil
	}
}

// rsIdle opens a KeepAlive stream of c renewing id once, and a WatchLease
// stream of id read up to SYNCED, both then left idle.
func rsIdle(t *testing.T, ctx context.Context, c *rrConn, id int64) (fencerv1.FencerService_KeepAliveClient, fencerv1.FencerService_WatchLeaseClient) {
	t.Helper()
	ka, err := c.raw.KeepAlive(ctx)
	require.NoError(t, err)
	require.NoError(t, ka.Send(&fencerv1.KeepAliveRequest{SessionId: id}))
	r, err := ka.Recv()
	require.NoError(t, err)
	require.Equal(t, id, r.GetSessionId())
	w, err := c.raw.WatchLease(ctx, &fencerv1.WatchLeaseRequest{SessionId: id})
	require.NoError(t, err)
	ev, err := w.Recv()
	require.NoError(t, err)
	require.Equal(t, fencerv1.WatchLeaseResponse_TYPE_SYNCED, ev.GetType())
	return ka, w
}

// rsHammer renews id on a new KeepAlive stream of c as fast as the server
// answers until the stream fails, and returns that failure on the channel.
func rsHammer(ctx context.Context, c *rrConn, id int64) <-chan error {
	out := make(chan error, 1)
	go func() {
		ka, err := c.raw.KeepAlive(ctx)
		if err != nil {
			out <- err
			return
		}
		for {
			if err := ka.Send(&fencerv1.KeepAliveRequest{SessionId: id}); err != nil {
				_, err = ka.Recv()
				out <- err
				return
			}
			if _, err := ka.Recv(); err != nil {
				out <- err
				return
			}
		}
	}()
	return out
}

// rsWait returns the error on ch, or fails after rsEnd.
func rsWait(t *testing.T, ch <-chan error, what string) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(rsEnd):
		t.Fatalf("%s: the stream did not end within %s", what, rsEnd)
		return nil
	}
}

// One principal cannot renew or watch another's session, whether alone
// on a stream or interleaved with its own sessions on one stream; the
// stream that tried ends, and the victim's session is not renewed by it.
func TestRedTeamSessionCrossPrincipal(t *testing.T) {
	s, _ := rsServer(t)
	alice, bob := rrDial(t, s, rsAliceTok), rrDial(t, s, rsBobTok)
	a := rsSession(t, alice, "a", 3)
	b1, b2 := rsSession(t, bob, "b1", 30), rsSession(t, bob, "b2", 30)
	ctx := rrCtx(t)

	ka, err := bob.raw.KeepAlive(ctx)
	require.NoError(t, err)
	for _, id := range []int64{b1.SessionId, b2.SessionId} {
		require.NoError(t, ka.Send(&fencerv1.KeepAliveRequest{SessionId: id}))
		r, err := ka.Recv()
		require.NoError(t, err)
		require.Equal(t, id, r.GetSessionId())
	}
	require.NoError(t, ka.Send(&fencerv1.KeepAliveRequest{SessionId: a.SessionId}))
	_ = ka.Send(&fencerv1.KeepAliveRequest{SessionId: b1.SessionId})
	err = rsRecvErr(t, ka.Recv, "bob renewing alice's session")
	rsReason(t, err, codes.PermissionDenied, fencerv1.ErrorReason_ERROR_REASON_PERMISSION_DENIED)

	w, err := bob.raw.WatchLease(ctx, &fencerv1.WatchLeaseRequest{SessionId: a.SessionId})
	require.NoError(t, err)
	_, err = w.Recv()
	rsReason(t, err, codes.PermissionDenied, fencerv1.ErrorReason_ERROR_REASON_PERMISSION_DENIED)

	// A hundred renewals of alice's session, each on its own stream, keep
	// nothing alive: it expires after its 3 s TTL.
	var wg sync.WaitGroup
	for range 100 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, err := bob.raw.KeepAlive(ctx)
			if err == nil && st.Send(&fencerv1.KeepAliveRequest{SessionId: a.SessionId}) == nil {
				_, err = st.Recv()
			}
			if status.Code(err) != codes.PermissionDenied {
				t.Errorf("bob renewed alice's session: %v", err)
			}
		}()
	}
	wg.Wait()
	require.Eventually(t, func() bool {
		_, err := alice.raw.Check(ctx, &fencerv1.CheckRequest{Token: a.Token})
		return err != nil
	}, 15*time.Second, 250*time.Millisecond, "alice's unrenewed session never expired")
	st, err := alice.raw.KeepAlive(ctx)
	require.NoError(t, err)
	require.NoError(t, st.Send(&fencerv1.KeepAliveRequest{SessionId: a.SessionId}))
	_, err = st.Recv()
	rsReason(t, err, codes.NotFound, fencerv1.ErrorReason_ERROR_REASON_SESSION_NOT_FOUND)
}

// A renewal of a session etcd no longer has, revoked or expired, is never
// acknowledged: the stream ends with SESSION_NOT_FOUND, and so does a
// WatchLease of it, also one already waiting when the session is revoked.
func TestRedTeamSessionGoneSession(t *testing.T) {
	s, _ := rsServer(t)
	alice := rrDial(t, s, rsAliceTok)
	ctx := rrCtx(t)

	revoked := rsSession(t, alice, "revoked", 30)
	ka, w := rsIdle(t, ctx, alice, revoked.SessionId)
	_, err := alice.raw.Release(ctx, &fencerv1.ReleaseRequest{Target: &fencerv1.ReleaseRequest_SessionId{SessionId: revoked.SessionId}})
	require.NoError(t, err)
	err = rsRecvErr(t, w.Recv, "watch of a revoked session")
	rsReason(t, err, codes.NotFound, fencerv1.ErrorReason_ERROR_REASON_SESSION_NOT_FOUND)
	require.NoError(t, ka.Send(&fencerv1.KeepAliveRequest{SessionId: revoked.SessionId}))
	err = rsRecvErr(t, ka.Recv, "renewal of a revoked session")
	rsReason(t, err, codes.NotFound, fencerv1.ErrorReason_ERROR_REASON_SESSION_NOT_FOUND)

	expired := rsSession(t, alice, "expired", 1)
	time.Sleep(3 * time.Second)
	ka2, err := alice.raw.KeepAlive(ctx)
	require.NoError(t, err)
	require.NoError(t, ka2.Send(&fencerv1.KeepAliveRequest{SessionId: expired.SessionId}))
	err = rsRecvErr(t, ka2.Recv, "renewal of an expired session")
	rsReason(t, err, codes.NotFound, fencerv1.ErrorReason_ERROR_REASON_SESSION_NOT_FOUND)

	for _, id := range []int64{0, -1, 1 << 62} {
		st, err := alice.raw.KeepAlive(ctx)
		require.NoError(t, err)
		require.NoError(t, st.Send(&fencerv1.KeepAliveRequest{SessionId: id}))
		_, err = st.Recv()
		require.Error(t, err, "a renewal of session %d was acknowledged", id)
	}

	// The Go client's session reports the loss: Done closes.
	sess, err := alice.c.NewSession(client.WithTTL(2 * time.Second))
	require.NoError(t, err)
	l, err := sess.Acquire(ctx, "client")
	require.NoError(t, err)
	_, err = alice.raw.Release(ctx, &fencerv1.ReleaseRequest{Target: &fencerv1.ReleaseRequest_SessionId{SessionId: sess.ID()}})
	require.NoError(t, err)
	for what, done := range map[string]<-chan struct{}{"session": sess.Done(), "lease": l.Done()} {
		select {
		case <-done:
		case <-time.After(rsEnd):
			t.Fatalf("the client's %s still believes it holds a revoked session", what)
		}
	}
}

// A client that half-closes its KeepAlive stream right after a request
// gets its answer, and then the end of the stream, not a hang.
func TestRedTeamSessionHalfClose(t *testing.T) {
	s, _ := rsServer(t)
	alice := rrDial(t, s, rsAliceTok)
	a := rsSession(t, alice, "a", 30)
	ctx := rrCtx(t)
	for range 20 {
		ka, err := alice.raw.KeepAlive(ctx)
		require.NoError(t, err)
		require.NoError(t, ka.Send(&fencerv1.KeepAliveRequest{SessionId: a.SessionId}))
		require.NoError(t, ka.CloseSend())
		r, err := ka.Recv()
		require.NoError(t, err, "the renewal before a half-close was not answered")
		require.Equal(t, a.SessionId, r.GetSessionId())
		err = rsRecvErr(t, ka.Recv, "half-closed KeepAlive")
		require.ErrorIs(t, err, io.EOF)
	}
	ka, err := alice.raw.KeepAlive(ctx)
	require.NoError(t, err)
	require.NoError(t, ka.CloseSend())
	require.ErrorIs(t, rsRecvErr(t, ka.Recv, "empty half-closed KeepAlive"), io.EOF)
}

// SIGTERM ends idle and busy KeepAlive streams and idle WatchLease streams
// with UNAVAILABLE and reason SHUTTING_DOWN, so that
// clients fail over; none hangs and none reads CANCELLED.
func TestRedTeamSessionShutdown(t *testing.T) {
	s, _ := rsServer(t)
	alice := rrDial(t, s, rsAliceTok)
	ctx := rrCtx(t)
	a := rsSession(t, alice, "a", 30)
	ka, w := rsIdle(t, ctx, alice, a.SessionId)
	var busy []<-chan error
	for range 4 {
		busy = append(busy, rsHammer(ctx, alice, a.SessionId))
	}
	time.Sleep(200 * time.Millisecond)
	require.NoError(t, s.cmd.Process.Signal(syscall.SIGTERM))

	rsReason(t, rsRecvErr(t, ka.Recv, "idle KeepAlive at shutdown"), codes.Unavailable, fencerv1.ErrorReason_ERROR_REASON_SHUTTING_DOWN)
	rsReason(t, rsRecvErr(t, w.Recv, "idle WatchLease at shutdown"), codes.Unavailable, fencerv1.ErrorReason_ERROR_REASON_SHUTTING_DOWN)
	for i, ch := range busy {
		err := rsWait(t, ch, "busy KeepAlive at shutdown")
		rsReason(t, err, codes.Unavailable, fencerv1.ErrorReason_ERROR_REASON_SHUTTING_DOWN, "busy stream", i)
	}
	require.Equal(t, 0, s.waitExit(t), "%s", s.log)
}

// Removing a principal's token from the token file ends its waiting and
// its busy KeepAlive and WatchLease streams with UNAUTHENTICATED, and
// leaves the other principal's streams running.
func TestRedTeamSessionTokenRevoked(t *testing.T) {
	s, tokens := rsServer(t)
	alice, bob := rrDial(t, s, rsAliceTok), rrDial(t, s, rsBobTok)
	ctx := rrCtx(t)
	a, b := rsSession(t, alice, "a", 30), rsSession(t, bob, "b", 30)
	aka, aw := rsIdle(t, ctx, alice, a.SessionId)
	bka, bw := rsIdle(t, ctx, bob, b.SessionId)
	busy := rsHammer(ctx, bob, b.SessionId)
	time.Sleep(200 * time.Millisecond)

	require.NoError(t, os.WriteFile(tokens+".new", []byte(rsAliceTok+" alice\n"), 0o600))
	require.NoError(t, os.Rename(tokens+".new", tokens))

	rsReason(t, rsRecvErr(t, bka.Recv, "bob's idle KeepAlive"), codes.Unauthenticated, fencerv1.ErrorReason_ERROR_REASON_UNAUTHENTICATED)
	rrCode(t, rsRecvErr(t, bw.Recv, "bob's idle WatchLease"), codes.Unauthenticated)
	rsReason(t, rsWait(t, busy, "bob's busy KeepAlive"), codes.Unauthenticated, fencerv1.ErrorReason_ERROR_REASON_UNAUTHENTICATED)

	// Bob can open nothing more; alice's streams still work.
	st, err := bob.raw.KeepAlive(ctx)
	if err == nil && st.Send(&fencerv1.KeepAliveRequest{SessionId: b.SessionId}) == nil {
		_, err = st.Recv()
	}
	rrCode(t, err, codes.Unauthenticated)
	require.NoError(t, aka.Send(&fencerv1.KeepAliveRequest{SessionId: a.SessionId}))
	r, err := aka.Recv()
	require.NoError(t, err)
	require.Equal(t, a.SessionId, r.GetSessionId())
	_, err = alice.raw.Release(ctx, &fencerv1.ReleaseRequest{Target: &fencerv1.ReleaseRequest_SessionId{SessionId: a.SessionId}})
	require.NoError(t, err)
	rsReason(t, rsRecvErr(t, aw.Recv, "alice's WatchLease"), codes.NotFound, fencerv1.ErrorReason_ERROR_REASON_SESSION_NOT_FOUND)
}

// Thousands of KeepAlive and WatchLease streams, opened and abandoned
// (cancelled, half-closed, or flooded by a client that never reads), leave
// no goroutines behind on the server.
func TestRedTeamSessionAbandonedStreamsLeakNothing(t *testing.T) {
	s, _ := rsServer(t)
	alice := rrDial(t, s, rsAliceTok)
	a := rsSession(t, alice, "a", 60)
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	goroutines := func() float64 {
		m, err := readMetrics(hc, "http://"+s.metrics+"/metrics")
		require.NoError(t, err)
		g, ok := m["go_goroutines"]
		require.True(t, ok, "no go_goroutines on /metrics")
		return g
	}
	var base float64
	require.Eventually(t, func() bool {
		m, err := readMetrics(hc, "http://"+s.metrics+"/metrics")
		base = m["go_goroutines"]
		return err == nil && base > 0
	}, 10*time.Second, 50*time.Millisecond)

	const n = 1000
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	sem := make(chan struct{}, 50)
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			switch i % 4 {
			case 0: // renewed once, then left open
				ka, err := alice.raw.KeepAlive(ctx)
				if err == nil && ka.Send(&fencerv1.KeepAliveRequest{SessionId: a.SessionId}) == nil {
					_, _ = ka.Recv()
				}
			case 1: // a request, never read, then half-closed
				ka, err := alice.raw.KeepAlive(ctx)
				if err == nil {
					_ = ka.Send(&fencerv1.KeepAliveRequest{SessionId: a.SessionId})
					_ = ka.CloseSend()
				}
			case 2: // a watch left open
				w, err := alice.raw.WatchLease(ctx, &fencerv1.WatchLeaseRequest{SessionId: a.SessionId})
				if err == nil {
					_, _ = w.Recv()
				}
			case 3: // opened and never used
				_, _ = alice.raw.KeepAlive(ctx)
			}
		}()
	}
	wg.Wait()
	// A client that floods renewals and never reads the answers.
	flood, err := alice.raw.KeepAlive(ctx)
	require.NoError(t, err)
	sent := make(chan int, 1)
	go func() {
		k := 0
		for ; k < 20000; k++ {
			if flood.Send(&fencerv1.KeepAliveRequest{SessionId: a.SessionId}) != nil {
				break
			}
		}
		sent <- k
	}()
	time.Sleep(2 * time.Second)
	peak := goroutines()
	t.Logf("goroutines: baseline %v, with %d streams open %v", base, n+1, peak)
	cancel()
	select {
	case k := <-sent:
		t.Logf("the flood sent %d requests before it was cancelled", k)
	case <-time.After(rsEnd):
		t.Fatal("the flood's Send never returned after cancel")
	}
	var last float64
	ok := assertEventually(func() bool {
		last = goroutines()
		return last <= base+10
	}, 20*time.Second)
	require.True(t, ok, "goroutines did not return to baseline: baseline %v, peak %v, now %v", base, peak, last)

	// The session still renews: nothing the abandoned streams did broke it.
	ka, err := alice.raw.KeepAlive(rrCtx(t))
	require.NoError(t, err)
	require.NoError(t, ka.Send(&fencerv1.KeepAliveRequest{SessionId: a.SessionId}))
	_, err = ka.Recv()
	require.NoError(t, err)
}

// rsFlood opens a KeepAlive stream of c that sends renewals of id without
// reading the answers after the first, until the server stops taking
// them; it returns once the server has answered the first, with the count
// of the requests sent so far.
func rsFlood(t *testing.T, ctx context.Context, c *rrConn, id int64) (fencerv1.FencerService_KeepAliveClient, *atomic.Int64) {
	t.Helper()
	st, err := c.raw.KeepAlive(ctx)
	require.NoError(t, err)
	require.NoError(t, st.Send(&fencerv1.KeepAliveRequest{SessionId: id}))
	_, err = st.Recv()
	require.NoError(t, err, "the first renewal on a flooded stream")
	var sent atomic.Int64
	go func() {
		for st.Send(&fencerv1.KeepAliveRequest{SessionId: id}) == nil {
			sent.Add(1)
		}
	}()
	return st, &sent
}

// rsStalled waits until none of the counts has moved for a second: the
// server has stopped reading every flooded stream, its sends blocked by
// flow control.
func rsStalled(t *testing.T, counts []*atomic.Int64) {
	t.Helper()
	prev := make([]int64, len(counts))
	still := time.Now()
	require.True(t, assertEventually(func() bool {
		for i, c := range counts {
			if n := c.Load(); n != prev[i] {
				prev[i], still = n, time.Now()
			}
		}
		return time.Since(still) > time.Second
	}, 20*time.Second), "the server never stopped reading the flooded streams")
}

// rsGoroutines returns s's go_goroutines.
func rsGoroutines(t *testing.T, s *serveProc) float64 {
	t.Helper()
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	var g float64
	require.Eventually(t, func() bool {
		m, err := readMetrics(hc, "http://"+s.metrics+"/metrics")
		var ok bool
		g, ok = m["go_goroutines"]
		return err == nil && ok
	}, 10*time.Second, 50*time.Millisecond, "no go_goroutines on /metrics")
	return g
}

// A token whose line now names another principal no longer speaks for
// the first: the first principal's open streams end with UNAUTHENTICATED,
// and the token cannot renew the first principal's session.
func TestRedTeamSessionTokenRemapped(t *testing.T) {
	s, tokens := rsServer(t)
	alice := rrDial(t, s, rsAliceTok)
	ctx := rrCtx(t)
	a := rsSession(t, alice, "a", 30)
	ka, w := rsIdle(t, ctx, alice, a.SessionId)

	require.NoError(t, os.WriteFile(tokens+".new", []byte(rsAliceTok+" mallory\n"+rsBobTok+" bob\n"), 0o600))
	require.NoError(t, os.Rename(tokens+".new", tokens))

	rrCode(t, rsRecvErr(t, ka.Recv, "alice's idle KeepAlive, her token now mallory's"), codes.Unauthenticated)
	rrCode(t, rsRecvErr(t, w.Recv, "alice's idle WatchLease, her token now mallory's"), codes.Unauthenticated)
	st, err := alice.raw.KeepAlive(ctx)
	require.NoError(t, err)
	require.NoError(t, st.Send(&fencerv1.KeepAliveRequest{SessionId: a.SessionId}))
	_, err = st.Recv()
	rrCode(t, err, codes.PermissionDenied, "mallory renewing alice's session")
}

// Streams whose clients never read (the server's sends blocked by flow
// control) still end when their principal's token is removed: the server
// ends their calls at the reload, while the connections stay open and
// unread, as it does for streams waiting for a request.
func TestRedTeamSessionUnreadStreamsAtRevocation(t *testing.T) {
	s, tokens := rsServer(t)
	alice, bob := rrDial(t, s, rsAliceTok), rrDial(t, s, rsBobTok)
	a, b := rsSession(t, alice, "a", 30), rsSession(t, bob, "b", 30)
	ctx := rrCtx(t)
	base := rsGoroutines(t, s)
	const n = 5
	var floods []fencerv1.FencerService_KeepAliveClient
	var counts []*atomic.Int64
	for range n {
		st, sent := rsFlood(t, ctx, bob, b.SessionId)
		floods, counts = append(floods, st), append(counts, sent)
	}
	_, sent := rsFlood(t, ctx, alice, a.SessionId)
	rsStalled(t, append(counts, sent))
	peak := rsGoroutines(t, s)
	// An idle stream of bob's, which the reload ends: the control.
	idle, _ := rsIdle(t, ctx, bob, b.SessionId)

	require.NoError(t, os.WriteFile(tokens+".new", []byte(rsAliceTok+" alice\n"), 0o600))
	require.NoError(t, os.Rename(tokens+".new", tokens))
	revoked := time.Now()
	ended := func() int {
		k := 0
		for _, line := range strings.Split(s.log.String(), "\n") {
			if strings.Contains(line, "method=KeepAlive code=Unauthenticated") && strings.Contains(line, "principal=bob") {
				k++
			}
		}
		return k
	}
	rsReason(t, rsRecvErr(t, idle.Recv, "bob's idle KeepAlive"), codes.Unauthenticated, fencerv1.ErrorReason_ERROR_REASON_UNAUTHENTICATED)
	ok := assertEventually(func() bool { return ended() == n+1 }, rsEnd)
	t.Logf("goroutines: baseline %v, with %d unread streams %v, %s after the revocation %v", base, n+1, peak, time.Since(revoked), rsGoroutines(t, s))
	require.True(t, ok, "%d of bob's %d unread KeepAlive streams still run %s after his token was removed (the server logged %d KeepAlive calls of his ended UNAUTHENTICATED, his idle one's among them)", n+1-ended(), n, time.Since(revoked), ended())
	drained := time.Now()
	errs := make(chan error, len(floods))
	for _, st := range floods {
		go func() {
			for {
				if _, err := st.Recv(); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	for i := range floods {
		select {
		case err := <-errs:
			rrCode(t, err, codes.Unauthenticated, "stream", i)
		case <-time.After(rsEnd):
			t.Fatalf("%d of bob's unread streams still run %s after the revocation", len(floods)-i, time.Since(revoked))
		}
	}
	t.Logf("bob's streams drained to UNAUTHENTICATED in %s", time.Since(drained))
}

// SIGTERM ends streams whose clients never read (the server's sends
// held by flow control): the handlers return at once, and the server
// exits 0 once its grace has passed, saying that it cut what was still
// open. Such a client cannot receive its SHUTTING_DOWN (gRPC sends the
// status behind the replies the client has not read), so it sees
// UNAVAILABLE when the connection closes; a client that reads gets
// SHUTTING_DOWN (TestRedTeamSessionShutdown).
func TestRedTeamSessionUnreadStreamsAtShutdown(t *testing.T) {
	s, _ := rsServer(t)
	alice := rrDial(t, s, rsAliceTok)
	a := rsSession(t, alice, "a", 30)
	ctx := rrCtx(t)
	var floods []fencerv1.FencerService_KeepAliveClient
	var counts []*atomic.Int64
	for range 5 {
		st, sent := rsFlood(t, ctx, alice, a.SessionId)
		floods, counts = append(floods, st), append(counts, sent)
	}
	rsStalled(t, counts)
	start := time.Now()
	require.NoError(t, s.cmd.Process.Signal(syscall.SIGTERM))
	code := s.waitExit(t)
	took := time.Since(start)
	reasons := map[string]int{}
	for _, st := range floods {
		err := rsRecvErr(t, st.Recv, "unread KeepAlive at shutdown")
		reasons[fmt.Sprintf("%v %v", status.Code(err), client.Reason(err))]++
	}
	t.Logf("exit %d after %s; the streams ended with %v", code, took, reasons)
	for reason, n := range reasons {
		require.True(t, strings.HasPrefix(reason, "Unavailable "), "%d unread streams ended %s, not UNAVAILABLE", n, reason)
	}
	require.Equal(t, 0, code, "fencer serve exited %d on SIGTERM with unread streams open:\n%s", code, s.log)
	require.Less(t, took, 2*time.Second+5*time.Second, "fencer serve took %s to exit, past its 2 s grace (serveProc's)", took)
	require.Contains(t, s.log.String(), "shutdown grace passed: the calls still open were cut")
}

// A Go client whose token is removed cannot renew its session any more,
// and its holder learns so: the session and its lease end (Done closes)
// within about the TTL, rather than the holder believing it still holds.
func TestRedTeamSessionClientOfRevokedToken(t *testing.T) {
	s, tokens := rsServer(t)
	bob := rrDial(t, s, rsBobTok)
	ctx := rrCtx(t)
	sess, err := bob.c.NewSession(client.WithTTL(2 * time.Second))
	require.NoError(t, err)
	l, err := sess.Acquire(ctx, "b")
	require.NoError(t, err)
	time.Sleep(3 * time.Second)
	require.NoError(t, sess.Err(), "the session ended before the revocation")

	require.NoError(t, os.WriteFile(tokens+".new", []byte(rsAliceTok+" alice\n"), 0o600))
	require.NoError(t, os.Rename(tokens+".new", tokens))
	revoked := time.Now()
	for what, done := range map[string]<-chan struct{}{"session": sess.Done(), "lease": l.Done()} {
		select {
		case <-done:
		case <-time.After(rsEnd):
			t.Fatalf("the %s still runs %s after its token was removed", what, time.Since(revoked))
		}
	}
	t.Logf("ended %s after the revocation: session %v; lease %v", time.Since(revoked), sess.Err(), l.Err())
}

// SIGTERM ends pipelined KeepAlive streams, whose clients send renewals
// without waiting for answers and read every answer, with SHUTTING_DOWN,
// and the server exits 0.
func TestRedTeamSessionPipelinedStreamsAtShutdown(t *testing.T) {
	s, _ := rsServer(t)
	alice := rrDial(t, s, rsAliceTok)
	a := rsSession(t, alice, "a", 30)
	ctx := rrCtx(t)
	var ends []<-chan error
	for range 4 {
		st, err := alice.raw.KeepAlive(ctx)
		require.NoError(t, err)
		go func() {
			for st.Send(&fencerv1.KeepAliveRequest{SessionId: a.SessionId}) == nil {
			}
		}()
		end := make(chan error, 1)
		go func() {
			for {
				if _, err := st.Recv(); err != nil {
					end <- err
					return
				}
			}
		}()
		ends = append(ends, end)
	}
	time.Sleep(time.Second)
	require.NoError(t, s.cmd.Process.Signal(syscall.SIGTERM))
	for i, end := range ends {
		rsReason(t, rsWait(t, end, "pipelined KeepAlive at shutdown"), codes.Unavailable, fencerv1.ErrorReason_ERROR_REASON_SHUTTING_DOWN, "stream", i)
	}
	require.Equal(t, 0, s.waitExit(t), "%s", s.log)
}
