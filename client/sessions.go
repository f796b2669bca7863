package client

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
)

// errLegacy means the server has no Sessions call (UNIMPLEMENTED): the
// session renews and watches over streams of its own (KeepAlive,
// WatchLease) instead, at once and without backoff.
var errLegacy = errors.New("client: the server has no Sessions call")

// errNoSessions means no session of the Client is running: the Sessions
// stream is not to be opened.
var errNoSessions = errors.New("client: no session is running")

// sessionsMux carries the renewals and lease watches of all of a Client's
// sessions on one Sessions stream, so that the server holds one stream
// for them, not two per session. It opens the stream when a session
// needs it, opens a new one after it breaks, and closes it when the last
// session ends. After an UNIMPLEMENTED answer it stays out of the way
// for the Client's life: sessions use KeepAlive and WatchLease streams of
// their own (make a new Client to try Sessions again, for example once a
// fleet's servers are all upgraded).
type sessionsMux struct {
	rpc fencerv1.FencerServiceClient

	mu     sync.Mutex
	legacy bool       // the server answered UNIMPLEMENTED
	users  int        // sessions started and not yet ended
	cur    *muxStream // nil until needed, and after it broke
}

// muxStream is one Sessions stream and its two goroutines: one reads it
// (read), one writes the queued requests (sendAll).
type muxStream struct {
	stream fencerv1.FencerService_SessionsClient // set once open, before read and sendAll start
	cancel context.CancelFunc
	done   chan struct{} // closed when the stream has ended, or failed to open; err says why
	err    error

	mu      sync.Mutex
	queue   []*fencerv1.SessionsRequest // requests the sender has yet to send
	queued  chan struct{}               // signalled when queue grows
	renews  map[int64]chan renewResult  // by session: its renewal in flight
	watches map[int64]*muxWatch         // by watch_id: the live watches
	lastID  int64                       // the last watch_id handed out
}

type renewResult struct {
	ttl time.Duration
	err error
}

// use counts a session in; release counts it out, closing the stream
// after the last.
func (m *sessionsMux) use() {
	m.mu.Lock()
	m.users++
	m.mu.Unlock()
}

func (m *sessionsMux) release() {
	m.mu.Lock()
	m.users--
	var ms *muxStream
	if m.users == 0 {
		ms, m.cur = m.cur, nil
	}
	m.mu.Unlock()
	if ms != nil {
		ms.cancel()
		<-ms.done
	}
}

// useLegacy reports whether sessions must use streams of their own.
func (m *sessionsMux) useLegacy() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.legacy
}

// stream returns the live Sessions stream, or a new one that opens on a
// goroutine of its own. Requests may be queued on it at once: they leave
// once it is open. Nobody waits for the opening itself, which waits for
// the connection (as long as gRPC's connect timeout, with a server that
// accepts connections and never answers): a renewal waits for its answer
// or its session's deadline, whichever comes first.
func (m *sessionsMux) stream() (*muxStream, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.legacy {
		return nil, errLegacy
	}
	if ms := m.cur; ms != nil && !ms.ended() {
		return ms, nil
	}
	if m.users == 0 {
		// The last session ended (its watch may still be on its way
		// out): a new stream would outlive every session.
		return nil, errNoSessions
	}
	ctx, cancel := context.WithCancel(context.Background())
	ms := &muxStream{cancel: cancel, done: make(chan struct{}), queued: make(chan struct{}, 1),
		renews: map[int64]chan renewResult{}, watches: map[int64]*muxWatch{}}
	m.cur = ms
	go func() {
		// release cancels ctx, which ends the opening too.
		stream, err := m.rpc.Sessions(ctx)
		if err != nil {
			m.end(ms, err)
			return
		}
		ms.stream = stream
		go ms.sendAll()
		m.read(ms)
	}()
	return ms, nil
}

// end records why ms ended and closes its done.
func (m *sessionsMux) end(ms *muxStream, err error) {
	m.mu.Lock()
	ms.err = m.failed(err)
	if m.cur == ms {
		m.cur = nil
	}
	m.mu.Unlock()
	ms.cancel()
	close(ms.done)
}

// ended reports whether ms has ended.
func (ms *muxStream) ended() bool {
	select {
	case <-ms.done:
		return true
	default:
		return false
	}
}

