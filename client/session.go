package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"

	"github.com/fencer-dev/fencer/client/internal/seam"
	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
	"github.com/fencer-dev/fencer/token"
)

// Reconnects of the keepalive and watch streams, and the re-checks of a
// lease whose loss may have gone unreported, are paced by an exponential
// backoff with jitter: the first retry comes after retryInitial, each
// next one after twice as long, up to a cap, each drawn at random from
// ±50% of its nominal value (so at most 1.5 × the cap), and the backoff
// starts over after a success (a renewal, a watch that the server has
// synced). The cap is retryMax for the watch and a tenth of the session's
// window (TTL/10 unless WithEndEarly shortens it; at least retryInitial)
// for keepalive, so that a session still renews within
// about a tenth of its TTL of the servers coming back; a renewal that
// succeeds after failing ends the watch's wait. Clients that lost their
// servers together thus come back spread out over time, and a long outage
// costs each a handful of attempts.
const (
	retryInitial = 200 * time.Millisecond
	retryMax     = 5 * time.Second
)

func newBackOff(maxInterval time.Duration) backoff.BackOff {
	return &backoff.ExponentialBackOff{
		InitialInterval:     retryInitial,
		RandomizationFactor: 0.5,
		Multiplier:          2,
		MaxInterval:         maxInterval,
	}
}

// SessionOption configures a Session. Options are built by this
// package's With functions (and, for tests, by package clienttest); the
// settings they set are not part of the API.
type SessionOption func(*seam.SessionConfig)

// WithTTL sets the session's TTL, a whole number of seconds from 1 to 3600
// (default token.DefaultTTL). The session's leases vanish this long
// after the last successful renewal, and the session fails closed locally
// no later than that.
func WithTTL(ttl time.Duration) SessionOption { return func(c *seam.SessionConfig) { c.TTL = ttl } }

// WithEndEarly makes the session end d before its local deadline: at the
// send time of the last successful renewal plus the TTL, minus d. A
// program that needs time to stop its work once the session ends (fencer
// acquire, which gives its command a grace period and then SIGKILL) ends
// the session that much earlier, so the work has stopped before etcd could
// expire the session and another holder acquire its leases. The session
// then renews every third of TTL − d. An acquisition that waited opens the
// session with less of its TTL left (the server renewed it meanwhile); if
// less than a third of TTL − d would be left, Acquire renews the session
// before it returns, and the deadline without d applies until then, while
// nothing holds the lease yet. d must be at least 0 and less than two
// thirds of the TTL (default 0).
// Ending early changes only the client's deadline, not the server's
// expiry, and gives no bound on how late the program's own stop is.
func WithEndEarly(d time.Duration) SessionOption {
	return func(c *seam.SessionConfig) { c.EndEarly = d }
}

// WithDeadlineFunc has f called with the time at which the session will
// end unless a renewal succeeds first (see WithEndEarly), each time that
// time is set: as the session opens (before the acquisition that opened
// it returns) and after each successful renewal. f runs on the session's
// goroutines, one call at a time, and must return promptly: the session
// does not renew while f runs. It is not called when the session ends.
func WithDeadlineFunc(f func(end time.Time)) SessionOption {
	return func(c *seam.SessionConfig) { c.OnDeadline = f }
}

// Session is a remote session: an etcd lease that a server granted for
// this client's principal, renewed and watched however many leases it
// holds: over the one Sessions stream that carries all of the Client's
// sessions, or, from a server without that call, over a KeepAlive and a
// WatchLease stream of its own. The session is opened by its first
// acquisition.
//
// The session ends when Close is called, when the server reports it gone,
// or when no renewal has succeeded before the local deadline: the send
// time of the last successful renewal plus the TTL granted, less what
// WithEndEarly takes, on the client's clock (monotonic by default). That
// deadline is never later than etcd's own expiry, so the session fails
// closed, also when no server can be reached. When it ends, every Lease it holds ends too.
type Session struct {
	c          *Client
	ttl        time.Duration
	early      time.Duration   // see WithEndEarly
	onDeadline func(time.Time) // see WithDeadlineFunc; nil if not set

	ctx    context.Context // done when the session ends; its cause is Err's value
	cancel context.CancelCauseFunc
	wg     sync.WaitGroup

	retry   func(maxInterval time.Duration) backoff.BackOff // newBackOff unless a test says otherwise
	hooks   seam.Hooks                                      // nil hooks outside tests; see clienttest
	renewed chan struct{}                                   // a renewal succeeded after one failed: the servers are back; see pause

	open    sync.Mutex // serializes the acquisition that opens the session
	mu      sync.Mutex
	id      int64  // 0 until opened
	secret  []byte // the session's secret, from the Acquire that opened it; proves a clean release
	held    map[string]*Lease
	pending map[string]*pendingName // names being acquired; see acquire
}

