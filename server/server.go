package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	"github.com/fencer-dev/fencer/etcdstore"
	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
)

// Config configures a Server. Store and Authenticator are required.
type Config struct {
	// Store is the etcd store the server serves. The server does not
	// close its client.
	Store *etcdstore.Store
	// Authenticator decides each call's principal. Use Anonymous only where
	// every caller is trusted.
	Authenticator Authenticator
	// TLS, when set, is the server's TLS configuration and must provide a
	// certificate (Certificates, GetCertificate or GetConfigForClient).
	// For mutual TLS set ClientCAs and ClientAuth to
	// tls.RequireAndVerifyClientCert: clients without a certificate that
	// verifies are then refused during the handshake, before any call. Nil
	// serves plaintext. The server does not reload certificates itself; use
	// GetCertificate (e.g. controller-runtime's certwatcher) to rotate its
	// certificate, and CAFile.ServerConfig to rotate the client CA bundle.
	TLS *tls.Config
	// Logger receives the server's logs; nil discards them.
	Logger *slog.Logger
	// ReadinessInterval is how often the server checks that etcd answers a
	// linearizable read (within 2 seconds) to set its health and
	// readiness; zero means DefaultReadinessInterval.
	ReadinessInterval time.Duration
	// Authorization, when set, grants each principal the lease names,
	// data keys and resources it may use; calls outside them fail with
	// PERMISSION_DENIED. Nil lets every authenticated principal use every
	// name (tokens and sessions stay bound to their principal either way).
	// The server does not refuse nil with an Authenticator that tells
	// principals apart; fencer serve does, unless --authz-allow-all.
	Authorization *Authorization
	// Collectors are more Prometheus metrics that MetricsHandler serves
	// beside the server's own (fencer serve adds the embedded etcd
	// member's). New fails if one clashes with the server's or another's.
	Collectors []prometheus.Collector
}

// Validate reports whether c can make a Server: Store and Authenticator
// are set, TLS (if set) has a certificate, and ClientCertificates is used
// only with TLS that verifies client certificates
// (tls.VerifyClientCertIfGiven or tls.RequireAndVerifyClientCert). It does
// not load or check the certificates themselves.
func (c Config) Validate() error {
	switch {
	case c.Store == nil:
		return errors.New("server: config: Store is required")
	case c.Authenticator == nil:
		return errors.New("server: config: Authenticator is required (Anonymous admits everyone)")
	case c.TLS != nil && len(c.TLS.Certificates) == 0 && c.TLS.GetCertificate == nil && c.TLS.GetConfigForClient == nil:
		return errors.New("server: config: TLS has no certificate")
	case c.ReadinessInterval < 0:
		return errors.New("server: config: ReadinessInterval is negative")
	}
	switch c.Authenticator.(type) {
	case ClientCertificates, *ClientCertificates:
		if c.TLS == nil || (c.TLS.ClientAuth != tls.VerifyClientCertIfGiven && c.TLS.ClientAuth != tls.RequireAndVerifyClientCert) {
			return errors.New("server: config: ClientCertificates needs TLS with ClientAuth VerifyClientCertIfGiven or RequireAndVerifyClientCert")
		}
	}
	return nil
}

// Server serves fencer.v1.FencerService over an etcdstore.Store, together
// with grpc.health.v1 and server reflection.
//
// The server keeps no state that another server needs: a session is an
// etcd lease plus a key naming its principal, so any number of servers in
// front of one etcd cluster can serve the same clients, and a client may
// switch servers between calls. What a server caches (which principal holds
// a token) is immutable in etcd for the token's lifetime.
//
// It does not retry etcd operations: a call that etcd did not answer fails
// with STORE_UNAVAILABLE, and a write that fails so may or may not have
// committed. Retrying a guarded write with the same token is safe in the
// sense that it can only commit while the token is current.
type Server struct {
	fencerv1.UnimplementedFencerServiceServer

	store  *etcdstore.Store
	cli    *clientv3.Client
	auth   Authenticator
	authz  *Authorization
	log    *slog.Logger
	audit  *slog.Logger // log with audit=true
	grpc   *grpc.Server
	health *health.Server
	m      *metrics
	owners ownerCache
	hub    *leaseHub
	ended  *sessionWatch
	// releasing: this server's releases, not to be recorded as losses
	releasing releases
	// members: the ring members whose JoinRing streams this server runs
	members ringMembers
	// ringShards: each ring's shards, as read once
	ringShards ringShardSets

	stopped context.Context    // ended by Shutdown, which ends the streams; a signal, no call runs under it
	halt    context.CancelFunc // ends stopped

	readyEvery time.Duration
	readyOnce  sync.Once     // starts the readiness checks, in Serve
	readyDone  chan struct{} // closed when the readiness checks end
	ready      atomic.Bool   // the last readiness check passed
	checked    atomic.Bool   // a readiness check has run
}

