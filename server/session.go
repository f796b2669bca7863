package server

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencer-dev/fencer/etcdstore"
	"github.com/fencer-dev/fencer/internal/etcdcmp"
	"github.com/fencer-dev/fencer/internal/holderkey"
	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
	"github.com/fencer-dev/fencer/token"
)

// sessionKey is the service's own key under the store's prefix: one per
// remote session, attached to the session's etcd lease, naming the
// principal that opened it. Holder and epoch keys are etcdstore's.
func (s *Server) sessionKey(id clientv3.LeaseID) string {
	return s.sessionsPrefix() + fmt.Sprintf("%016x", int64(id))
}

// sessionsPrefix is the prefix of every sessionKey (and secretKey).
func (s *Server) sessionsPrefix() string { return s.store.Prefix() + "sessions/" }

// secretKey is the service's key beside sessionKey, on the same etcd
// lease, holding the SHA-256 of the session's secret (hex), which proves a
// clean release's caller to be the process that opened the session.
func (s *Server) secretKey(id clientv3.LeaseID) string { return s.sessionKey(id) + "/secret" }

// hashSecret is the text kept in the secret key for secret.
func hashSecret(secret []byte) string {
	sum := sha256.Sum256(secret)
	return hex.EncodeToString(sum[:])
}

// holderName is the holder identity of a remote session:
// "<principal>/<session id in hex>". Principals contain no "/", so the
// principal is everything before the last "/".
func holderName(principal string, id clientv3.LeaseID) string {
	return principal + "/" + fmt.Sprintf("%016x", int64(id))
}

// principalOfHolder returns the principal of a holder identity, or "" for
// a holder that did not acquire through the service.
func principalOfHolder(holder string) string {
	i := strings.LastIndexByte(holder, '/')
	if i <= 0 {
		return ""
	}
	return holder[:i]
}

// Acquire implements FencerService.Acquire.
func (s *Server) Acquire(ctx context.Context, req *fencerv1.AcquireRequest) (*fencerv1.AcquireResponse, error) {
	if err := validateAcquire(req); err != nil {
		return nil, err
	}
	p := principalOf(ctx)
	id := clientv3.LeaseID(req.GetSessionId())
	var ttl int64
	var secret []byte
	if id == 0 {
		ttl = req.GetTtlSeconds()
		if ttl == 0 {
			ttl = DefaultTTLSeconds
		}
		var err error
		if id, ttl, secret, err = s.openSession(ctx, p, ttl); err != nil {
			return nil, err
		}
	}
	keepAlive := ttl // a session this call opened is kept alive while Acquire waits
	tok, err := s.acquire(ctx, id, p, req.GetName(), time.Duration(req.GetLockDelaySeconds())*time.Second, req.GetWait(), keepAlive)
	if err != nil {
		if keepAlive > 0 {
			rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, _ = s.cli.Revoke(rctx, id)
			cancel()
		}
		return nil, err
	}
	s.m.acquisitions.Inc()
	s.audit.LogAttrs(ctx, slog.LevelInfo, "acquire", slog.String("principal", p), slog.String("lease", req.GetName()),
		slog.String("token", tok.String()), slog.String("holder", holderName(p, id)))
	return &fencerv1.AcquireResponse{SessionId: int64(id), TtlSeconds: ttl, Token: tok.String(), Holder: holderName(p, id), SessionSecret: secret}, nil
}

// openSession grants an etcd lease and records on it its principal and
// the hash of a new secret, which it returns.
func (s *Server) openSession(ctx context.Context, principal string, ttl int64) (clientv3.LeaseID, int64, []byte, error) {
	secret := make([]byte, SessionSecretLen)
	if _, err := rand.Read(secret); err != nil {
		return 0, 0, nil, fmt.Errorf("server: session secret: %w", err)
	}
	g, err := s.cli.Grant(ctx, ttl)
	if err != nil {
		return 0, 0, nil, fmt.Errorf("server: grant session lease: %w", err)
	}
	_, err = s.cli.Txn(ctx).Then(
		clientv3.OpPut(s.sessionKey(g.ID), principal, clientv3.WithLease(g.ID)),
		clientv3.OpPut(s.secretKey(g.ID), hashSecret(secret), clientv3.WithLease(g.ID)),
	).Commit()
	if err != nil {
		rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, _ = s.cli.Revoke(rctx, g.ID)
		cancel()
		return 0, 0, nil, fmt.Errorf("server: record session: %w", err)
	}
	s.m.sessions.Inc()
	return g.ID, g.TTL, secret, nil
}

