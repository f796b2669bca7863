package server_test

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fencer-dev/fencer/fencertest"
	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
	"github.com/fencer-dev/fencer/token"
)

// sessionsStream is a raw Sessions stream with a reader that hands every
// message to the test.
type sessionsStream struct {
	t      *testing.T
	stream fencerv1.FencerService_SessionsClient
	msgs   chan *fencerv1.SessionsResponse
	ended  chan error // the stream's error, once it ends
}

func openSessions(t *testing.T, ctx context.Context, rpc fencerv1.FencerServiceClient) *sessionsStream {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	st, err := rpc.Sessions(ctx)
	require.NoError(t, err)
	s := &sessionsStream{t: t, stream: st, msgs: make(chan *fencerv1.SessionsResponse, 1024), ended: make(chan error, 1)}
	go func() {
		for {
			m, err := st.Recv()
			if err != nil {
				s.ended <- err
				return
			}
			s.msgs <- m
		}
	}()
	return s
}

func (s *sessionsStream) send(req *fencerv1.SessionsRequest) {
	s.t.Helper()
	require.NoError(s.t, s.stream.Send(req))
}

func (s *sessionsStream) renew(id int64) {
	s.t.Helper()
	s.send(&fencerv1.SessionsRequest{Request: &fencerv1.SessionsRequest_Renew{Renew: &fencerv1.KeepAliveRequest{SessionId: id}}})
}

func (s *sessionsStream) watch(wid, session, from int64) {
	s.t.Helper()
	s.send(&fencerv1.SessionsRequest{Request: &fencerv1.SessionsRequest_Watch{Watch: &fencerv1.SessionsWatch{
		WatchId: wid, Watch: &fencerv1.WatchLeaseRequest{SessionId: session, StartRevision: from}}}})
}

func (s *sessionsStream) unwatch(wid int64) {
	s.t.Helper()
	s.send(&fencerv1.SessionsRequest{Request: &fencerv1.SessionsRequest_Unwatch{Unwatch: &fencerv1.SessionsUnwatch{WatchId: wid}}})
}

// next returns the stream's next message other than a PROGRESS event.
func (s *sessionsStream) next() *fencerv1.SessionsResponse {
	s.t.Helper()
	for {
		select {
		case m := <-s.msgs:
			if m.GetEvent().GetEvent().GetType() == fencerv1.WatchLeaseResponse_TYPE_PROGRESS {
				continue
			}
			return m
		case err := <-s.ended:
			s.t.Fatalf("the Sessions stream ended: %v", err)
		case <-time.After(10 * time.Second):
			s.t.Fatal("no message on the Sessions stream in 10s")
		}
	}
}

// quiet asserts that no message other than PROGRESS comes for d.
func (s *sessionsStream) quiet(d time.Duration) {
	s.t.Helper()
	deadline := time.After(d)
	for {
		select {
		case m := <-s.msgs:
			if m.GetEvent().GetEvent().GetType() != fencerv1.WatchLeaseResponse_TYPE_PROGRESS {
				s.t.Fatalf("unexpected message: %v", m)
			}
		case err := <-s.ended:
			s.t.Fatalf("the Sessions stream ended: %v", err)
		case <-deadline:
			return
		}
	}
}

// end returns the error that ends the stream.
func (s *sessionsStream) end() error {
	s.t.Helper()
	for {
		select {
		case <-s.msgs:
		case err := <-s.ended:
			return err
		case <-time.After(10 * time.Second):
			s.t.Fatal("the Sessions stream did not end in 10s")
		}
	}
}

// sessionsErr is a SessionsError as the call error it stands for.
func sessionsErr(e *fencerv1.SessionsError) error {
	if e == nil {
		return nil
	}
	return fmt.Errorf("%s (%s): %s", codes.Code(e.GetCode()), e.GetReason(), e.GetMessage())
}

func requireRenewed(t *testing.T, m *fencerv1.SessionsResponse, id int64) {
	t.Helper()
	require.Equal(t, id, m.GetRenewed().GetSessionId(), "renewed: %v", m)
	require.Positive(t, m.GetRenewed().GetTtlSeconds())
}

func requireRenewFailed(t *testing.T, m *fencerv1.SessionsResponse, id int64, reason fencerv1.ErrorReason) {
	t.Helper()
	require.Equal(t, id, m.GetRenewFailed().GetSessionId(), "renew_failed: %v", m)
	require.Equal(t, reason.Reason(), m.GetRenewFailed().GetError().GetReason(), "%v", sessionsErr(m.GetRenewFailed().GetError()))
}

