package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/status"

	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
)

// Sessions implements FencerService.Sessions: the renewals and lease
// watches of many sessions on one stream. A stream costs two goroutines
// however many sessions it carries: this handler, which sends, and one
// that receives and runs each request in turn (renewals, and the reads
// that start a watch). The watches are the same subscriptions to the
// lease hub and the session watch as WatchLease's; they tell the stream
// which of them has news through their notify hooks, so no goroutine
// waits per watch.
func (s *Server) Sessions(stream fencerv1.FencerService_SessionsServer) error {
	ctx := stream.Context()
	g, ungate, err := s.gate(ctx)
	if err != nil {
		return err
	}
	defer ungate()
	m := &sessionsStream{s: s, ctx: ctx, principal: principalOf(ctx), wake: make(chan struct{}, 1), room: make(chan struct{}, 1),
		watches: map[int64]*streamWatch{}, verified: map[clientv3.LeaseID]bool{}}
	defer m.close()
	received := make(chan error, 1)
	// The receiver returns once this handler has: gRPC then ends the
	// stream's context, which ends its Recv and any etcd call it runs.
	go func() { received <- m.receive(stream) }()
	send := func(msg *fencerv1.SessionsResponse) error {
		return g.call(func() error { return stream.Send(msg) })
	}
	for {
		select {
		case <-s.stopped.Done():
			return ErrShuttingDown
		case <-ctx.Done():
			return ctx.Err()
		case err := <-received:
			if errors.Is(err, io.EOF) {
				// The client is done asking: it gets what it was
				// answered, and the stream ends.
				return m.flush(send)
			}
			return err
		case <-m.wake:
		}
		if err := m.flush(send); err != nil {
			return err
		}
	}
}

// Bounds of one Sessions stream.
const (
	// MaxStreamWatches is the most live watches a Sessions stream may
	// have; a watch beyond it ends at once with INVALID_ARGUMENT (field
	// watch.watch_id), the stream and its other watches going on.
	MaxStreamWatches = 1 << 16
	// maxPendingReplies is the most replies a Sessions stream queues
	// for a client that does not read them: past it the server stops
	// reading the stream's requests until the client reads, so that
	// gRPC's flow control holds the client back.
	maxPendingReplies = 1024
)

// sessionsStream is the state of one Sessions stream. Its receiver adds
// to out and to watches; its handler sends.
type sessionsStream struct {
	s         *Server
	ctx       context.Context
	principal string
	wake      chan struct{} // signalled when out or ready has something
	room      chan struct{} // signalled when the handler has taken out

	// Only the receiver uses verified: sessions found to be the
	// principal's, as KeepAlive keeps them.
	verified map[clientv3.LeaseID]bool

	mu      sync.Mutex
	closed  bool                         // the handler has returned
	out     []*fencerv1.SessionsResponse // replies to send, in order
	watches map[int64]*streamWatch       // the live watches, by watch_id
	ready   []*streamWatch               // watches that may have news
}

// streamWatch is one lease watch of a Sessions stream.
type streamWatch struct {
	id int64 // the watch_id
	w  *leaseWatch

	// Guarded by the stream's mu:
	live   bool // in the stream's watches; whoever clears it closes w
	marked bool // in the stream's ready list
}

// mark puts sw on the ready list and wakes the handler. It is sw's
// leaseWatch's notify hook, so it only signals.
func (m *sessionsStream) mark(sw *streamWatch) {
	m.mu.Lock()
	if sw.live && !sw.marked {
		sw.marked = true
		m.ready = append(m.ready, sw)
	}
	m.mu.Unlock()
	signal(m.wake)
}

// reply queues msg to be sent and wakes the handler.
func (m *sessionsStream) reply(msg *fencerv1.SessionsResponse) {
	m.awaitRoom()
	m.mu.Lock()
	m.out = append(m.out, msg)
	m.mu.Unlock()
	signal(m.wake)
}