// pendingName is what the watch reported about a name while n
// acquisitions of it were in flight.
type pendingName struct {
	n       int
	lost    map[int64]error // reasons, by the revision of the token reported lost
	recheck bool            // the watch re-checked the held leases meanwhile
}

// NewSession returns a session that opens on its first acquisition. It
// does no I/O. Close must be called to release its goroutines.
func (c *Client) NewSession(opts ...SessionOption) (*Session, error) {
	cfg := seam.SessionConfig{TTL: token.DefaultTTL, Retry: newBackOff}
	for _, o := range opts {
		o(&cfg)
	}
	s := &Session{
		c: c, ttl: cfg.TTL, early: cfg.EndEarly, onDeadline: cfg.OnDeadline, retry: cfg.Retry, hooks: cfg.Hooks,
		held: map[string]*Lease{}, pending: map[string]*pendingName{}, renewed: make(chan struct{}, 1),
	}
	if s.ttl < time.Second || s.ttl > time.Hour || s.ttl%time.Second != 0 {
		return nil, &token.ArgumentError{Arg: "ttl", Value: s.ttl.String(), Reason: "must be a whole number of seconds from 1s to 1h"}
	}
	if s.early < 0 || 3*s.early >= 2*s.ttl {
		return nil, &token.ArgumentError{Arg: "end early", Value: s.early.String(), Reason: fmt.Sprintf("must be at least 0 and less than two thirds of the %s TTL", s.ttl)}
	}
	s.ctx, s.cancel = context.WithCancelCause(context.Background())
	return s, nil
}

// proof returns the session's id and secret, which make a release clean.
func (s *Session) proof() (int64, []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.id, s.secret
}

// ID returns the session's id, or 0 before its first acquisition.
func (s *Session) ID() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.id
}

// Done is closed when the session ends.
func (s *Session) Done() <-chan struct{} { return s.ctx.Done() }

// Err returns nil while the session runs, and then why it ended:
// token.ErrSessionClosed or token.ErrSessionExpired, wrapped.
func (s *Session) Err() error {
	return token.Ended(s.ctx)
}

// AcquireOption configures one acquisition (Acquire, TryAcquire).
type AcquireOption func(*fencerv1.AcquireRequest)

// WithLockDelay sets the acquisition's lock-delay, 0 (the default) to an
// hour, in whole seconds (rounded up): if the acquisition ends other than
// by its holder's Lease.Release (its session expired or was released, its
// holder key was deleted, another caller released its token), the server's
// store refuses to let anyone acquire the lease until at least d has
// passed on etcd's clock, so a holder still finishing its work (a command
// in its grace period) does not overlap its successor. A lease whose
// holder crashed is then unavailable for the session's TTL plus d.
func WithLockDelay(d time.Duration) AcquireOption {
	return func(r *fencerv1.AcquireRequest) { r.LockDelaySeconds = int64((d + time.Second - 1) / time.Second) }
}

// Acquire acquires lease name, waiting while another holder has it and
// while the lock-delay of its last acquisition runs, until ctx ends.
// Waiters are not queued.
func (s *Session) Acquire(ctx context.Context, name string, opts ...AcquireOption) (*Lease, error) {
	return s.acquire(ctx, name, true, opts)
}

// TryAcquire acquires lease name if it is free and otherwise returns at
// once a *token.HeldError, or a *token.LockDelayError (token.ErrLockDelay)
// when it is free but inside the lock-delay of its last acquisition.
func (s *Session) TryAcquire(ctx context.Context, name string, opts ...AcquireOption) (*Lease, error) {
	return s.acquire(ctx, name, false, opts)
}