func requireEvent(t *testing.T, m *fencerv1.SessionsResponse, wid int64, typ fencerv1.WatchLeaseResponse_Type, tok string) {
	t.Helper()
	require.Equal(t, wid, m.GetEvent().GetWatchId(), "event: %v", m)
	require.Equal(t, typ, m.GetEvent().GetEvent().GetType(), "event: %v", m)
	if tok != "" {
		require.Equal(t, tok, m.GetEvent().GetEvent().GetToken())
	}
}

func requireWatchEnded(t *testing.T, m *fencerv1.SessionsResponse, wid int64, c codes.Code, reason fencerv1.ErrorReason) {
	t.Helper()
	e := m.GetWatchEnded().GetError()
	require.Equal(t, wid, m.GetWatchEnded().GetWatchId(), "watch_ended: %v", m)
	require.Equal(t, int32(c), e.GetCode(), "%v", sessionsErr(e))
	require.Equal(t, reason.Reason(), e.GetReason(), "%v", sessionsErr(e))
}

// TestSessionsCarriesManySessions: three sessions renewed and watched on
// one stream. Each watch hears only its own session's losses; a session
// that ends ends its own watch and renewals only.
func TestSessionsCarriesManySessions(t *testing.T) {
	ctx := fencertest.Context(t)
	addr, _ := startServer(t, fencertest.SharedStore(t))
	rpc := fencerv1.NewFencerServiceClient(dial(t, alice, addr))
	var acq [3]*fencerv1.AcquireResponse
	for i := range acq {
		var err error
		acq[i], err = rpc.Acquire(ctx, &fencerv1.AcquireRequest{Name: fmt.Sprintf("many-%d", i), TtlSeconds: 30})
		require.NoError(t, err)
	}
	s := openSessions(t, ctx, rpc)
	for i, a := range acq {
		s.renew(a.GetSessionId())
		requireRenewed(t, s.next(), a.GetSessionId())
		s.watch(int64(10+i), a.GetSessionId(), 0)
		requireEvent(t, s.next(), int64(10+i), fencerv1.WatchLeaseResponse_TYPE_SYNCED, "")
	}

	// Session 1's lease is released by token: only watch 11 hears of it.
	_, err := rpc.Release(ctx, &fencerv1.ReleaseRequest{Target: &fencerv1.ReleaseRequest_Token{Token: acq[1].GetToken()}})
	require.NoError(t, err)
	requireEvent(t, s.next(), 11, fencerv1.WatchLeaseResponse_TYPE_LOST, acq[1].GetToken())

	// Session 2 ends: its watch ends, its renewals fail, the others go on.
	_, err = rpc.Release(ctx, &fencerv1.ReleaseRequest{Target: &fencerv1.ReleaseRequest_SessionId{SessionId: acq[2].GetSessionId()}})
	require.NoError(t, err)
	requireWatchEnded(t, s.next(), 12, codes.NotFound, fencerv1.ErrorReason_ERROR_REASON_SESSION_NOT_FOUND)
	s.renew(acq[2].GetSessionId())
	requireRenewFailed(t, s.next(), acq[2].GetSessionId(), fencerv1.ErrorReason_ERROR_REASON_SESSION_NOT_FOUND)
	s.renew(acq[0].GetSessionId())
	requireRenewed(t, s.next(), acq[0].GetSessionId())
	_, err = rpc.Release(ctx, &fencerv1.ReleaseRequest{Target: &fencerv1.ReleaseRequest_Token{Token: acq[0].GetToken()}})
	require.NoError(t, err)
	requireEvent(t, s.next(), 10, fencerv1.WatchLeaseResponse_TYPE_LOST, acq[0].GetToken())
	s.quiet(300 * time.Millisecond)
}

