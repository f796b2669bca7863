package rpcfault

import (
	"sync"

	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
)

// The methods of fencer's session streams. A Sessions stream carries, for
// many sessions, what KeepAlive and WatchLease streams carry for one; the
// injector treats each renewal on it as a call of KeepAlive and each watch
// on it as a call of WatchLease, so that a test's outage of one of those
// methods cuts the same traffic whichever stream carries it.
const (
	sessionsMethod   = "/fencer.v1.FencerService/Sessions"
	keepAliveMethod  = "/fencer.v1.FencerService/KeepAlive"
	watchLeaseMethod = "/fencer.v1.FencerService/WatchLease"
)

// sessionsStream is a Sessions stream under the injector: a renew request
// is counted as a KeepAlive call and a watch request as a WatchLease
// call. While an outage fails KeepAlive, a renew request is not sent and
// is answered at once with renew_failed carrying the outage's error;
// while one fails WatchLease, a watch request is answered with
// watch_ended. An outage of either that starts while renewals are in
// flight or watches live fails those the same way, and the server's own
// later answers to them are dropped. The stream itself goes on; an outage
// of Sessions (or of every method) breaks it as any stream.
type sessionsStream struct {
	*stream
	pump chan received // the real stream's messages, read on a goroutine of their own
	once sync.Once

	mu       sync.Mutex
	injected []*fencerv1.SessionsResponse // answers the injector made, to deliver first
	wake     chan struct{}                // signalled when injected grows
	renewing map[int64]int                // by session: renewals sent, not yet answered
	drop     map[int64]int                // by session: server answers to drop
	watches  map[int64]bool               // the watch ids sent and not ended
	dropped  map[int64]bool               // watch ids the injector ended: the server's messages of them are dropped
}

type received struct {
	msg *fencerv1.SessionsResponse
	err error
}

func newSessionsStream(s *stream) *sessionsStream {
	return &sessionsStream{stream: s, pump: make(chan received, 1), wake: make(chan struct{}, 1),
		renewing: map[int64]int{}, drop: map[int64]int{}, watches: map[int64]bool{}, dropped: map[int64]bool{}}
}

// SendMsg sends a request, or answers it at once if an outage fails it.
func (s *sessionsStream) SendMsg(m any) error {
	req, ok := m.(*fencerv1.SessionsRequest)
	if !ok {
		return s.stream.SendMsg(m)
	}
	switch r := req.GetRequest().(type) {
	case *fencerv1.SessionsRequest_Renew:
		id := r.Renew.GetSessionId()
		if err := s.in.call(keepAliveMethod); err != nil {
			s.inject(&fencerv1.SessionsResponse{Response: &fencerv1.SessionsResponse_RenewFailed{
				RenewFailed: &fencerv1.SessionsRenewFailed{SessionId: id, Error: sessionsError(err)}}})
			return nil
		}
		s.mu.Lock()
		s.renewing[id]++
		s.mu.Unlock()
	case *fencerv1.SessionsRequest_Watch:
		id := r.Watch.GetWatchId()
		if err := s.in.call(watchLeaseMethod); err != nil {
			s.inject(ended(id, err))
			return nil
		}
		s.mu.Lock()
		s.watches[id] = true
		s.mu.Unlock()
	case *fencerv1.SessionsRequest_Unwatch:
		s.mu.Lock()
		delete(s.watches, r.Unwatch.GetWatchId())
		s.mu.Unlock()
	}
	return s.stream.SendMsg(m)
}

func ended(id int64, err error) *fencerv1.SessionsResponse {
	return &fencerv1.SessionsResponse{Response: &fencerv1.SessionsResponse_WatchEnded{
		WatchEnded: &fencerv1.SessionsWatchEnded{WatchId: id, Error: sessionsError(err)}}}
}

// sessionsError carries err's status as a Sessions message does.
func sessionsError(err error) *fencerv1.SessionsError {
	return fencerv1.SessionsErrorOf(status.Convert(err))
}

func (s *sessionsStream) inject(msg *fencerv1.SessionsResponse) {
	s.mu.Lock()
	s.injected = append(s.injected, msg)
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// cut fails what an outage of method cuts on the stream: its renewals in
// flight (KeepAlive) or its live watches (WatchLease).
func (s *sessionsStream) cut(method string, err error) {
	s.mu.Lock()
	var out []*fencerv1.SessionsResponse
	switch method {
	case keepAliveMethod:
		for id, n := range s.renewing {
			s.drop[id] += n
			for range n {
				out = append(out, &fencerv1.SessionsResponse{Response: &fencerv1.SessionsResponse_RenewFailed{
					RenewFailed: &fencerv1.SessionsRenewFailed{SessionId: id, Error: sessionsError(err)}}})
			}
		}
		clear(s.renewing)
	case watchLeaseMethod:
		for id := range s.watches {
			s.dropped[id] = true
			out = append(out, ended(id, err))
		}
		clear(s.watches)
	}
	s.mu.Unlock()
	for _, msg := range out {
		s.inject(msg)
	}
}

// RecvMsg delivers the injector's answers first, then the server's
// messages, less those of renewals and watches the injector failed.
func (s *sessionsStream) RecvMsg(m any) error {
	out, ok := m.(*fencerv1.SessionsResponse)
	if !ok {
		return s.stream.RecvMsg(m)
	}
	s.once.Do(func() {
		go func() {
			for {
				msg := &fencerv1.SessionsResponse{}
				err := s.stream.RecvMsg(msg)
				s.pump <- received{msg, err}
				if err != nil {
					return
				}
			}
		}()
	})
	for {
		s.mu.Lock()
		if len(s.injected) > 0 {
			msg := s.injected[0]
			s.injected = s.injected[1:]
			s.mu.Unlock()
			proto.Reset(out)
			proto.Merge(out, msg)
			return nil
		}
		s.mu.Unlock()
		select {
		case <-s.wake:
		case r := <-s.pump:
			if r.err != nil {
				s.in.forget(s)
				return r.err
			}
			if s.keep(r.msg) {
				proto.Reset(out)
				proto.Merge(out, r.msg)
				return nil
			}
		}
	}
}

// keep reports whether the server's msg reaches the client, and keeps the
// record of renewals and watches.
func (s *sessionsStream) keep(msg *fencerv1.SessionsResponse) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	var session, watch int64
	switch r := msg.GetResponse().(type) {
	case *fencerv1.SessionsResponse_Renewed:
		session = r.Renewed.GetSessionId()
	case *fencerv1.SessionsResponse_RenewFailed:
		session = r.RenewFailed.GetSessionId()
	case *fencerv1.SessionsResponse_Event:
		return !s.dropped[r.Event.GetWatchId()]
	case *fencerv1.SessionsResponse_WatchEnded:
		watch = r.WatchEnded.GetWatchId()
		delete(s.watches, watch)
		if s.dropped[watch] {
			delete(s.dropped, watch)
			return false
		}
		return true
	default:
		return true
	}
	if s.drop[session] > 0 {
		s.drop[session]--
		return false
	}
	if s.renewing[session] > 0 {
		s.renewing[session]--
	}
	return true
}