// awaitRoom waits while maxPendingReplies replies wait to be sent, or
// until the stream ends. Only the receiver queues replies, so there is
// room for one when it returns.
func (m *sessionsStream) awaitRoom() {
	for {
		m.mu.Lock()
		full := len(m.out) >= maxPendingReplies && !m.closed
		m.mu.Unlock()
		if !full {
			return
		}
		select {
		case <-m.room:
		case <-m.ctx.Done():
			return
		}
	}
}

// flush sends the queued replies, then each ready watch's events, ending a
// watch whose session or feed ended with its watch_ended.
func (m *sessionsStream) flush(send func(*fencerv1.SessionsResponse) error) error {
	m.mu.Lock()
	out, ready := m.out, m.ready
	m.out, m.ready = nil, nil
	for _, sw := range ready {
		sw.marked = false
	}
	m.mu.Unlock()
	signal(m.room)
	for _, msg := range out {
		if err := send(msg); err != nil {
			return err
		}
	}
	for _, sw := range ready {
		for {
			m.mu.Lock()
			live := sw.live
			m.mu.Unlock()
			if !live {
				break
			}
			ev, err := m.s.nextLeaseEvent(m.ctx, sw.w)
			if err != nil {
				if m.end(sw) {
					if err := send(&fencerv1.SessionsResponse{Response: &fencerv1.SessionsResponse_WatchEnded{
						WatchEnded: &fencerv1.SessionsWatchEnded{WatchId: sw.id, Error: sessionsError(err)},
					}}); err != nil {
						return err
					}
				}
				break
			}
			if ev == nil {
				break
			}
			if err := send(&fencerv1.SessionsResponse{Response: &fencerv1.SessionsResponse_Event{
				Event: &fencerv1.SessionsWatchEvent{WatchId: sw.id, Event: ev},
			}}); err != nil {
				return err
			}
		}
	}
	return nil
}

// end takes sw off the stream and closes its watch, unless that was done
// already; it reports whether it did.
func (m *sessionsStream) end(sw *streamWatch) bool {
	m.mu.Lock()
	live := sw.live
	if live {
		sw.live = false
		delete(m.watches, sw.id)
	}
	m.mu.Unlock()
	if live {
		m.s.closeLeaseWatch(sw.w)
	}
	return live
}

// close ends every watch of the stream, and any the receiver starts later.
func (m *sessionsStream) close() {
	m.mu.Lock()
	m.closed = true
	watches := make([]*streamWatch, 0, len(m.watches))
	for _, sw := range m.watches {
		watches = append(watches, sw)
	}
	m.mu.Unlock()
	for _, sw := range watches {
		m.end(sw)
	}
}

// receive runs the stream's requests in the order they come, until Recv
// fails, a request is malformed, or the credentials are withdrawn; its
// error ends the stream.
func (m *sessionsStream) receive(stream fencerv1.FencerService_SessionsServer) error {
	for {
		req, err := stream.Recv()
		if err != nil {
			return err
		}
		if err := validateSessions(req); err != nil {
			return err
		}
		switch r := req.GetRequest().(type) {
		case *fencerv1.SessionsRequest_Renew:
			err = m.renew(clientv3.LeaseID(r.Renew.GetSessionId()))
		case *fencerv1.SessionsRequest_Watch:
			err = m.watch(r.Watch.GetWatchId(), r.Watch.GetWatch())
		case *fencerv1.SessionsRequest_Unwatch:
			m.unwatch(r.Unwatch.GetWatchId())
		}
		if err != nil {
			return err
		}
		if cause := revoked(m.ctx); cause != nil {
			return cause
		}
	}
}