var _ fencerv1.FencerServiceServer = (*Server)(nil)

// New returns a Server for cfg. It starts nothing; call Serve.
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{
		store:  cfg.Store,
		cli:    cfg.Store.Client(),
		auth:   cfg.Authenticator,
		authz:  cfg.Authorization,
		log:    log,
		audit:  log.With(slog.Bool("audit", true)),
		health: health.NewServer(),
		m:      newMetrics(),

		readyEvery: cfg.ReadinessInterval,
		readyDone:  make(chan struct{}),
	}
	s.stopped, s.halt = context.WithCancel(context.Background())
	if s.readyEvery == 0 {
		s.readyEvery = DefaultReadinessInterval
	}
	for _, c := range cfg.Collectors {
		if err := s.m.reg.Register(c); err != nil {
			return nil, fmt.Errorf("server: config: Collectors: %w", err)
		}
	}
	s.hub = newLeaseHub(cfg.Store, s.m)
	s.hub.onLoss = s.recordLoss
	s.ended = newSessionWatch(s.cli, s.sessionsPrefix())
	opts := []grpc.ServerOption{
		// grpc-middleware's metrics see the status that fencer's own
		// interceptor makes of each error.
		grpc.ChainUnaryInterceptor(s.m.grpc.UnaryServerInterceptor(), s.unaryInterceptor),
		grpc.ChainStreamInterceptor(s.m.grpc.StreamServerInterceptor(), s.streamInterceptor),
		grpc.MaxRecvMsgSize(MaxRequestBytes),
		// Find clients that vanished, so their streams end.
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
	}
	if cfg.TLS != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(cfg.TLS)))
	}
	s.grpc = grpc.NewServer(opts...)
	fencerv1.RegisterFencerServiceServer(s.grpc, s)
	healthpb.RegisterHealthServer(s.grpc, s.health)
	reflection.Register(s.grpc)
	s.m.grpc.InitializeMetrics(s.grpc)
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	s.health.SetServingStatus(fencerv1.FencerService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_NOT_SERVING)
	return s, nil
}

// Serve serves gRPC on lis until Shutdown. It returns nil after Shutdown.
// The first Serve also starts checking etcd every
// Config.ReadinessInterval: health (the service "" and
// fencer.v1.FencerService) is NOT_SERVING until a check passes, and
// follows the checks until Shutdown.
func (s *Server) Serve(lis net.Listener) error {
	s.readyOnce.Do(func() { go s.readiness(s.readyEvery) })
	if err := s.grpc.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("server: serve: %w", err)
	}
	return nil
}

// Shutdown stops the server gracefully: health turns NOT_SERVING, streams
// (KeepAlive, WatchLease, waiting Acquires) end with SHUTTING_DOWN so their
// clients move to another server, and unary calls in flight finish. If ctx
// ends first, remaining calls are cut off and ctx's error is returned.
// Sessions are not ended: they live in etcd and expire on their TTL unless
// a client renews them through another server.
func (s *Server) Shutdown(ctx context.Context) error {
	s.health.Shutdown()
	s.halt()
	done := make(chan struct{})
	go func() {
		s.grpc.GracefulStop()
		close(done)
	}()
	s.readyOnce.Do(func() { close(s.readyDone) })
	defer func() { <-s.readyDone }()
	select {
	case <-done:
		s.hub.close()
		s.ended.close()
		return nil
	case <-ctx.Done():
		s.grpc.Stop()
		<-done
		s.hub.close()
		s.ended.close()
		return ctx.Err()
	}
}