// acquiredHook, set only by the package's tests, stops Acquire after the
// acquiring Txn and before the reply, where the holder key may be deleted
// before the client has the token (WatchLease must still report it).
var acquiredHook func(token.Token)

// acquire takes lease name for session id of principal through
// etcdstore's acquisition Txn, with the further condition that the session
// is the principal's. With wait it waits for the holder key's deletion and
// tries again (and waits out a lock-delay the same way); keepAlive > 0 renews the session meanwhile (for a session the
// call opened, whose client cannot renew it yet).
func (s *Server) acquire(ctx context.Context, id clientv3.LeaseID, principal, name string, lockDelay time.Duration, wait bool, keepAlive int64) (token.Token, error) {
	holder := holderName(principal, id)
	mine := etcdcmp.ValueIs(s.sessionKey(id), principal)
	for {
		tok, heldAt, err := s.store.AcquireOn(ctx, id, holder, name, lockDelay, mine)
		switch {
		case err == nil:
			s.owners.put(tok, principal)
			if h := acquiredHook; h != nil {
				h(tok)
			}
			return tok, nil
		case errors.Is(err, etcdstore.ErrCondition):
			_, err := s.checkSession(ctx, id, principal)
			if err == nil {
				continue // the session changed hands and back: try again
			}
			return token.Token{}, err
		case !wait || !errors.Is(err, token.ErrHeldByAnother) && !errors.Is(err, token.ErrLockDelay):
			return token.Token{}, err
		}
		if err := s.waitFree(ctx, name, heldAt, id, keepAlive); err != nil {
			return token.Token{}, err
		}
	}
}

// sessionOwner checks the session key read in kvs against principal.
func sessionOwner(kvs []*mvccpb.KeyValue, principal string) error {
	switch {
	case len(kvs) == 0:
		return ErrSessionNotFound
	case string(kvs[0].Value) != principal:
		return fmt.Errorf("%w: the session belongs to another principal", ErrPermissionDenied)
	}
	return nil
}

// checkHolderSession verifies, in one read, that session id exists, is
// principal's, and has secret as its secret: the proof of a clean release.
func (s *Server) checkHolderSession(ctx context.Context, id clientv3.LeaseID, principal string, secret []byte) error {
	resp, err := s.cli.Txn(ctx).Then(clientv3.OpGet(s.sessionKey(id)), clientv3.OpGet(s.secretKey(id))).Commit()
	if err != nil {
		return fmt.Errorf("server: read session: %w", err)
	}
	if err := sessionOwner(resp.Responses[0].GetResponseRange().Kvs, principal); err != nil {
		return err
	}
	kvs := resp.Responses[1].GetResponseRange().Kvs
	if len(kvs) == 0 || subtle.ConstantTimeCompare(kvs[0].Value, []byte(hashSecret(secret))) != 1 {
		return fmt.Errorf("%w: holder_session_secret is not the secret of session %d", ErrPermissionDenied, int64(id))
	}
	return nil
}

// checkSession verifies that session id exists and is principal's.
func (s *Server) checkSession(ctx context.Context, id clientv3.LeaseID, principal string) (int64, error) {
	resp, err := s.cli.Get(ctx, s.sessionKey(id))
	if err != nil {
		return 0, fmt.Errorf("server: read session: %w", err)
	}
	return resp.Header.Revision, sessionOwner(resp.Kvs, principal)
}

// waitFree waits until lease name is freed after rev (see
// etcdstore.Store.WaitFree), ctx ends or the server shuts down. keepAlive >
// 0 renews session id every keepAlive/3 seconds meanwhile.
func (s *Server) waitFree(ctx context.Context, name string, rev int64, id clientv3.LeaseID, keepAlive int64) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		select {
		case <-s.stopped.Done():
			cancel(ErrShuttingDown)
		case <-ctx.Done():
		}
	}()
	if keepAlive > 0 {
		stop := s.renew(ctx, id, keepAlive, func(err error) {
			cancel(fmt.Errorf("server: renew session while waiting: %w", err))
		})
		defer stop()
	}
	if err := s.store.WaitFree(ctx, name, rev); err != nil {
		if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
			return cause
		}
		return err
	}
	return nil
}