// acquire acquires name through the server.
//
// The watch may report the new token lost before the Lease is registered
// with the session: the server's Txn has committed, the holder key has
// been deleted, and the report has arrived before the reply. So the name
// is marked pending before the call, the watch keeps what it reports about
// a pending name, and registering the Lease applies it (see register).
func (s *Session) acquire(ctx context.Context, name string, wait bool, opts []AcquireOption) (*Lease, error) {
	if err := s.Err(); err != nil {
		return nil, err
	}
	id := s.ID()
	if id == 0 {
		s.open.Lock()
		defer s.open.Unlock()
		id = s.ID()
	}
	req := &fencerv1.AcquireRequest{Name: name, SessionId: id, Wait: wait}
	for _, o := range opts {
		o(req)
	}
	if id == 0 {
		req.TtlSeconds = int64(s.ttl / time.Second)
	}
	s.mu.Lock()
	s.pend(name)
	s.mu.Unlock()
	sent := s.c.clock.Now()
	resp, err := s.c.rpc.Acquire(ctx, req)
	if err != nil {
		s.register(name, nil)
		return nil, fromStatus(err)
	}
	tok, err := token.Parse(resp.GetToken())
	if err != nil {
		s.register(name, nil)
		return nil, fmt.Errorf("client: acquire %q: server sent %w", name, err)
	}
	if h := s.hooks.Acquired; h != nil {
		h(tok)
	}
	if id == 0 {
		// The server renewed the new session every TTL/3 while the call
		// waited, so it expires no sooner than either bound below.
		ttl := time.Duration(resp.GetTtlSeconds()) * time.Second
		deadline := sent.Add(ttl)
		if d := s.c.clock.Now().Add(ttl / 2); d.After(deadline) {
			deadline = d
		}
		if renewed := s.start(resp.GetSessionId(), resp.GetSessionSecret(), deadline, tok.Revision); renewed != nil {
			select {
			case <-renewed:
			case <-s.ctx.Done(): // register ends the lease
			}
		}
	}
	l := &Lease{sess: s, tok: tok}
	l.ctx, l.cancel = context.WithCancelCause(context.Background())
	if err := s.register(name, l); err != nil {
		return nil, err
	}
	return l, nil
}

// start records the session's id and secret and starts its keepalive and watch;
// deadline is when etcd expires the session at the soonest, unless
// renewed. If less than a third of the session's window would be left
// after WithEndEarly's part, start returns a channel that the first
// successful renewal closes, and until then the session ends at deadline
// itself; otherwise it returns nil.
func (s *Session) start(id int64, secret []byte, deadline time.Time, fromRev int64) <-chan struct{} {
	s.mu.Lock()
	s.id, s.secret = id, secret
	s.mu.Unlock()
	var renewed chan struct{}
	if end := deadline.Add(-s.early); end.Sub(s.c.clock.Now()) < (s.ttl-s.early)/3 {
		renewed = make(chan struct{})
	} else {
		deadline = end
		if f := s.onDeadline; f != nil {
			f(end)
		}
	}
	s.wg.Add(2)
	s.c.sessions.use()
	go s.keepAlive(id, deadline, renewed)
	go s.watch(id, fromRev)
	return renewed
}

// Close releases the session on the server, which ends every lease it
// holds at once, and stops its goroutines. ctx bounds the release; the
// goroutines stop regardless, and if the release fails the session's
// leases still vanish when its TTL runs out. Close is idempotent.
func (s *Session) Close(ctx context.Context) error {
	s.mu.Lock()
	closed := errors.Is(s.Err(), token.ErrSessionClosed)
	id := s.id
	s.mu.Unlock()
	if closed {
		return nil
	}
	s.end(token.ErrSessionClosed)
	s.wg.Wait()
	if id == 0 {
		return nil
	}
	_, err := s.c.rpc.Release(ctx, &fencerv1.ReleaseRequest{Target: &fencerv1.ReleaseRequest_SessionId{SessionId: id}})
	if err := fromStatus(err); err != nil && !errors.Is(err, token.ErrSessionExpired) {
		return fmt.Errorf("client: close session: %w", err)
	}
	return nil
}