// failed is the error a stream's failure err is to its sessions: errLegacy
// for UNIMPLEMENTED, which it records (m.mu held), else the library's.
func (m *sessionsMux) failed(err error) error {
	if status.Code(err) == codes.Unimplemented {
		m.legacy = true
		return errLegacy
	}
	return fromStatus(err)
}

// read hands each message of ms to the renewal or watch it answers, until
// the stream ends; then every renewal and watch still waiting fails with
// the stream's error.
func (m *sessionsMux) read(ms *muxStream) {
	for {
		resp, err := ms.stream.Recv()
		if err != nil {
			m.end(ms, err)
			return
		}
		switch r := resp.GetResponse().(type) {
		case *fencerv1.SessionsResponse_Renewed:
			ms.answer(r.Renewed.GetSessionId(), renewResult{ttl: time.Duration(r.Renewed.GetTtlSeconds()) * time.Second})
		case *fencerv1.SessionsResponse_RenewFailed:
			ms.answer(r.RenewFailed.GetSessionId(), renewResult{err: fromSessionsError(r.RenewFailed.GetError())})
		case *fencerv1.SessionsResponse_Event:
			if w := ms.watch(r.Event.GetWatchId()); w != nil {
				w.put(r.Event.GetEvent(), nil)
			}
		case *fencerv1.SessionsResponse_WatchEnded:
			if w := ms.watch(r.WatchEnded.GetWatchId()); w != nil {
				ms.forget(w.id)
				w.put(nil, fromSessionsError(r.WatchEnded.GetError()))
			}
		}
	}
}

// fromSessionsError is the library's error for a status carried in a
// Sessions message: the error the status would be as a call's (fromStatus).
func fromSessionsError(e *fencerv1.SessionsError) error {
	return fromStatus(e.Status().Err())
}

// answer hands session id's renewal its result. An answer nobody waits
// for (the renewal gave up at its deadline) is dropped.
func (ms *muxStream) answer(id int64, r renewResult) {
	ms.mu.Lock()
	ch := ms.renews[id]
	delete(ms.renews, id)
	ms.mu.Unlock()
	if ch != nil {
		ch <- r // buffered for one
	}
}

// request queues req for the stream's sender and returns at once: a
// session's deadline never waits for a Send that gRPC's flow control
// holds.
func (ms *muxStream) request(req *fencerv1.SessionsRequest) {
	ms.mu.Lock()
	ms.queue = append(ms.queue, req)
	ms.mu.Unlock()
	select {
	case ms.queued <- struct{}{}:
	default:
	}
}

// sendAll sends the queued requests in order until the stream ends. A
// failed Send means the stream has ended; Recv, in read, then reports why.
func (ms *muxStream) sendAll() {
	for {
		select {
		case <-ms.done:
			return
		case <-ms.queued:
		}
		ms.mu.Lock()
		queue := ms.queue
		ms.queue = nil
		ms.mu.Unlock()
		for _, req := range queue {
			if ms.stream.Send(req) != nil {
				return
			}
		}
	}
}

// renew renews session id and waits for the answer, the stream's end,
// expire, or the end of ctx.
func (ms *muxStream) renew(ctx context.Context, id int64, expire <-chan time.Time) (time.Duration, error) {
	ch := make(chan renewResult, 1)
	ms.mu.Lock()
	ms.renews[id] = ch
	ms.mu.Unlock()
	req := &fencerv1.SessionsRequest{Request: &fencerv1.SessionsRequest_Renew{Renew: &fencerv1.KeepAliveRequest{SessionId: id}}}
	ms.request(req)
	select {
	case r := <-ch:
		return r.ttl, r.err
	case <-ms.done:
		return 0, ms.err
	case <-expire:
		ms.forgetRenewal(id, ch, req)
		return 0, errExpired
	case <-ctx.Done():
		ms.forgetRenewal(id, ch, req)
		return 0, ctx.Err()
	}
}

