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
	"google.golang.org/grpc/status"

	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
)

// Sessions implements FencerService.Sessions: the renewals and lease
// watches of many sessions on one stream. A stream at rest costs two
// goroutines however many sessions it carries: this handler, which
// sends, and one that receives. The receiver hands each renewal, and the
// reads that start a watch, to short-lived goroutines, at most
// maxStreamCalls of each at a time, so that renewals do not queue behind
// each other or behind a burst of watches; a watch started before the lease
// hub's buffer catches up on a goroutine of its own (leaseHub.catchUp).
// The watches are the same subscriptions to the lease hub and the session
// watch as WatchLease's; they tell the stream which of them has news
// through their notify hooks, so no goroutine waits per watch.
func (s *Server) Sessions(stream fencerv1.FencerService_SessionsServer) error {
	ctx := stream.Context()
	g, ungate, err := s.gate(ctx)
	if err != nil {
		return err
	}
	defer ungate()
	m := &sessionsStream{s: s, ctx: ctx, principal: principalOf(ctx), wake: make(chan struct{}, 1), room: make(chan struct{}, 1), slots: make(chan struct{}, maxStreamCalls),
		watches: map[int64]*streamWatch{}, verified: map[clientv3.LeaseID]bool{}}
	defer m.close()
	received := make(chan error, 1)
	// The receiver returns at the client's half-close or a malformed
	// request, or else once this handler has returned: gRPC then ends the
	// stream's context, which ends its Recv and its calls' etcd requests.
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
	// for a client that does not read them (give or take the calls in
	// flight): past it the server stops reading the stream's requests
	// until the client reads, so that gRPC's flow control holds the
	// client back.
	maxPendingReplies = 1024
	// maxStreamCalls is the most renewals, and apart the most watch
	// starts, a Sessions stream runs at a time. The receiver waits for a
	// free renewal; watch starts wait in a queue.
	maxStreamCalls = 16
)

// sessionsStream is the state of one Sessions stream. The receiver and
// its calls add to out and to watches, the watches' hooks to ready; the
// handler sends, and ends watches whose session or feed ended.
type sessionsStream struct {
	s         *Server
	ctx       context.Context
	principal string
	wake      chan struct{} // signalled when out or ready has something
	room      chan struct{} // signalled when the handler has taken out
	slots     chan struct{} // one per call in flight, at most maxStreamCalls
	calls     sync.WaitGroup

	vmu      sync.Mutex
	verified map[clientv3.LeaseID]bool // sessions found to be the principal's, as KeepAlive keeps them

	mu       sync.Mutex
	closed   bool                         // the handler has returned
	out      []*fencerv1.SessionsResponse // replies to send, in order
	watches  map[int64]*streamWatch       // the watches starting or live, by watch_id
	lastID   int64                        // the highest watch_id the stream has used
	ready    []*streamWatch               // watches that may have news
	starts   []func()                     // watch starts waiting for a starter
	starters int                          // goroutines running watch starts
}

// streamWatch is one lease watch of a Sessions stream.
type streamWatch struct {
	id int64 // the watch_id
	w  *leaseWatch

	// Guarded by the stream's mu:
	live      bool // started and in the stream's watches; whoever clears it closes w
	cancelled bool // ended (unwatch, the stream's end) while it started: its starter closes w
	marked    bool // in the stream's ready list
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
// until the stream ends.
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
					if err := send(watchEnded(sw.id, err)); err != nil {
						return err
					}
				}
				break
			}
			if ev == nil {
				break
			}
			if err := send(watchEvent(sw.id, ev)); err != nil {
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

// close ends every watch of the stream, and any that starts later.
func (m *sessionsStream) close() {
	m.mu.Lock()
	m.closed = true
	live := make([]*streamWatch, 0, len(m.watches))
	for _, sw := range m.watches {
		if sw.live {
			live = append(live, sw)
		} else {
			sw.cancelled = true
		}
	}
	m.mu.Unlock()
	for _, sw := range live {
		m.end(sw)
	}
}

// receive reads the stream's requests and starts each, in the order they
// come, until Recv fails or a request is malformed; its error ends the
// stream. It returns once the calls it started have returned.
func (m *sessionsStream) receive(stream fencerv1.FencerService_SessionsServer) error {
	defer m.calls.Wait()
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
			id := clientv3.LeaseID(r.Renew.GetSessionId())
			m.call(func() { m.renew(id) })
		case *fencerv1.SessionsRequest_Watch:
			sw, err := m.startWatch(r.Watch.GetWatchId())
			if err != nil {
				return err
			}
			if sw != nil {
				w := r.Watch.GetWatch()
				m.queueWatch(func() { m.openWatch(sw, w) })
			}
		case *fencerv1.SessionsRequest_Unwatch:
			m.unwatch(r.Unwatch.GetWatchId())
		}
	}
}

// queueWatch runs f, a watch's start, on one of at most maxStreamCalls
// short-lived goroutines, in the order queued, without making the
// receiver wait: renewals read after a burst of watches do not wait for
// them. The queue holds at most a start per watch the stream has
// (MaxStreamWatches); starts still queued when the stream ends are
// dropped.
func (m *sessionsStream) queueWatch(f func()) {
	m.mu.Lock()
	if m.starters == maxStreamCalls {
		m.starts = append(m.starts, f)
		m.mu.Unlock()
		return
	}
	m.starters++
	m.mu.Unlock()
	m.calls.Add(1)
	go func() {
		defer m.calls.Done()
		for f != nil {
			f()
			m.mu.Lock()
			f = nil
			if len(m.starts) > 0 && !m.closed {
				f = m.starts[0]
				m.starts[0] = nil
				m.starts = m.starts[1:]
			} else {
				m.starters--
			}
			m.mu.Unlock()
		}
	}()
}