// renew renews session id every ttl/3 seconds until stop is called or ctx
// ends, for a session a call opened or is waiting on, whose client cannot
// renew it yet. A failed renewal is counted and passed to failed, if not
// nil; renewing goes on until ctx ends (failed may end it).
func (s *Server) renew(ctx context.Context, id clientv3.LeaseID, ttl int64, failed func(error)) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(time.Duration(ttl) * time.Second / 3)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if _, err := s.cli.KeepAliveOnce(ctx, id); err != nil && ctx.Err() == nil {
					s.m.keepAliveFailed(ctx, err)
					if failed != nil {
						failed(err)
					}
				}
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			cancel()
			<-done
		})
	}
}

// KeepAlive implements FencerService.KeepAlive. The handler waits in Recv
// and Send itself; Shutdown and withdrawn credentials end those waits
// through the stream's streamGate, so a stream costs one goroutine.
func (s *Server) KeepAlive(stream fencerv1.FencerService_KeepAliveServer) error {
	ctx := stream.Context()
	p := principalOf(ctx)
	g, ungate, err := s.gate(ctx)
	if err != nil {
		return err
	}
	defer ungate()
	verified := map[clientv3.LeaseID]bool{}
	for {
		var req *fencerv1.KeepAliveRequest
		if err := g.call(func() (err error) { req, err = stream.Recv(); return err }); err != nil {
			return err
		}
		if err := validateKeepAlive(req); err != nil {
			return err
		}
		id := clientv3.LeaseID(req.GetSessionId())
		if !verified[id] {
			apart(func() { _, err = s.checkSession(ctx, id, p) })
			if err != nil {
				if !errors.Is(err, ErrPermissionDenied) {
					s.m.keepAliveFailed(ctx, err)
				}
				return err
			}
			if len(verified) >= 1024 {
				clear(verified)
			}
			verified[id] = true
		}
		var resp *clientv3.LeaseKeepAliveResponse
		apart(func() { resp, err = s.cli.KeepAliveOnce(ctx, id) })
		if cause := revoked(ctx); cause != nil {
			return cause
		}
		if err != nil {
			s.m.keepAliveFailed(ctx, err)
		}
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return ErrSessionNotFound
		}
		if err != nil {
			return fmt.Errorf("server: keepalive: %w", err)
		}
		s.m.keepalives.Inc()
		if err := g.call(func() error {
			return stream.Send(&fencerv1.KeepAliveResponse{SessionId: int64(id), TtlSeconds: resp.TTL})
		}); err != nil {
			return err
		}
	}
}

// Release implements FencerService.Release.
func (s *Server) Release(ctx context.Context, req *fencerv1.ReleaseRequest) (*fencerv1.ReleaseResponse, error) {
	in, err := validateRelease(req)
	if err != nil {
		return nil, err
	}
	tok := in.Token()
	p := principalOf(ctx)
	if tok.IsZero() {
		id := clientv3.LeaseID(req.GetSessionId())
		if _, err := s.checkSession(ctx, id, p); errors.Is(err, ErrSessionNotFound) {
			return &fencerv1.ReleaseResponse{}, nil
		} else if err != nil {
			return nil, err
		}
		undo := s.releasing.mark(id)
		resp, err := s.cli.Revoke(ctx, id)
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			undo()
			return &fencerv1.ReleaseResponse{}, nil
		}
		if err != nil {
			undo()
			return nil, fmt.Errorf("server: revoke session: %w", err)
		}
		s.auditSessionRelease(ctx, p, id, resp.Header.Revision)
		return &fencerv1.ReleaseResponse{Released: true}, nil
	}
	if err := s.checkOwner(ctx, tok, p); errors.Is(err, token.ErrStale) {
		return &fencerv1.ReleaseResponse{}, nil
	} else if err != nil {
		return nil, err
	}
	id := clientv3.LeaseID(req.GetHolderSessionId())
	var cond []clientv3.Cmp
	if id != 0 {
		// The holder's clean release (ReleaseOn), which skips the
		// lock-delay, needs the session to be the caller's and the
		// secret to be its: compared in the release's own Txn, and read
		// (checkHolderSession) only when that Txn fails, to tell why. The
		// compare is of the secret's SHA-256, as stored, so its timing
		// tells nothing of the secret.
		cond = []clientv3.Cmp{
			etcdcmp.ValueIs(s.sessionKey(id), p),
			etcdcmp.ValueIs(s.secretKey(id), hashSecret(req.GetHolderSessionSecret())),
		}
	}
	released, err := s.release(ctx, in, id, cond)
	if err == nil && !released && id != 0 {
		if err := s.checkHolderSession(ctx, id, p, req.GetHolderSessionSecret()); errors.Is(err, ErrSessionNotFound) {
			return &fencerv1.ReleaseResponse{}, nil // its holder keys went with it
		} else if err != nil {
			return nil, err
		}
		// The session is the caller's: the release failed on its token or
		// holder key, or the session changed hands and back. Release as
		// checked.
		released, err = s.release(ctx, in, id, nil)
	}
	if err != nil {
		return nil, err
	}
	if released {
		s.audit.LogAttrs(ctx, slog.LevelInfo, "release", slog.String("principal", p), slog.String("lease", tok.Lease), slog.String("token", tok.String()))
	}
	return &fencerv1.ReleaseResponse{Released: released}, nil
}