// TestSessionsIsolatesPrincipals: bob's stream cannot renew or watch
// alice's session, and his own session on the same stream goes on. Alice's
// session, renewed only by bob's attempts, expires.
func TestSessionsIsolatesPrincipals(t *testing.T) {
	ctx := fencertest.Context(t)
	addr, _ := startServer(t, fencertest.SharedStore(t))
	arpc := fencerv1.NewFencerServiceClient(dial(t, alice, addr))
	brpc := fencerv1.NewFencerServiceClient(dial(t, bob, addr))
	const ttl = 2
	a, err := arpc.Acquire(ctx, &fencerv1.AcquireRequest{Name: "alices", TtlSeconds: ttl})
	require.NoError(t, err)
	b, err := brpc.Acquire(ctx, &fencerv1.AcquireRequest{Name: "bobs", TtlSeconds: 30})
	require.NoError(t, err)
	s := openSessions(t, ctx, brpc)
	s.watch(1, a.GetSessionId(), 0)
	requireWatchEnded(t, s.next(), 1, codes.PermissionDenied, fencerv1.ErrorReason_ERROR_REASON_PERMISSION_DENIED)
	s.watch(2, b.GetSessionId(), 0)
	requireEvent(t, s.next(), 2, fencerv1.WatchLeaseResponse_TYPE_SYNCED, "")
	// Bob tries to keep alice's session alive past its TTL.
	s.renew(a.GetSessionId())
	requireRenewFailed(t, s.next(), a.GetSessionId(), fencerv1.ErrorReason_ERROR_REASON_PERMISSION_DENIED)
	for end := time.Now().Add(time.Duration(ttl+1) * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		s.renew(a.GetSessionId())
		m := s.next()
		require.Equal(t, a.GetSessionId(), m.GetRenewFailed().GetSessionId(), "bob renewed alice's session: %v", m)
		s.renew(b.GetSessionId())
		requireRenewed(t, s.next(), b.GetSessionId())
	}
	require.Eventually(t, func() bool {
		_, err := arpc.Check(ctx, &fencerv1.CheckRequest{Token: a.GetToken()})
		return status.Code(err) == codes.FailedPrecondition
	}, 5*time.Second, 50*time.Millisecond, "alice's session outlived its TTL under bob's renewals")
	// Alice's end reached no watch of bob's; bob's loss reaches his.
	_, err = brpc.Release(ctx, &fencerv1.ReleaseRequest{Target: &fencerv1.ReleaseRequest_Token{Token: b.GetToken()}})
	require.NoError(t, err)
	requireEvent(t, s.next(), 2, fencerv1.WatchLeaseResponse_TYPE_LOST, b.GetToken())
}

// TestSessionsRefusesMalformedRequests: each malformed request ends the
// stream with INVALID_ARGUMENT naming the field, and changes nothing: the
// session it named is still renewed on another stream.
func TestSessionsRefusesMalformedRequests(t *testing.T) {
	ctx := fencertest.Context(t)
	addr, _ := startServer(t, fencertest.SharedStore(t))
	rpc := fencerv1.NewFencerServiceClient(dial(t, alice, addr))
	a, err := rpc.Acquire(ctx, &fencerv1.AcquireRequest{Name: "malformed", TtlSeconds: 30})
	require.NoError(t, err)
	id := a.GetSessionId()
	cases := map[string]struct {
		field string
		send  func(s *sessionsStream)
	}{
		"no request":            {"request", func(s *sessionsStream) { s.send(&fencerv1.SessionsRequest{}) }},
		"renew of session 0":    {"renew.session_id", func(s *sessionsStream) { s.renew(0) }},
		"watch id 0":            {"watch.watch_id", func(s *sessionsStream) { s.watch(0, id, 0) }},
		"negative watch id":     {"watch.watch_id", func(s *sessionsStream) { s.watch(-1, id, 0) }},
		"watch of session 0":    {"watch.watch.session_id", func(s *sessionsStream) { s.watch(1, 0, 0) }},
		"negative start":        {"watch.watch.start_revision", func(s *sessionsStream) { s.watch(1, id, -5) }},
		"unwatch of watch id 0": {"unwatch.watch_id", func(s *sessionsStream) { s.unwatch(0) }},
		"watch with no watch": {"watch.watch.session_id", func(s *sessionsStream) {
			s.send(&fencerv1.SessionsRequest{Request: &fencerv1.SessionsRequest_Watch{Watch: &fencerv1.SessionsWatch{WatchId: 1}}})
		}},
		"watch id already live": {"watch.watch_id", func(s *sessionsStream) {
			s.watch(7, id, 0)
			requireEvent(t, s.next(), 7, fencerv1.WatchLeaseResponse_TYPE_SYNCED, "")
			s.watch(7, id, 0)
		}},
		"watch id below one used": {"watch.watch_id", func(s *sessionsStream) {
			s.watch(7, id, 0)
			requireEvent(t, s.next(), 7, fencerv1.WatchLeaseResponse_TYPE_SYNCED, "")
			s.unwatch(7)
			s.watch(6, id, 0)
		}},
		"watch id reused after its unwatch": {"watch.watch_id", func(s *sessionsStream) {
			s.watch(7, id, 0)
			requireEvent(t, s.next(), 7, fencerv1.WatchLeaseResponse_TYPE_SYNCED, "")
			s.unwatch(7)
			s.watch(7, id, 0)
		}},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			s := openSessions(t, ctx, rpc)
			s.t = t
			c.send(s)
			err := s.end()
			require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
			require.Equal(t, c.field, errorInfo(t, err).GetMetadata()["field"], "%v", err)
		})
	}
	s := openSessions(t, ctx, rpc)
	s.renew(id)
	requireRenewed(t, s.next(), id)
}