// end stops the session and its leases with reason; the first reason wins.
func (s *Session) end(reason error) {
	s.mu.Lock()
	s.cancel(reason)
	held := s.held
	s.held = map[string]*Lease{}
	s.mu.Unlock()
	for _, l := range held {
		l.end(reason)
	}
}

// keepAlive renews the session every third of its window (the TTL, less
// what WithEndEarly takes), reopening its renewer on error, and ends the
// session when the local deadline passes or the server reports the
// session gone. With renewed (see start), it renews at once and closes
// renewed after the first renewal that succeeds.
func (s *Session) keepAlive(id int64, deadline time.Time, renewed chan struct{}) {
	defer s.wg.Done()
	defer s.c.sessions.release() // it returns only once the session has ended
	window := s.ttl - s.early
	interval := window / 3
	first := interval
	if renewed != nil {
		first = 0
	}
	tick := s.c.clock.NewTimer(first)
	until := deadline // when expire fires
	expire := s.c.clock.NewTimer(deadline.Sub(s.c.clock.Now()))
	defer func() {
		tick.Stop()
		expire.Stop()
	}()
	expired := fmt.Errorf("%w: no keepalive succeeded within the %s TTL", token.ErrSessionExpired, s.ttl)
	var ka renewer
	defer func() {
		if ka != nil {
			ka.close()
		}
	}()
	retry := s.retry(max(window/10, retryInitial))
	failed := false
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-expire.C():
			s.end(expired)
			return
		case <-tick.C():
		}
		if failed {
			s.c.reconnect()
		}
		if ka == nil {
			ka = s.openRenewer()
		}
		sent := s.c.clock.Now()
		ttl, err := ka.renew(s.ctx, id, expire.C())
		switch {
		case errors.Is(err, errLegacy):
			ka = nil
			tick.Reset(0)
			continue
		case errors.Is(err, errExpired):
			s.end(expired)
			return
		case errors.Is(err, token.ErrSessionExpired):
			s.end(err)
			return
		case err != nil:
			ka.close()
			ka = nil
			failed = true
			tick.Reset(min(retry.NextBackOff(), interval))
			continue
		}
		retry.Reset()
		if failed {
			// The watch may have been down as long as the renewals were,
			// and may stay down (a restarted server's watch reconnects
			// later): check every held lease before this renewal extends
			// the deadline, so that one ended meanwhile (its token
			// released by another caller) ends now, not when the watch
			// comes back. Without an answer the deadline stays.
			cctx, cancel := context.WithTimeout(s.ctx, until.Sub(s.c.clock.Now()))
			err := s.checkAll(cctx)
			cancel()
			if err != nil {
				tick.Reset(min(retry.NextBackOff(), interval))
				continue
			}
			failed = false
			select {
			case s.renewed <- struct{}{}:
			default:
			}
		}
		end := sent.Add(ttl - s.early)
		until = end
		expire.Stop()
		expire.Reset(end.Sub(s.c.clock.Now()))
		if f := s.onDeadline; f != nil {
			f(end)
		}
		if renewed != nil {
			close(renewed)
			renewed = nil
		}
		tick.Reset(interval)
	}
}

var errExpired = errors.New("client: local deadline passed")

// renewer renews the session.
type renewer interface {
	// renew sends one renewal and waits for its answer, for expire
	// (errExpired) or for the end of ctx. It never waits for longer: not
	// for a stream to open, nor (on the Sessions stream) for a Send. A
	// KeepAlive stream's Send, one renewal at a time, could wait only if
	// the server left a whole flow-control window of them unread.
	renew(ctx context.Context, id int64, expire <-chan time.Time) (time.Duration, error)
	close()
}

// openRenewer returns the Client's Sessions stream as a renewer, or a
// KeepAlive stream of the session's own if the server lacks that call.
func (s *Session) openRenewer() renewer {
	if s.c.sessions.useLegacy() {
		return s.openKeepAlive()
	}
	return muxRenewer{s.c.sessions}
}

// muxRenewer renews over the Client's Sessions stream.
type muxRenewer struct{ m *sessionsMux }

func (r muxRenewer) renew(ctx context.Context, id int64, expire <-chan time.Time) (time.Duration, error) {
	ms, err := r.m.stream()
	if err != nil {
		return 0, err
	}
	return ms.renew(ctx, id, expire)
}