// call runs f, a renewal, on a goroutine of its own once fewer than
// maxStreamCalls run, or drops it if the stream ends first. Its etcd
// calls grow that short-lived goroutine's stack, not the receiver's (see
// apart).
func (m *sessionsStream) call(f func()) {
	select {
	case m.slots <- struct{}{}:
	case <-m.ctx.Done():
		return
	}
	m.calls.Add(1)
	go func() {
		defer func() {
			<-m.slots
			m.calls.Done()
		}()
		f()
	}()
}

// renew renews session id as a KeepAlive request does, and queues its
// answer: renewed, or renew_failed with the status KeepAlive's stream
// would have ended with. When the credentials are withdrawn meanwhile,
// the stream ends (the handler sees its context end) and the answer is
// not sent.
func (m *sessionsStream) renew(id clientv3.LeaseID) {
	err := m.verify(id)
	var resp *clientv3.LeaseKeepAliveResponse
	if err == nil {
		resp, err = m.s.cli.KeepAliveOnce(m.ctx, id)
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
		return
	}
	m.s.m.keepalives.Inc()
	m.reply(&fencerv1.SessionsResponse{Response: &fencerv1.SessionsResponse_Renewed{
		Renewed: &fencerv1.KeepAliveResponse{SessionId: int64(id), TtlSeconds: resp.TTL},
	}})
}

// verify checks once per stream that session id is the principal's, as
// KeepAlive does.
func (m *sessionsStream) verify(id clientv3.LeaseID) error {
	m.vmu.Lock()
	ok := m.verified[id]
	m.vmu.Unlock()
	if ok {
		return nil
	}
	if _, err := m.s.checkSession(m.ctx, id, m.principal); err != nil {
		if !errors.Is(err, ErrPermissionDenied) {
			m.s.m.keepAliveFailed(m.ctx, err)
		}
		return err
	}
	m.vmu.Lock()
	if len(m.verified) >= 1024 {
		clear(m.verified)
	}
	m.verified[id] = true
	m.vmu.Unlock()
	return nil
}

// startWatch registers watch id as starting, or ends it at once when the
// stream has MaxStreamWatches watches already (and returns nil). A
// watch_id not above every watch_id the stream has used is the client's
// fault: it ends the stream. Ids never reused make every message's watch
// unambiguous, also one the server sent as the client left the watch.
func (m *sessionsStream) startWatch(id int64) (*streamWatch, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if id <= m.lastID {
		return nil, invalidArg("watch.watch_id", strconv.FormatInt(id, 10), fmt.Sprintf("must be greater than every watch_id the stream has used (%d)", m.lastID))
	}
	m.lastID = id
	if len(m.watches) >= MaxStreamWatches {
		m.out = append(m.out, watchEnded(id, invalidArg("watch.watch_id", strconv.FormatInt(id, 10), fmt.Sprintf("the stream has %d watches, the most it may have", MaxStreamWatches))))
		signal(m.wake)
		return nil, nil
	}
	sw := &streamWatch{id: id}
	m.watches[id] = sw
	return sw, nil
}

// openWatch starts sw, a watch of req's session, and sends its SYNCED, or
// ends it with the error that would have ended its WatchLease stream. A
// watch ended while it started (unwatch, the stream's end) is closed
// without a word.
func (m *sessionsStream) openWatch(sw *streamWatch, req *fencerv1.WatchLeaseRequest) {
	w, err := m.s.openLeaseWatch(m.ctx, req, func() { m.mark(sw) })
	if err == nil {
		sw.w = w
		m.awaitRoom()
	}
	m.mu.Lock()
	if sw.cancelled || m.closed {
		m.mu.Unlock()
		if w != nil {
			m.s.closeLeaseWatch(w)
		}
		return
	}
	if err != nil {
		delete(m.watches, sw.id)
		m.out = append(m.out, watchEnded(sw.id, err))
	} else {
		// SYNCED goes out before any event of the watch: both leave
		// under the same lock, replies first. Hooks that fired before
		// the watch went live were dropped; marking it now looks at
		// what they announced.
		sw.live, sw.marked = true, true
		m.out = append(m.out, watchEvent(sw.id, w.synced()))
		m.ready = append(m.ready, sw)
	}
	m.mu.Unlock()
	signal(m.wake)
}

// watchEvent is the message that carries ev of watch id.
func watchEvent(id int64, ev *fencerv1.WatchLeaseResponse) *fencerv1.SessionsResponse {
	return &fencerv1.SessionsResponse{Response: &fencerv1.SessionsResponse_Event{
		Event: &fencerv1.SessionsWatchEvent{WatchId: id, Event: ev},
	}}
}

// watchEnded is the message that ends watch id with err.
func watchEnded(id int64, err error) *fencerv1.SessionsResponse {
	return &fencerv1.SessionsResponse{Response: &fencerv1.SessionsResponse_WatchEnded{
		WatchEnded: &fencerv1.SessionsWatchEnded{WatchId: id, Error: sessionsError(err)},
	}}
}

// unwatch ends watch id, if it is starting or live: the handler sends no
// more of its messages, but for one it may be sending as this runs (the
// client drops messages of watches it has left).
func (m *sessionsStream) unwatch(id int64) {
	m.mu.Lock()
	sw := m.watches[id]
	if sw != nil && !sw.live {
		sw.cancelled = true
		delete(m.watches, id)
		sw = nil
	}
	m.mu.Unlock()
	if sw != nil {
		m.end(sw)
	}
}

// sessionsError is err as the status a call would end with (toStatus),
// carried in a Sessions message.
func sessionsError(err error) *fencerv1.SessionsError {
	return fencerv1.SessionsErrorOf(status.Convert(toStatus(err)))
}
