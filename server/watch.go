package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencer-dev/fencer/etcdstore"
	"github.com/fencer-dev/fencer/internal/holderkey"
	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
	"github.com/fencer-dev/fencer/ring"
	"github.com/fencer-dev/fencer/token"
)

// progressEvery is how often at most a lease watch reports progress, when
// etcd has reported changes since.
const progressEvery = time.Second

// WatchLease implements FencerService.WatchLease. The stream's losses come
// from the server's lease hub (one etcd watch on the holder keys, with
// their previous values, shared by every stream), and its session's end
// from the server's session watch (one etcd watch on the session keys,
// shared by every stream too). A holder key whose previous value was
// attached to the session and that is deleted, or rewritten under another
// etcd lease or create revision, is reported LOST. When the session key is
// deleted the stream ends with SESSION_NOT_FOUND, without LOST events for
// the holder keys deleted in the same revision (see sessionEndedBy). A start revision beyond the
// store's next revision is refused with INVALID_ARGUMENT (cause
// future_revision); one up to it is accepted, even if the shared watch has
// not reached it yet.
func (s *Server) WatchLease(req *fencerv1.WatchLeaseRequest, stream fencerv1.FencerService_WatchLeaseServer) error {
	if err := validateWatchLease(req); err != nil {
		return err
	}
	ctx := stream.Context()
	w, err := s.openLeaseWatch(ctx, req, nil)
	if err != nil {
		return err
	}
	defer s.closeLeaseWatch(w)
	// A client that reads nothing holds Send in gRPC's flow control; the
	// gate ends it on Shutdown and withdrawn credentials.
	g, ungate, err := s.gate(ctx)
	if err != nil {
		return err
	}
	defer ungate()
	if err := g.call(func() error { return stream.Send(w.synced()) }); err != nil {
		return err
	}
	for {
		select {
		case <-s.stopped.Done():
			return ErrShuttingDown
		case <-ctx.Done():
			return ctx.Err()
		case <-w.ended.gone:
		case <-w.feed.gone:
		case <-w.feed.q.ready:
		}
		for {
			msg, err := s.nextLeaseEvent(ctx, w)
			if err != nil {
				return err
			}
			if msg == nil {
				break
			}
			if err := g.call(func() error { return stream.Send(msg) }); err != nil {
				return err
			}
		}
	}
}

// leaseWatch is one lease watch, of a WatchLease stream or of a watch on
// a Sessions stream: its subscriptions to the end of its session and to
// the session's losses.
type leaseWatch struct {
	id    clientv3.LeaseID
	start int64 // the first revision it reports
	ended *sessionSub
	feed  *hubFeed
}

// openLeaseWatch checks that req's session is the caller's and starts a
// watch of it from req's start revision; req must be valid
// (validateWatchLease). notify, if not nil, is called whenever the watch
// may have a message or have ended (see nextLeaseEvent), from any
// goroutine and with the hub's locks held: it must only signal. Close the
// watch with closeLeaseWatch.
func (s *Server) openLeaseWatch(ctx context.Context, req *fencerv1.WatchLeaseRequest, notify func()) (*leaseWatch, error) {
	id := clientv3.LeaseID(req.GetSessionId())
	var rev int64
	var err error
	apart(func() { rev, err = s.checkSession(ctx, id, principalOf(ctx)) })
	if err != nil {
		return nil, err
	}
	start := req.GetStartRevision()
	if start == 0 {
		start = rev + 1
	}
	if start > rev+1 {
		// rev is the store's head (checkSession reads linearizably), and
		// every revision a client was told of is at most rev. The hub does
		// not check: its shared watch would accept the start and never
		// reach it.
		return nil, inField("start_revision", fmt.Errorf("server: start revision %d is beyond the store's next revision %d: %w", start, rev+1, rpctypes.ErrFutureRev))
	}
	ended := s.ended.subscribe(id, rev, notify)
	if !s.ended.covers(ended, rev) {
		// The session watch has moved past rev and no longer remembers
		// which sessions ended since: a read now that the watch is
		// subscribed tells.
		var again int64
		apart(func() { again, err = s.checkSession(ctx, id, principalOf(ctx)) })
		if err != nil {
			s.ended.unsubscribe(ended)
			return nil, err
		}
		s.ended.covers(ended, again)
	}
	return &leaseWatch{id: id, start: start, ended: ended, feed: s.hub.subscribe(id, start, rev, notify)}, nil
}

// closeLeaseWatch ends w's subscriptions.
func (s *Server) closeLeaseWatch(w *leaseWatch) {
	s.hub.unsubscribe(w.feed)
	s.ended.unsubscribe(w.ended)
}

// synced is the event a lease watch sends first.
func (w *leaseWatch) synced() *fencerv1.WatchLeaseResponse {
	return &fencerv1.WatchLeaseResponse{Type: fencerv1.WatchLeaseResponse_TYPE_SYNCED, Revision: w.start}
}

// nextLeaseEvent returns w's next event to send, nil if none waits now,
// or the error that ends w: its session's end, its feed's failure, or a
// failed read (see sessionEndedBy). It counts the LOST events it returns.
func (s *Server) nextLeaseEvent(ctx context.Context, w *leaseWatch) (*fencerv1.WatchLeaseResponse, error) {
	select {
	case <-w.ended.gone:
		return nil, w.ended.err
	case <-w.feed.gone:
		return nil, w.feed.err
	default:
	}
	msg, ok := w.feed.q.take()
	if !ok {
		return nil, nil
	}
	if over, err := s.sessionEndedBy(ctx, w.id, msg); err != nil || over {
		return nil, err
	}
	if msg.GetType() == fencerv1.WatchLeaseResponse_TYPE_LOST {
		s.m.lost.Inc()
	}
	return msg, nil
}

