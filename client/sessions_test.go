package client

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
	"github.com/fencer-dev/fencer/token"
)

// stuckServer answers Acquire, and holds every Send of a Sessions stream
// as gRPC's flow control holds it when the server reads nothing.
type stuckServer struct {
	fencerv1.FencerServiceClient // nil: any other method panics
	sends                        chan struct{}
}

func (s *stuckServer) Acquire(_ context.Context, req *fencerv1.AcquireRequest, _ ...grpc.CallOption) (*fencerv1.AcquireResponse, error) {
	return &fencerv1.AcquireResponse{SessionId: 7, TtlSeconds: req.GetTtlSeconds(), Token: token.Token{Lease: req.GetName(), Epoch: 1, Revision: 2}.String(), Holder: "p/7"}, nil
}

func (s *stuckServer) Release(context.Context, *fencerv1.ReleaseRequest, ...grpc.CallOption) (*fencerv1.ReleaseResponse, error) {
	return &fencerv1.ReleaseResponse{}, nil
}

func (s *stuckServer) Sessions(ctx context.Context, _ ...grpc.CallOption) (grpc.BidiStreamingClient[fencerv1.SessionsRequest, fencerv1.SessionsResponse], error) {
	return &stuckStream{ctx: ctx, sends: s.sends}, nil
}

type stuckStream struct {
	grpc.ClientStream // nil: any other method panics
	ctx               context.Context
	sends             chan struct{}
}

func (s *stuckStream) Send(*fencerv1.SessionsRequest) error {
	s.sends <- struct{}{}
	<-s.ctx.Done()
	return errors.New("stuck: the stream ended")
}

func (s *stuckStream) Recv() (*fencerv1.SessionsResponse, error) {
	<-s.ctx.Done()
	return nil, status.FromContextError(s.ctx.Err()).Err()
}

// TestSessionEndsAtItsDeadlineWhileItsRenewalCannotBeSent: a renewal
// whose Send flow control holds does not hold the session's deadline: the
// session ends when its TTL has passed without a renewal.
func TestSessionEndsAtItsDeadlineWhileItsRenewalCannotBeSent(t *testing.T) {
	srv := &stuckServer{sends: make(chan struct{}, 16)}
	c := &Client{rpc: srv, clock: realClock{}, puts: &putBatcher{rpc: srv}, sessions: &sessionsMux{rpc: srv}}
	s, err := c.NewSession(WithTTL(time.Second))
	require.NoError(t, err)
	defer func() {
		closed := make(chan struct{})
		go func() {
			_ = s.Close(context.Background())
			close(closed)
		}()
		select {
		case <-closed:
		case <-time.After(5 * time.Second):
			t.Error("Close did not return")
		}
	}()
	l, err := s.Acquire(context.Background(), "stuck")
	require.NoError(t, err)
	select {
	case <-srv.sends:
	case <-time.After(5 * time.Second):
		t.Fatal("no request reached the stream")
	}
	select {
	case <-l.Done():
	case <-time.After(3 * time.Second):
		t.Fatal("the lease outlived its session's TTL while the renewal's Send was held")
	}
	require.ErrorIs(t, l.Err(), token.ErrSessionExpired)
}

// downServer answers Acquire, and fails every Sessions stream at once
// with UNAVAILABLE, as while the connection is down.
type downServer struct {
	stuckServer
}

func (s *downServer) Sessions(ctx context.Context, _ ...grpc.CallOption) (grpc.BidiStreamingClient[fencerv1.SessionsRequest, fencerv1.SessionsResponse], error) {
	return nil, status.Error(codes.Unavailable, "down: connection refused")
}

// backoffConn counts ResetConnectBackoff calls.
type backoffConn struct {
	grpc.ClientConnInterface // nil: never called
	resets                   atomic.Int64
}

func (c *backoffConn) ResetConnectBackoff() { c.resets.Add(1) }

