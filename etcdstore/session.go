package etcdstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"k8s.io/utils/clock"

	"github.com/fencer-dev/fencer/token"
)

// DefaultTTL is a Session's etcd lease TTL unless WithTTL says otherwise
// (token.DefaultTTL, shared with the gRPC client).
const DefaultTTL = token.DefaultTTL

// SessionOption configures a Session.
type SessionOption func(*sessionConfig)

type sessionConfig struct {
	ttl    time.Duration
	holder string
	clock  clock.Clock
	retry  func() backoff.BackOff // paces watch recovery; newWatchBackOff unless a test says otherwise
	hooks  sessionHooks
}

// sessionHooks let the package's tests stop a session at the exact points
// where a change to a holder key could slip between acquisition and the
// watch. Each is nil outside tests.
type sessionHooks struct {
	acquired func(token.Token)   // after the acquiring Txn, before the Lease is registered
	watching func(cancel func()) // a watch has started; cancel breaks it
	resync   func()              // the watch broke; before the holder keys are read again
	reread   func(rev int64)     // the holder keys were read at rev; before they are applied
	observed func(rev int64)     // every change up to rev has been applied
}

// WithTTL sets the session's etcd lease TTL, a whole number of seconds of
// at least one. Holder keys vanish this long after the process stops
// renewing, and the session fails closed locally no later than that.
func WithTTL(ttl time.Duration) SessionOption { return func(c *sessionConfig) { c.ttl = ttl } }

// WithHolder sets the holder identity written into holder keys. A random
// nonce is always appended, so two sessions never share an identity.
func WithHolder(name string) SessionOption { return func(c *sessionConfig) { c.holder = name } }

// WithClock sets the clock that paces keepalives and measures the local
// deadline. Tests use a fake clock to stall a session deterministically.
func WithClock(clk clock.Clock) SessionOption { return func(c *sessionConfig) { c.clock = clk } }

// Session is one process's presence in the store: one etcd lease, kept
// alive by one goroutine, and one watch on the store's holder keys that
// serves every Lease the session holds.
//
// The session ends when Close is called, when its etcd lease is revoked or
// expires, or when keepalive has not succeeded before the local deadline:
// the send time of the last successful keepalive plus the TTL etcd granted,
// measured on the session's clock (monotonic by default). That deadline is
// never later than etcd's own expiry, so the session fails closed. When it
// ends, every Lease it holds ends too.
type Session struct {
	store  *Store
	id     clientv3.LeaseID
	holder string
	ttl    time.Duration
	clock  clock.Clock

	ctx    context.Context // done when the session ends; its cause is Err's value
	cancel context.CancelCauseFunc
	wg     sync.WaitGroup

	retry   func() backoff.BackOff
	hooks   sessionHooks
	renewed chan struct{} // a renewal succeeded after one failed: etcd is back; see pause

	mu      sync.Mutex
	held    map[string]*Lease
	pending map[string]*pendingName // names being acquired; see tryAcquire
	closed  bool
}

// pendingName is what the watch saw of a holder key while n acquisitions
// of its name were in flight: the latest state, or nil.
type pendingName struct {
	n    int
	seen *observation
}

// NewSession grants an etcd lease and starts the keepalive and watch
// goroutines. ctx bounds only the setup; the session runs until Close or
// loss. Close must be called to release the goroutines.
func (s *Store) NewSession(ctx context.Context, opts ...SessionOption) (*Session, error) {
	cfg := sessionConfig{ttl: DefaultTTL, clock: clock.RealClock{}, retry: newWatchBackOff}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.ttl < time.Second || cfg.ttl%time.Second != 0 {
		return nil, invalid("ttl", cfg.ttl.String(), "must be a whole number of seconds, at least 1s")
	}
	if cfg.holder == "" {
		host, _ := os.Hostname()
		cfg.holder = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	nonce := make([]byte, 6)
	_, _ = rand.Read(nonce)
	holder := cfg.holder + "-" + hex.EncodeToString(nonce)

	sent := cfg.clock.Now()
	grant, err := s.cli.Grant(ctx, int64(cfg.ttl/time.Second))
	if err != nil {
		return nil, fmt.Errorf("etcdstore: grant session lease: %w", err)
	}
	// Watch from the grant's revision on, so that no change to a holder key
	// acquired through this session can be missed.
	startRev := grant.ResponseHeader.Revision + 1
	sctx, cancel := context.WithCancelCause(context.Background())
	sess := &Session{
		store: s, id: grant.ID, holder: holder, ttl: cfg.ttl, clock: cfg.clock,
		retry: cfg.retry, hooks: cfg.hooks, renewed: make(chan struct{}, 1),
		ctx: sctx, cancel: cancel, held: map[string]*Lease{}, pending: map[string]*pendingName{},
	}
	deadline := sent.Add(time.Duration(grant.TTL) * time.Second)
	sess.wg.Add(2)
	go sess.keepAlive(deadline)
	go sess.watch(startRev)
	return sess, nil
}

// Holder returns the session's holder identity, nonce included.
func (s *Session) Holder() string { return s.holder }

// LeaseID returns the session's etcd lease.
func (s *Session) LeaseID() clientv3.LeaseID { return s.id }

// Done is closed when the session ends.
func (s *Session) Done() <-chan struct{} { return s.ctx.Done() }

// Err returns nil while the session runs, and then why it ended:
// ErrSessionClosed or ErrSessionExpired (possibly wrapped with detail).
func (s *Session) Err() error {
	return token.Ended(s.ctx)
}

// Close releases every lease the session holds, revokes its etcd lease so
// that nothing it held outlives it, and stops its goroutines. Ending
// leases this way is not a clean release: a lease acquired with a
// lock-delay (WithLockDelay) stays unavailable for its delay; release it
// with Lease.Release first to free it at once. ctx bounds
// the release and revoke; the goroutines stop regardless. Close is
// idempotent; after the first call it returns nil.
func (s *Session) Close(ctx context.Context) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	s.end(ErrSessionClosed)
	_, err := s.store.cli.Revoke(ctx, s.id)
	s.wg.Wait()
	if err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return fmt.Errorf("etcdstore: revoke session lease: %w", err)
	}
	return nil
}