// renew renews session id as a KeepAlive request does, and queues its
// answer: renewed, or renew_failed with the status KeepAlive's stream
// would have ended with.
func (m *sessionsStream) renew(id clientv3.LeaseID) error {
	err := m.verify(id)
	var resp *clientv3.LeaseKeepAliveResponse
	if err == nil {
		resp, err = m.s.cli.KeepAliveOnce(m.ctx, id)
		if cause := revoked(m.ctx); cause != nil {
			return cause
		}
		if err != nil {
			m.s.m.keepAliveFailed(m.ctx, err)
		}
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			err = ErrSessionNotFound
		} else if err != nil {
			err = fmt.Errorf("server: keepalive: %w", err)
		}
	}
	if err != nil {
		m.reply(&fencerv1.SessionsResponse{Response: &fencerv1.SessionsResponse_RenewFailed{
			RenewFailed: &fencerv1.SessionsRenewFailed{SessionId: int64(id), Error: sessionsError(err)},
		}})
		return nil
	}
	m.s.m.keepalives.Inc()
	m.reply(&fencerv1.SessionsResponse{Response: &fencerv1.SessionsResponse_Renewed{
		Renewed: &fencerv1.KeepAliveResponse{SessionId: int64(id), TtlSeconds: resp.TTL},
	}})
	return nil
}

// verify checks once per stream that session id is the principal's, as
// KeepAlive does.
func (m *sessionsStream) verify(id clientv3.LeaseID) error {
	if m.verified[id] {
		return nil
	}
	if _, err := m.s.checkSession(m.ctx, id, m.principal); err != nil {
		if !errors.Is(err, ErrPermissionDenied) {
			m.s.m.keepAliveFailed(m.ctx, err)
		}
		return err
	}
	if len(m.verified) >= 1024 {
		clear(m.verified)
	}
	m.verified[id] = true
	return nil
}

// watch starts watch id of req's session, or ends it at once with the
// error that would have ended its WatchLease stream. A watch_id that is
// live on the stream already is the client's fault: it ends the stream.
func (m *sessionsStream) watch(id int64, req *fencerv1.WatchLeaseRequest) error {
	m.mu.Lock()
	_, taken := m.watches[id]
	full := len(m.watches) >= MaxStreamWatches
	m.mu.Unlock()
	if taken {
		return invalidArg("watch.watch_id", strconv.FormatInt(id, 10), "is a live watch of this stream")
	}
	sw := &streamWatch{id: id}
	var w *leaseWatch
	err := invalidArg("watch.watch_id", strconv.FormatInt(id, 10), fmt.Sprintf("the stream has %d live watches, the most it may have", MaxStreamWatches))
	if !full {
		w, err = m.s.openLeaseWatch(m.ctx, req, func() { m.mark(sw) })
	}
	if err != nil {
		m.reply(&fencerv1.SessionsResponse{Response: &fencerv1.SessionsResponse_WatchEnded{
			WatchEnded: &fencerv1.SessionsWatchEnded{WatchId: id, Error: sessionsError(err)},
		}})
		return nil
	}
	sw.w = w
	m.awaitRoom()
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		m.s.closeLeaseWatch(w)
		return nil
	}
	// SYNCED goes out before any event of the watch: both leave under the
	// same lock, replies first. Hooks that fired before the watch went
	// live were dropped; marking it now looks at what they announced.
	sw.live, sw.marked = true, true
	m.watches[id] = sw
	m.out = append(m.out, &fencerv1.SessionsResponse{Response: &fencerv1.SessionsResponse_Event{
		Event: &fencerv1.SessionsWatchEvent{WatchId: id, Event: w.synced()},
	}})
	m.ready = append(m.ready, sw)
	m.mu.Unlock()
	signal(m.wake)
	return nil
}

// unwatch ends watch id, if it is live: the handler sends no more of its
// messages, but for one it may be sending as this runs (the client drops
// messages of watches it has left).
func (m *sessionsStream) unwatch(id int64) {
	m.mu.Lock()
	sw := m.watches[id]
	m.mu.Unlock()
	if sw != nil {
		m.end(sw)
	}
}

// sessionsError is err as the status a call would end with (toStatus),
// carried in a Sessions message.
func sessionsError(err error) *fencerv1.SessionsError {
	st := status.Convert(toStatus(err))
	e := &fencerv1.SessionsError{Code: int32(st.Code()), Message: st.Message()}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == fencerv1.ErrorDomain {
			e.Reason, e.Metadata = info.GetReason(), info.GetMetadata()
		}
	}
	return e
}