// MetricsHandler serves the server's Prometheus metrics.
func (s *Server) MetricsHandler() http.Handler { return s.m.handler() }

func (s *Server) unaryInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if public(info.FullMethod) {
		return handler(ctx, req)
	}
	start := time.Now()
	p, err := s.auth.Authenticate(ctx)
	if err == nil {
		err = s.authz.authorize(p, req)
	}
	var resp any
	if err == nil {
		ctx = withPrincipal(etcdContext(ctx), p)
		resp, err = handler(ctx, req)
		err = s.hideOthers(ctx, p, req, err)
	}
	err = toStatus(err)
	s.logCall(ctx, info.FullMethod, p, err, time.Since(start))
	return resp, err
}

func (s *Server) streamInterceptor(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if public(info.FullMethod) {
		// Health watches would otherwise hold graceful shutdown for
		// as long as their clients stay.
		ctx, cancel := context.WithCancel(ss.Context())
		go func() {
			select {
			case <-s.stopped.Done():
			case <-ctx.Done():
			}
			cancel()
		}()
		err := handler(srv, &ctxStream{ServerStream: ss, ctx: ctx})
		cancel()
		return err
	}
	start := time.Now()
	p, err := s.auth.Authenticate(ss.Context())
	if err == nil {
		ctx := ss.Context()
		if r, ok := s.auth.(revocable); ok {
			var stop func()
			ctx, stop = r.whileValid(ctx, p)
			defer stop()
		}
		err = handler(srv, &ctxStream{ServerStream: ss, ctx: withPrincipal(etcdContext(ctx), p)})
		// A stream Shutdown ended has sent SHUTTING_DOWN (a KeepAlive
		// stream's streamGate writes it at once): a withdrawal after that
		// does not change what the client was told.
		if cause := revoked(ctx); cause != nil && !errors.Is(err, ErrShuttingDown) {
			err = cause
		}
	}
	if errors.Is(err, io.EOF) {
		err = nil
	}
	err = toStatus(err)
	s.logCall(ss.Context(), info.FullMethod, p, err, time.Since(start))
	return err
}

// revoked returns the cause that ended ctx if it ended because the
// credentials of its stream were withdrawn (see revocable), else nil.
func revoked(ctx context.Context) error {
	if cause := context.Cause(ctx); errors.Is(cause, ErrUnauthenticated) {
		return cause
	}
	return nil
}

// logCall logs a finished call of an authenticated method: failures that
// point at the server or etcd (INTERNAL, UNAVAILABLE, DEADLINE_EXCEEDED)
// at error or warn, refused credentials at info, everything else at debug.
// Token refusals have their audit records (see rejected).
func (s *Server) logCall(ctx context.Context, method, principal string, err error, d time.Duration) {
	code := status.Code(err)
	level := slog.LevelDebug
	switch code {
	case codes.Internal, codes.Unknown, codes.DataLoss:
		level = slog.LevelError
	case codes.Unavailable, codes.DeadlineExceeded:
		level = slog.LevelWarn
	case codes.Unauthenticated, codes.PermissionDenied:
		level = slog.LevelInfo
	}
	if !s.log.Enabled(ctx, level) {
		return
	}
	attrs := []slog.Attr{slog.String("method", path.Base(method)), slog.String("code", code.String()), slog.Duration("duration", d)}
	if principal != "" {
		attrs = append(attrs, slog.String("principal", principal))
	}
	if err != nil {
		attrs = append(attrs, slog.String("err", status.Convert(err).Message()))
	}
	s.log.LogAttrs(ctx, level, "call", attrs...)
}

// etcdContext marks ctx, which a call's etcd requests use, to require an
// etcd leader: a member without one refuses at once with "no leader"
// (UNAVAILABLE) instead of holding writes until its request timeout and
// reads until the caller's deadline.
func etcdContext(ctx context.Context) context.Context { return clientv3.WithRequireLeader(ctx) }

// ctxStream replaces a stream's context: with one that carries the
// authenticated principal, or one that ends on Shutdown.
type ctxStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (p *ctxStream) Context() context.Context { return p.ctx }