// release runs the store's release of in (ReleaseOn of session id when
// it is not 0) under the further compares cond, and marks it as this
// server's while it runs, so that the holder-key watch does not record it
// as a loss.
func (s *Server) release(ctx context.Context, in etcdstore.Checked, id clientv3.LeaseID, cond []clientv3.Cmp) (bool, error) {
	undo := s.releasing.mark(in.Token().String())
	released, err := s.store.ReleaseChecked(ctx, in, id, cond...)
	if !released {
		undo() // a release that may have committed is then recorded as a loss too
	}
	return released, err
}

// auditSessionRelease writes the audit records of session id's release by
// principal, whose Revoke etcd applied at revision rev: one "release" per
// lease it dropped, with its token, read as the holder keys were just
// before (rev-1), and one "release session".
func (s *Server) auditSessionRelease(ctx context.Context, principal string, id clientv3.LeaseID, rev int64) {
	holder := holderName(principal, id)
	resp, err := s.cli.Get(ctx, holderkey.Key(s.store.Prefix(), ""), clientv3.WithPrefix(), clientv3.WithRev(rev-1))
	if err != nil {
		s.audit.LogAttrs(ctx, slog.LevelInfo, "release session", slog.String("principal", principal), slog.String("holder", holder),
			slog.String("err", "the leases it dropped could not be read: "+err.Error()))
		return
	}
	var leases []string
	for _, kv := range resp.Kvs {
		st, ok := holderkey.Parse(s.store.Prefix(), kv)
		if !ok || clientv3.LeaseID(kv.Lease) != id {
			continue
		}
		leases = append(leases, st.Name)
		s.audit.LogAttrs(ctx, slog.LevelInfo, "release", slog.String("principal", principal), slog.String("lease", st.Name),
			slog.String("token", st.Token.String()), slog.String("holder", holder), slog.Bool("session_release", true))
	}
	s.audit.LogAttrs(ctx, slog.LevelInfo, "release session", slog.String("principal", principal), slog.String("holder", holder),
		slog.Any("leases", leases))
}

// checkOwner verifies that tok was issued to principal. It returns a
// *token.StaleError when tok is no longer current (whoever it was issued
// to) and ErrPermissionDenied when it belongs to another principal. Only
// the store's guard decides whether a write commits; this check decides
// who may present the token.
func (s *Server) checkOwner(ctx context.Context, tok token.Token, principal string) error {
	owner, ok := s.owners.get(tok)
	if !ok {
		st, err := s.store.Status(ctx, tok.Lease)
		if err != nil {
			return fmt.Errorf("server: read holder of %q: %w", tok.Lease, err)
		}
		if st.Token.Revision != tok.Revision {
			return &token.StaleError{Token: tok, Newer: st.Token}
		}
		owner = principalOfHolder(st.Holder)
		s.owners.put(tok, owner)
	}
	if owner != principal {
		return fmt.Errorf("%w: token %s is held by another principal", ErrPermissionDenied, tok)
	}
	return nil
}

// ownerCache remembers which principal acquired a token. A holder key's
// record never changes while its create revision stays the same, so an
// entry never goes stale in a way that matters: once the key is replaced
// the token is stale and the store's guard rejects it. The cache is bounded
// and simply emptied when full. It keeps the principal, the string the
// authenticator gave the call (shared by a principal's calls), rather
// than the holder name, which would be a string per token.
type ownerCache struct {
	mu sync.Mutex
	m  map[ownerKey]string
}

type ownerKey struct {
	lease string
	rev   int64
}

const ownerCacheSize = 1 << 16

func (c *ownerCache) get(tok token.Token) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	h, ok := c.m[ownerKey{tok.Lease, tok.Revision}]
	return h, ok
}

func (c *ownerCache) put(tok token.Token, principal string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil || len(c.m) >= ownerCacheSize {
		c.m = make(map[ownerKey]string)
	}
	c.m[ownerKey{tok.Lease, tok.Revision}] = principal
}