// sessionEndedBy reports whether the LOST event msg, of session id, is the
// session's own end: a holder key deleted in the revision that deleted the
// session key, as etcd deletes every key of a lease that expires or is
// revoked. The stream then ends with SESSION_NOT_FOUND alone, whichever of
// its two watches saw the revision first, so that a client says the
// session ended rather than that someone deleted its holder key. The read
// is linearizable: etcd may send a watch event before its revision can be
// read from the same member. Past a compaction it reads the current state
// instead, in which a session that ended by then is reported ended. It
// reads apart from the stream's handler.
func (s *Server) sessionEndedBy(ctx context.Context, id clientv3.LeaseID, msg *fencerv1.WatchLeaseResponse) (bool, error) {
	if msg.GetType() != fencerv1.WatchLeaseResponse_TYPE_LOST || msg.GetReason() != "deleted" {
		return false, nil
	}
	var resp *clientv3.GetResponse
	var err error
	apart(func() {
		resp, err = s.cli.Get(ctx, s.sessionKey(id), clientv3.WithRev(msg.GetRevision()), clientv3.WithCountOnly())
		if errors.Is(err, rpctypes.ErrCompacted) {
			resp, err = s.cli.Get(ctx, s.sessionKey(id), clientv3.WithCountOnly())
		}
	})
	switch {
	case err != nil:
		return false, fmt.Errorf("server: read session %d: %w", id, err)
	case resp.Count == 0:
		return true, sessionEnded(msg.GetRevision())
	}
	return false, nil
}

// progressRevision is the revision up to which wr shows every change: its
// last event's, or, for a response without events (a progress
// notification), its header's. While a watch catches up, etcd cuts its
// responses short at a revision boundary but still puts the store's current
// revision in the header, past the last event.
func progressRevision(wr clientv3.WatchResponse) int64 {
	if n := len(wr.Events); n > 0 {
		return wr.Events[n-1].Kv.ModRevision
	}
	return wr.Header.Revision
}

// errWatchBroken ends a lease watch whose etcd watch failed; the client
// watches again.
var errWatchBroken = fmt.Errorf("server: etcd watch broke: %w", errStoreUnavailable)

func watchErr(wr clientv3.WatchResponse, ok bool) error {
	switch {
	case !ok:
		return errWatchBroken
	case wr.CompactRevision != 0:
		return fmt.Errorf("%w: compacted at %d", ErrWatchCompacted, wr.CompactRevision)
	case wr.Err() != nil:
		return fmt.Errorf("%w: %w", errWatchBroken, wr.Err())
	}
	return nil
}

// lostEvent decides, purely, whether ev ends a lease of session id, and
// returns the event to send, or nil.
func lostEvent(ev *clientv3.Event, id clientv3.LeaseID, store *etcdstore.Store) *fencerv1.WatchLeaseResponse {
	prev := ev.PrevKv
	if prev == nil || clientv3.LeaseID(prev.Lease) != id {
		return nil
	}
	reason := "deleted"
	if ev.Type == mvccpb.PUT {
		if clientv3.LeaseID(ev.Kv.Lease) == id && ev.Kv.CreateRevision == prev.CreateRevision {
			return nil
		}
		reason = "replaced"
	}
	st, ok := holderkey.Parse(store.Prefix(), prev)
	if !ok {
		return nil
	}
	tok := st.Token
	return &fencerv1.WatchLeaseResponse{Type: fencerv1.WatchLeaseResponse_TYPE_LOST, Token: tok.String(), Revision: ev.Kv.ModRevision, Reason: reason}
}

// recordLoss writes the audit record of a loss the lease hub's shared
// watch saw, once per loss whatever the number of streams watching, and
// counts it; unless the loss is a release this server made, which has its
// own record, or the end of a ring's shard, which the JoinRing stream of
// its member records as a hand-off or a loss (recordBatch).
func (s *Server) recordLoss(ev *clientv3.Event, msg *fencerv1.WatchLeaseResponse) {
	if s.releasing.by(clientv3.LeaseID(ev.PrevKv.Lease), msg.GetToken()) {
		return
	}
	tok, _ := token.Parse(msg.GetToken())
	if _, _, ok := ring.ParseShardLease(tok.Lease); ok {
		return
	}
	s.m.leasesLost.Inc()
	holder := holderkey.Decode(ev.PrevKv.Value).Holder
	s.audit.LogAttrs(context.Background(), slog.LevelWarn, "lost", slog.String("principal", principalOfHolder(holder)), slog.String("holder", holder),
		slog.String("lease", tok.Lease), slog.String("token", msg.GetToken()), slog.Int64("revision", msg.GetRevision()), slog.String("reason", msg.GetReason()))
}

// releases remembers the sessions (by clientv3.LeaseID) and tokens (by
// their text) that this server is releasing or released, so that the
// holder-key deletions of its own releases are not recorded as losses. It
// is bounded: it is emptied when full.
type releases struct {
	mu   sync.Mutex
	made map[any]bool
}

const releasesSize = 1 << 16

// mark notes a release of session or token key before it is sent to etcd;
// undo forgets it, for a release that did not happen.
func (r *releases) mark(key any) (undo func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.made == nil || len(r.made) >= releasesSize {
		r.made = map[any]bool{}
	}
	r.made[key] = true
	return func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		delete(r.made, key)
	}
}

// by reports whether the loss of tok on session id is a release this
// server made.
func (r *releases) by(id clientv3.LeaseID, tok string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.made[id] || r.made[tok]
}