// close does nothing: the stream is the Client's.
func (muxRenewer) close() {}

// keepAliveStream is one KeepAlive stream and the goroutine that opens
// and reads it.
type keepAliveStream struct {
	opened chan struct{} // closed once the stream is open, or failed to open (err)
	stream fencerv1.FencerService_KeepAliveClient
	err    error
	resps  chan *fencerv1.KeepAliveResponse
	errs   chan error
	cancel context.CancelFunc
	done   chan struct{}
}

// openKeepAlive opens a KeepAlive stream on a goroutine that then reads
// it: opening waits for the connection, and a renewal must not wait
// longer than its session's deadline.
func (s *Session) openKeepAlive() *keepAliveStream {
	ctx, cancel := context.WithCancel(s.ctx)
	ka := &keepAliveStream{cancel: cancel, opened: make(chan struct{}), resps: make(chan *fencerv1.KeepAliveResponse), errs: make(chan error, 1), done: make(chan struct{})}
	go func() {
		defer close(ka.done)
		ka.stream, ka.err = s.c.rpc.KeepAlive(ctx)
		close(ka.opened)
		if ka.err != nil {
			return
		}
		for {
			r, err := ka.stream.Recv()
			if err != nil {
				ka.errs <- err
				return
			}
			select {
			case ka.resps <- r:
			case <-ctx.Done():
				return
			}
		}
	}()
	return ka
}