// end stops the session and every lease it holds with reason. The first
// reason wins.
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

// keepAlive renews the etcd lease every TTL/3 and ends the session when
// the local deadline passes without a successful renewal, or when etcd
// reports the lease gone. After a failed renewal it tries again sooner,
// with backoff (newKeepAliveBackOff), so that a session outlives an
// outage that ends well within its TTL.
func (s *Session) keepAlive(deadline time.Time) {
	defer s.wg.Done()
	interval := s.ttl / 3
	retry := newKeepAliveBackOff(s.ttl)
	failed := false
	tick := s.clock.NewTimer(interval)
	expire := s.clock.NewTimer(deadline.Sub(s.clock.Now()))
	defer func() {
		tick.Stop()
		expire.Stop()
	}()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-expire.C():
			s.end(fmt.Errorf("%w: no keepalive succeeded within the %s TTL", ErrSessionExpired, s.ttl))
			return
		case <-tick.C():
		}
		sent := s.clock.Now()
		resp, err, expired := s.keepAliveOnce(interval, expire)
		switch {
		case expired:
			s.end(fmt.Errorf("%w: no keepalive succeeded within the %s TTL", ErrSessionExpired, s.ttl))
			return
		case errors.Is(err, rpctypes.ErrLeaseNotFound):
			s.end(fmt.Errorf("%w: etcd lease %x not found", ErrSessionExpired, s.id))
			return
		case err == nil && resp.TTL > 0:
			deadline = sent.Add(time.Duration(resp.TTL) * time.Second)
			expire.Stop()
			expire.Reset(deadline.Sub(s.clock.Now()))
			retry.Reset()
			if failed {
				failed = false
				select {
				case s.renewed <- struct{}{}:
				default:
				}
			}
			tick.Reset(interval)
			continue
		}
		failed = true
		tick.Reset(min(retry.NextBackOff(), interval))
	}
}

// newKeepAliveBackOff paces the renewals after a failed one: the first
// after 200 ms, each next one after twice as long, up to a tenth of the
// TTL (at least 200 ms), each drawn at random from ±50% of its nominal
// value, and never later than the next regular renewal. A session thus
// renews within about a tenth of its TTL of etcd coming back, and sessions
// that failed together do not retry in lockstep.
func newKeepAliveBackOff(ttl time.Duration) backoff.BackOff {
	return &backoff.ExponentialBackOff{
		InitialInterval:     200 * time.Millisecond,
		RandomizationFactor: 0.5,
		Multiplier:          2,
		MaxInterval:         max(ttl/10, 200*time.Millisecond),
	}
}

// keepAliveOnce sends one keepalive, giving up after timeout, when the
// session ends, or when expire fires first (expired is then true).
func (s *Session) keepAliveOnce(timeout time.Duration, expire clock.Timer) (resp *clientv3.LeaseKeepAliveResponse, err error, expired bool) {
	ctx, cancel := context.WithTimeout(s.ctx, timeout)
	defer cancel()
	type result struct {
		resp *clientv3.LeaseKeepAliveResponse
		err  error
	}
	done := make(chan result, 1)
	go func() {
		r, err := s.store.cli.KeepAliveOnce(ctx, s.id)
		done <- result{r, err}
	}()
	select {
	case r := <-done:
		return r.resp, r.err, false
	case <-expire.C():
		cancel()
		<-done
		return nil, nil, true
	}
}