// TestSessionsWatchFromARevisionAndUnwatch: a watch from an earlier
// revision hears the losses since; after an unwatch (and the answer to a
// later request, which the server handles in order) nothing more of it
// comes; a start beyond the store's next revision ends that watch alone.
func TestSessionsWatchFromARevisionAndUnwatch(t *testing.T) {
	ctx := fencertest.Context(t)
	addr, _ := startServer(t, fencertest.SharedStore(t))
	rpc := fencerv1.NewFencerServiceClient(dial(t, alice, addr))
	a, err := rpc.Acquire(ctx, &fencerv1.AcquireRequest{Name: "replayed", TtlSeconds: 30})
	require.NoError(t, err)
	tok := mustParse(t, a.GetToken())
	_, err = rpc.Release(ctx, &fencerv1.ReleaseRequest{Target: &fencerv1.ReleaseRequest_Token{Token: a.GetToken()}})
	require.NoError(t, err)
	s := openSessions(t, ctx, rpc)
	s.watch(1, a.GetSessionId(), tok.Revision)
	requireEvent(t, s.next(), 1, fencerv1.WatchLeaseResponse_TYPE_SYNCED, "")
	requireEvent(t, s.next(), 1, fencerv1.WatchLeaseResponse_TYPE_LOST, a.GetToken())

	s.watch(2, a.GetSessionId(), 1<<40)
	requireWatchEnded(t, s.next(), 2, codes.InvalidArgument, fencerv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT)

	s.unwatch(1)
	s.unwatch(99) // never watched: ignored
	s.renew(a.GetSessionId())
	requireRenewed(t, s.next(), a.GetSessionId())
	b, err := rpc.Acquire(ctx, &fencerv1.AcquireRequest{Name: "replayed-2", SessionId: a.GetSessionId()})
	require.NoError(t, err)
	_, err = rpc.Release(ctx, &fencerv1.ReleaseRequest{Target: &fencerv1.ReleaseRequest_Token{Token: b.GetToken()}})
	require.NoError(t, err)
	s.quiet(time.Second)
	s.watch(3, a.GetSessionId(), mustParse(t, b.GetToken()).Revision) // ids are never reused
	requireEvent(t, s.next(), 3, fencerv1.WatchLeaseResponse_TYPE_SYNCED, "")
	requireEvent(t, s.next(), 3, fencerv1.WatchLeaseResponse_TYPE_LOST, b.GetToken())
}

// TestSessionsStreamEndsOnShutdown: Shutdown ends a Sessions stream with
// live watches at once with SHUTTING_DOWN.
func TestSessionsStreamEndsOnShutdown(t *testing.T) {
	ctx := fencertest.Context(t)
	addr, srv := startServer(t, fencertest.SharedStore(t))
	rpc := fencerv1.NewFencerServiceClient(dial(t, alice, addr))
	a, err := rpc.Acquire(ctx, &fencerv1.AcquireRequest{Name: "shutdown-sessions"})
	require.NoError(t, err)
	s := openSessions(t, ctx, rpc)
	s.watch(1, a.GetSessionId(), 0)
	requireEvent(t, s.next(), 1, fencerv1.WatchLeaseResponse_TYPE_SYNCED, "")
	sctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	start := time.Now()
	require.NoError(t, srv.Shutdown(sctx), "the Sessions stream held graceful shutdown")
	err = s.end()
	require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	require.Equal(t, fencerv1.ErrorReason_ERROR_REASON_SHUTTING_DOWN.Reason(), errorInfo(t, err).GetReason())
	require.Less(t, time.Since(start), 2*time.Second)
}