// renew waits for the stream to open, sends one renewal and waits for its
// answer; expire and the end of ctx cut either wait short.
func (ka *keepAliveStream) renew(ctx context.Context, id int64, expire <-chan time.Time) (time.Duration, error) {
	select {
	case <-ka.opened:
	case <-expire:
		return 0, errExpired
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	if ka.err != nil {
		return 0, fromStatus(ka.err)
	}
	if err := ka.stream.Send(&fencerv1.KeepAliveRequest{SessionId: id}); err != nil {
		ka.err = err
		return 0, fromStatus(err)
	}
	select {
	case r := <-ka.resps:
		return time.Duration(r.GetTtlSeconds()) * time.Second, nil
	case err := <-ka.errs:
		ka.err = err
		return 0, fromStatus(err)
	case <-expire:
		return 0, errExpired
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

func (ka *keepAliveStream) close() {
	if ka == nil {
		return
	}
	ka.cancel()
	<-ka.done
}

// watch follows the session's lease watch from revision from and
// ends each lease reported lost. When the stream breaks it watches again,
// with backoff, from the last revision it saw; when that revision was
// compacted it watches from now and checks every held token (and every
// token acquired meanwhile, see register), until every check has had an
// answer, so no loss is missed.
func (s *Session) watch(id, from int64) {
	defer s.wg.Done()
	resync := false
	retry := s.retry(retryMax)
	for {
		err := s.watchOnce(id, &from, &resync, retry)
		if s.ctx.Err() != nil {
			return
		}
		switch {
		case errors.Is(err, errLegacy):
			continue // at once, over a WatchLease stream
		case errors.Is(err, token.ErrSessionExpired):
			s.end(err)
			return
		case errors.Is(err, errWatchCompacted):
			from, resync = 0, true
		}
		if !s.pause(retry.NextBackOff()) {
			return
		}
	}
}

// pause waits for d on the client's clock, or until a renewal succeeds
// after failing (so a reconnect does not wait out its backoff once the
// servers are back), and reports false if the session ended first.
func (s *Session) pause(d time.Duration) bool {
	t := s.c.clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-s.ctx.Done():
		return false
	case <-t.C():
	case <-s.renewed:
	}
	return true
}

// watchOnce follows one lease watch until it ends. Once the server
// has synced it, retry starts over.
func (s *Session) watchOnce(id int64, from *int64, resync *bool, retry backoff.BackOff) error {
	ctx, cancel := context.WithCancel(s.ctx)
	defer cancel()
	if h := s.hooks.Watch; h != nil {
		h(*from)
	}
	stream, err := s.openWatch(ctx, &fencerv1.WatchLeaseRequest{SessionId: id, StartRevision: *from})
	if err != nil {
		return err
	}
	for {
		ev, err := stream.Recv()
		if err != nil {
			return err
		}
		switch ev.GetType() {
		case fencerv1.WatchLeaseResponse_TYPE_SYNCED:
			retry.Reset()
			select {
			case <-s.renewed: // news of a recovery that this stream has seen
			default:
			}
			*from = ev.GetRevision()
			if *resync {
				if err := s.checkAll(ctx); err != nil {
					return err // resync stays due: the next stream checks again
				}
				*resync = false
			}
		case fencerv1.WatchLeaseResponse_TYPE_PROGRESS:
			*from = ev.GetRevision() + 1
		case fencerv1.WatchLeaseResponse_TYPE_LOST:
			// One etcd revision may end several leases: resume at it.
			*from = ev.GetRevision()
			if tok, err := token.Parse(ev.GetToken()); err == nil {
				s.lose(tok, fmt.Errorf("%w: %s (%s)", token.ErrLeaseLost, tok, ev.GetReason()))
			}
		}
		if h := s.hooks.Received; h != nil {
			h(ev)
		}
	}
}

// leaseWatch is a lease watch as the session reads it. Its errors are
// the library's (fromStatus).
type leaseWatch interface {
	Recv() (*fencerv1.WatchLeaseResponse, error)
}

// openWatch starts a lease watch of req on the Client's Sessions stream,
// or on a WatchLease stream of its own if the server lacks that call. It
// lasts until ctx ends.
func (s *Session) openWatch(ctx context.Context, req *fencerv1.WatchLeaseRequest) (leaseWatch, error) {
	if s.c.sessions.useLegacy() {
		stream, err := s.c.rpc.WatchLease(ctx, req)
		if err != nil {
			return nil, fromStatus(err)
		}
		return watchLeaseStream{stream}, nil
	}
	ms, err := s.c.sessions.stream()
	if err != nil {
		return nil, err
	}
	return ms.startWatch(ctx, req), nil
}

// watchLeaseStream is a WatchLease stream as a leaseWatch.
type watchLeaseStream struct {
	fencerv1.FencerService_WatchLeaseClient
}

func (w watchLeaseStream) Recv() (*fencerv1.WatchLeaseResponse, error) {
	ev, err := w.FencerService_WatchLeaseClient.Recv()
	return ev, fromStatus(err)
}

// check asks the server whether tok is current.
func (s *Session) check(ctx context.Context, tok token.Token) error {
	if h := s.hooks.Check; h != nil {
		return h(ctx, tok)
	}
	return s.c.Check(ctx, tok)
}

// checkAll ends every held lease whose token is no longer current, and
// marks the acquisitions in flight for a check once registered: the watch
// may have missed their loss too. It returns the first error of a check
// that had no answer, and then the caller checks again later.
func (s *Session) checkAll(ctx context.Context) error {
	s.mu.Lock()
	leases := make([]*Lease, 0, len(s.held))
	for _, l := range s.held {
		leases = append(leases, l)
	}
	for _, p := range s.pending {
		p.recheck = true
	}
	s.mu.Unlock()
	var failed error
	for _, l := range leases {
		err := s.check(ctx, l.tok)
		switch {
		case errors.Is(err, token.ErrStale):
			s.lose(l.tok, fmt.Errorf("%w: %w", token.ErrLeaseLost, err))
		case err != nil && failed == nil:
			failed = fmt.Errorf("client: check %s: %w", l.tok, err)
		}
	}
	return failed
}

// recheck checks l's token in the background, retrying with backoff until
// it has an answer or l or the session ends, and ends l if it is stale.
// s.wg must have been added to for it, while the session ran.
func (s *Session) recheck(l *Lease) {
	defer s.wg.Done()
	retry := s.retry(retryMax)
	for {
		err := s.check(l.ctx, l.tok)
		switch {
		case errors.Is(err, token.ErrStale):
			s.lose(l.tok, fmt.Errorf("%w: %w", token.ErrLeaseLost, err))
			return
		case err == nil, l.ctx.Err() != nil:
			return
		}
		if !s.pause(retry.NextBackOff()) {
			return
		}
	}
}

// lose ends the held lease with token tok, or keeps the report for an
// acquisition of tok's name in flight.
func (s *Session) lose(tok token.Token, reason error) {
	s.mu.Lock()
	l := s.held[tok.Lease]
	if l != nil && l.tok.Revision == tok.Revision {
		delete(s.held, tok.Lease)
	} else {
		l = nil
		if p := s.pending[tok.Lease]; p != nil {
			if p.lost == nil {
				p.lost = map[int64]error{}
			}
			p.lost[tok.Revision] = reason
		}
	}
	s.mu.Unlock()
	if l != nil {
		l.end(reason)
	}
}

// pend marks an acquisition of name as in flight, so that the watch keeps
// what it reports about name until register. s.mu must be held.
func (s *Session) pend(name string) {
	p := s.pending[name]
	if p == nil {
		p = &pendingName{}
		s.pending[name] = p
	}
	p.n++
}

// register ends an in-flight acquisition of name: l is the Lease it
// acquired, or nil if it acquired nothing. l is registered with the
// session unless the session has ended (then l ends and the session's
// error is returned) or the watch reported l's token lost while it was in
// flight (then l ends with that report). If the watch re-checked the held
// leases while l was in flight, l is checked too, in the background.
func (s *Session) register(name string, l *Lease) error {
	s.mu.Lock()
	p := s.pending[name]
	if p.n--; p.n == 0 {
		delete(s.pending, name)
	}
	if l == nil {
		s.mu.Unlock()
		return nil
	}
	lost := p.lost[l.tok.Revision]
	err := s.Err()
	if err == nil && lost == nil {
		s.held[name] = l
		if p.recheck {
			s.wg.Add(1) // before Close waits: the session is running
			go s.recheck(l)
		}
	}
	s.mu.Unlock()
	switch {
	case err != nil:
		l.end(err)
		return err
	case lost != nil:
		l.end(lost)
	}
	return nil
}

func (s *Session) forget(l *Lease) {
	s.mu.Lock()
	if s.held[l.tok.Lease] == l {
		delete(s.held, l.tok.Lease)
	}
	s.mu.Unlock()
}

// Lease is one acquisition held through a remote Session. Its Token is
// fixed for its lifetime. Methods are safe for concurrent use.
type Lease struct {
	sess *Session
	tok  token.Token

	// ctx is done when the acquisition ends; its cause is Err's value.
	ctx    context.Context
	cancel context.CancelCauseFunc
}

// Token returns the fencing token of this acquisition.
func (l *Lease) Token() token.Token { return l.tok }

// Done is closed when this acquisition ends: released, reported lost by
// the server's watch (holder key deleted or replaced), or its session
// ended, including by the local deadline. Done is prompt but advisory:
// writes are fenced by the store, not by Done, and a watch that cannot
// reach any server reports nothing until the local deadline passes.
func (l *Lease) Done() <-chan struct{} { return l.ctx.Done() }

// Err returns nil while the lease is held and then why it ended:
// token.ErrReleased, ErrLeaseLost, ErrSessionClosed or
// ErrSessionExpired, wrapped with detail. All of them also match
// token.ErrNotHeld.
func (l *Lease) Err() error {
	return token.Ended(l.ctx)
}

// Release ends the Lease with token.ErrReleased (Done closes first,
// as with the library) and then asks the server to delete the holder key
// if and only if it is still this acquisition's, so a retried or late
// Release never deletes a newer holder's key. If that call fails, the
// Lease has ended all the same; a retry deletes the key, or it expires with
// the session. Releasing a lease that has already ended changes nothing in
// etcd unless its key is still this acquisition's. It is the holder's
// clean release: the lease's lock-delay (WithLockDelay) does not apply.
func (l *Lease) Release(ctx context.Context) error {
	l.sess.forget(l)
	l.end(token.ErrReleased)
	id, secret := l.sess.proof()
	_, err := l.sess.c.rpc.Release(ctx, &fencerv1.ReleaseRequest{Target: &fencerv1.ReleaseRequest_Token{Token: l.tok.String()}, HolderSessionId: id, HolderSessionSecret: secret})
	if err := fromStatus(err); err != nil {
		return fmt.Errorf("client: release %s: %w", l.tok, err)
	}
	return nil
}

// end ends the acquisition with reason; only the first call has an effect.
func (l *Lease) end(reason error) {
	l.cancel(fmt.Errorf("%w (%w)", reason, token.ErrNotHeld))
}