// TestFailedRenewalResetsTheConnectBackoff: after a renewal fails, the
// session's next attempt first asks the connection to reconnect at once,
// so gRPC's reconnect backoff does not outlast the session's deadline.
func TestFailedRenewalResetsTheConnectBackoff(t *testing.T) {
	srv := &downServer{}
	cc := &backoffConn{}
	c := &Client{cc: cc, rpc: srv, clock: realClock{}, puts: &putBatcher{rpc: srv}, sessions: &sessionsMux{rpc: srv}}
	s, err := c.NewSession(WithTTL(3 * time.Second))
	require.NoError(t, err)
	defer func() { _ = s.Close(context.Background()) }()
	_, err = s.Acquire(context.Background(), "down")
	require.NoError(t, err)
	require.Eventually(t, func() bool { return cc.resets.Load() >= 2 }, 3*time.Second, 10*time.Millisecond,
		"failed renewals did not reset the connection's backoff")
}

// TestNoStreamOpensWithoutASession: once the last session has ended, a
// goroutine of it still on its way out cannot open a Sessions stream
// that would outlive every session.
func TestNoStreamOpensWithoutASession(t *testing.T) {
	m := &sessionsMux{rpc: &stuckServer{sends: make(chan struct{}, 1)}}
	_, err := m.stream()
	require.ErrorIs(t, err, errNoSessions)
	m.use()
	ms, err := m.stream()
	require.NoError(t, err)
	m.release()
	require.True(t, ms.ended(), "the stream outlived the last session")
	_, err = m.stream()
	require.ErrorIs(t, err, errNoSessions)
}

// TestAGivenUpRenewalIsNeverSent: a renewal still queued when its session
// gives it up (deadline passed) leaves the queue, so that a stream that
// opens later does not renew a session its client has ended.
func TestAGivenUpRenewalIsNeverSent(t *testing.T) {
	srv := &stuckServer{sends: make(chan struct{}, 16)}
	m := &sessionsMux{rpc: srv}
	m.use()
	defer m.release()
	ms, err := m.stream()
	require.NoError(t, err)
	first := make(chan error, 1)
	go func() {
		_, err := ms.renew(context.Background(), 1, nil)
		first <- err
	}()
	<-srv.sends // the first renewal's Send is held; the next one waits in the queue
	expire := make(chan time.Time, 1)
	expire <- time.Now()
	_, err = ms.renew(context.Background(), 2, expire)
	require.ErrorIs(t, err, errExpired)
	ms.mu.Lock()
	queued := len(ms.queue)
	ms.mu.Unlock()
	require.Zero(t, queued, "the given-up renewal is still queued to be sent")
}

// TestAWatchThatFallsBehindEnds: a watch whose session takes its events
// too slowly ends after the events it holds, so the session watches again
// from the last one it took; its client's memory stays bounded.
func TestAWatchThatFallsBehindEnds(t *testing.T) {
	ms := &muxStream{done: make(chan struct{}), queued: make(chan struct{}, 1), renews: map[int64]chan renewResult{}, watches: map[int64]*muxWatch{}}
	w := ms.startWatch(context.Background(), &fencerv1.WatchLeaseRequest{SessionId: 1})
	for i := range maxWatchEvents + 10 {
		w.put(&fencerv1.WatchLeaseResponse{Type: fencerv1.WatchLeaseResponse_TYPE_PROGRESS, Revision: int64(i)}, nil)
	}
	for i := range maxWatchEvents {
		ev, err := w.Recv()
		require.NoError(t, err)
		require.EqualValues(t, i, ev.GetRevision())
	}
	_, err := w.Recv()
	require.ErrorIs(t, err, errWatchFellBehind)
	require.Eventually(t, func() bool {
		ms.mu.Lock()
		defer ms.mu.Unlock()
		return len(ms.watches) == 0 && len(ms.queue) == 2 // the watch, then its unwatch
	}, time.Second, time.Millisecond, "the watch was not left on the server")
}