// TestSessionsStreamRunsOnTwoGoroutines: a stream with 100 live watches
// costs the server two goroutines, not one per watch.
func TestSessionsStreamRunsOnTwoGoroutines(t *testing.T) {
	ctx := fencertest.Context(t)
	addr, _ := startServer(t, fencertest.SharedStore(t))
	rpc := fencerv1.NewFencerServiceClient(dial(t, alice, addr))
	a, err := rpc.Acquire(ctx, &fencerv1.AcquireRequest{Name: "two-goroutines"})
	require.NoError(t, err)
	s := openSessions(t, ctx, rpc)
	s.watch(1, a.GetSessionId(), 0) // starts the server's shared watches
	requireEvent(t, s.next(), 1, fencerv1.WatchLeaseResponse_TYPE_SYNCED, "")
	time.Sleep(100 * time.Millisecond)
	base := runtime.NumGoroutine()
	const n = 100
	for i := 1; i < n; i++ {
		s.watch(int64(i+1), a.GetSessionId(), 0)
		requireEvent(t, s.next(), int64(i+1), fencerv1.WatchLeaseResponse_TYPE_SYNCED, "")
	}
	require.Equal(t, 2, goroutinesIn(t, "server.(*Server).Sessions"), "goroutines in the Sessions handler, or started by it")
	require.Eventually(t, func() bool { return runtime.NumGoroutine()-base <= 5 }, 5*time.Second, 20*time.Millisecond,
		"%d watches on one stream, %d more goroutines", n, runtime.NumGoroutine()-base)
}

func mustParse(t *testing.T, s string) token.Token {
	t.Helper()
	tok, err := token.Parse(s)
	require.NoError(t, err)
	return tok
}

// TestSessionsStreamHoldsBackAClientThatDoesNotRead: a client that sends
// renewals and reads none of the answers is held back by flow control:
// the server stops reading its requests rather than queue answers without
// bound, and the stream still ends on Shutdown.
func TestSessionsStreamHoldsBackAClientThatDoesNotRead(t *testing.T) {
	ctx := fencertest.Context(t)
	addr, srv := startServer(t, fencertest.SharedStore(t))
	rpc := fencerv1.NewFencerServiceClient(dial(t, alice, addr))
	a, err := rpc.Acquire(ctx, &fencerv1.AcquireRequest{Name: "unread", TtlSeconds: 30})
	require.NoError(t, err)
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := rpc.Sessions(sctx)
	require.NoError(t, err)
	var sent atomic.Int64
	go func() {
		req := &fencerv1.SessionsRequest{Request: &fencerv1.SessionsRequest_Renew{Renew: &fencerv1.KeepAliveRequest{SessionId: a.GetSessionId()}}}
		for st.Send(req) == nil {
			sent.Add(1)
		}
	}()
	prev, still := int64(-1), time.Now()
	require.Eventually(t, func() bool {
		if n := sent.Load(); n != prev {
			prev, still = n, time.Now()
		}
		return time.Since(still) > time.Second
	}, 60*time.Second, 50*time.Millisecond, "the server read every request of a client that reads nothing")
	t.Logf("the client's sends stalled after %d renewals", sent.Load())
	require.Equal(t, 2, goroutinesIn(t, "server.(*Server).Sessions"))
	// The handler, held in Send, returns at once; the connection, whose
	// unread replies hold the stream's status back, closes at the grace.
	shutdown, scancel := context.WithTimeout(ctx, 3*time.Second)
	defer scancel()
	go func() { _ = srv.Shutdown(shutdown) }()
	require.Eventually(t, func() bool { return goroutinesIn(t, "server.(*Server).Sessions") == 0 }, 2*time.Second, 20*time.Millisecond,
		"the Sessions handler of a client that reads nothing still runs after Shutdown")
}

// TestSessionsRenewalsDoNotWaitForWatchStarts: a renewal sent right
// after a burst of watch starts is answered before the burst has
// started: watch starts wait in a queue of their own, and run side by
// side (their SYNCED events come in any order).
func TestSessionsRenewalsDoNotWaitForWatchStarts(t *testing.T) {
	ctx := fencertest.Context(t)
	addr, _ := startServer(t, fencertest.SharedStore(t))
	rpc := fencerv1.NewFencerServiceClient(dial(t, alice, addr))
	a, err := rpc.Acquire(ctx, &fencerv1.AcquireRequest{Name: "burst", TtlSeconds: 30})
	require.NoError(t, err)
	s := openSessions(t, ctx, rpc)
	s.renew(a.GetSessionId())
	requireRenewed(t, s.next(), a.GetSessionId())
	const n = 1000
	for i := range n {
		s.watch(int64(i+1), a.GetSessionId(), 0)
	}
	s.renew(a.GetSessionId())
	synced := 0
	for {
		m := s.next()
		if m.GetRenewed() != nil {
			break
		}
		require.Equal(t, fencerv1.WatchLeaseResponse_TYPE_SYNCED, m.GetEvent().GetEvent().GetType(), "%v", m)
		synced++
	}
	t.Logf("the renewal was answered after %d of %d watches had started", synced, n)
	require.Less(t, synced, n, "the renewal waited for every watch start before it")
}