// forgetRenewal drops the renewal req of session id that waited on ch:
// unsent, it is never sent (a session that gave up must not be renewed
// later); sent, its answer is dropped.
func (ms *muxStream) forgetRenewal(id int64, ch chan renewResult, req *fencerv1.SessionsRequest) {
	ms.mu.Lock()
	if ms.renews[id] == ch {
		delete(ms.renews, id)
	}
	ms.queue = slices.DeleteFunc(ms.queue, func(r *fencerv1.SessionsRequest) bool { return r == req })
	ms.mu.Unlock()
}

// watch returns the live watch id, or nil.
func (ms *muxStream) watch(id int64) *muxWatch {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	return ms.watches[id]
}

// forget drops watch id: messages of it that still arrive are ignored.
func (ms *muxStream) forget(id int64) {
	ms.mu.Lock()
	delete(ms.watches, id)
	ms.mu.Unlock()
}

// startWatch starts a lease watch of req on the stream, under a watch_id
// never used on it before, and returns it. When ctx ends, the watch is
// ended on the server (unwatch) and forgotten.
func (ms *muxStream) startWatch(ctx context.Context, req *fencerv1.WatchLeaseRequest) *muxWatch {
	ms.mu.Lock()
	ms.lastID++
	w := &muxWatch{id: ms.lastID, ms: ms, ctx: ctx, ready: make(chan struct{}, 1)}
	ms.watches[w.id] = w
	ms.mu.Unlock()
	ms.request(&fencerv1.SessionsRequest{Request: &fencerv1.SessionsRequest_Watch{Watch: &fencerv1.SessionsWatch{WatchId: w.id, Watch: req}}})
	context.AfterFunc(ctx, func() { ms.leave(w.id) })
	return w
}

// leave forgets watch id and ends it on the server, unless it has ended
// there already.
func (ms *muxStream) leave(id int64) {
	if ms.watch(id) == nil {
		return // it ended on the server, or was left already
	}
	ms.forget(id)
	if !ms.ended() {
		ms.request(&fencerv1.SessionsRequest{Request: &fencerv1.SessionsRequest_Unwatch{Unwatch: &fencerv1.SessionsUnwatch{WatchId: id}}})
	}
}

// muxWatch is one lease watch on a Sessions stream. Recv reads it as a
// WatchLease stream is read.
type muxWatch struct {
	id  int64
	ms  *muxStream
	ctx context.Context

	mu     sync.Mutex
	events []*fencerv1.WatchLeaseResponse
	err    error         // how the server ended the watch; nil while it lives
	ready  chan struct{} // signalled when events or err have news
}

// maxWatchEvents is the most events a watch holds for its session; past
// it the watch ends (errWatchFellBehind), and the session watches again
// from the last event it took.
const maxWatchEvents = 1024

// errWatchFellBehind ends a watch whose session took its events too
// slowly.
var errWatchFellBehind = errors.New("client: the lease watch fell behind its session")

// put queues an event, or the watch's end. A watch that holds
// maxWatchEvents already ends instead, after the events it holds: read
// calls it from its goroutine, so it must not wait.
func (w *muxWatch) put(ev *fencerv1.WatchLeaseResponse, err error) {
	w.mu.Lock()
	switch {
	case w.err != nil:
	case ev == nil:
		w.err = err
	case len(w.events) >= maxWatchEvents:
		w.err = errWatchFellBehind
		go w.ms.leave(w.id)
	default:
		w.events = append(w.events, ev)
	}
	w.mu.Unlock()
	select {
	case w.ready <- struct{}{}:
	default:
	}
}

// Recv returns the watch's next event, or the error that ended it: the
// server's, the stream's, or the watch's context's.
func (w *muxWatch) Recv() (*fencerv1.WatchLeaseResponse, error) {
	for {
		w.mu.Lock()
		if len(w.events) > 0 {
			ev := w.events[0]
			w.events[0] = nil
			w.events = w.events[1:]
			w.mu.Unlock()
			return ev, nil
		}
		err := w.err
		w.mu.Unlock()
		if err != nil {
			return nil, err
		}
		select {
		case <-w.ready:
		case <-w.ms.done:
			// Events read before the stream ended are queued already.
			w.mu.Lock()
			n := len(w.events)
			w.mu.Unlock()
			if n == 0 {
				return nil, w.ms.err
			}
		case <-w.ctx.Done():
			return nil, fromStatus(status.FromContextError(w.ctx.Err()).Err())
		}
	}
}
