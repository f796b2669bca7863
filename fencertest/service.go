package fencertest

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/fencer-dev/fencer/client"
	"github.com/fencer-dev/fencer/etcdstore"
	"github.com/fencer-dev/fencer/internal/testkit/testca"
	"github.com/fencer-dev/fencer/server"
)

// RunningService is an in-process fencer service (what fencer serve runs)
// on a loopback port, and a Go client connected to it. Service starts one.
type RunningService struct {
	// Addr is the server's "host:port" on 127.0.0.1.
	Addr string
	// Store is the store the server serves. Pass it to Supersede to
	// supersede a client's lease.
	Store *etcdstore.Store
	// Server is the running server.
	Server *server.Server
	// Client is connected to the server with the credentials of the
	// options (plaintext and anonymous by default).
	Client *client.Client

	dial []grpc.DialOption
}

// ServiceOption configures Service.
type ServiceOption func(*serviceConfig)

type serviceConfig struct {
	store      *etcdstore.Store
	auth       server.Authenticator
	authz      *server.Authorization
	tls        bool
	clientCert string
	bearer     string
	principal  string
	clientOpts []client.Option
}

// WithStore serves st instead of a Store on a fresh etcd member of the
// service's own.
func WithStore(st *etcdstore.Store) ServiceOption {
	return func(c *serviceConfig) { c.store = st }
}

// WithTLS serves TLS with a certificate for 127.0.0.1 from a certificate
// authority made for the service alone; the client trusts only that
// authority.
func WithTLS() ServiceOption {
	return func(c *serviceConfig) { c.tls = true }
}

// WithBearerToken makes the server authenticate calls by bearer token and
// gives the client a random token of principal. Over plaintext the client
// sends it anyway, as fencer's tests do on loopback.
func WithBearerToken(principal string) ServiceOption {
	return func(c *serviceConfig) { c.principal, c.bearer = principal, randomToken() }
}

// WithClientCert serves mutual TLS (it implies WithTLS): the server
// requires a client certificate of the service's authority and takes its
// common name as the principal, and the client presents one for principal.
func WithClientCert(principal string) ServiceOption {
	return func(c *serviceConfig) { c.tls, c.clientCert = true, principal }
}

// WithAuthorization makes the server grant principals only what a grants.
// Without it the service lets every principal use every lease name, data
// key and resource, also with WithBearerToken or WithClientCert: what
// fencer serve does only when told so with --authz-allow-all (it refuses
// to start with authentication and neither that flag nor --authz-file).
// A test kit allows all so that a test of fencing needs no grants; a test
// of grants passes WithAuthorization.
func WithAuthorization(a *server.Authorization) ServiceOption {
	return func(c *serviceConfig) { c.authz = a }
}

// WithClientOptions passes opts to the client (client.New).
func WithClientOptions(opts ...client.Option) ServiceOption {
	return func(c *serviceConfig) { c.clientOpts = append(c.clientOpts, opts...) }
}

// anonymous is the principal of every call to a service made without
// WithBearerToken or WithClientCert.
const anonymous = "fencertest"

// Service starts a fencer service configured by opts, and a client of
// it, and stops both when t ends: the client's connection is closed and the
// server shut down gracefully. Without WithStore, the service serves a
// Store on a fresh etcd member (see Store).
//
// Without WithBearerToken or WithClientCert every call is the principal
// "fencertest" (server.Anonymous). Without WithAuthorization every
// principal may use every name, authenticated or not (see
// WithAuthorization). Service does not check that the options make sense
// together beyond what server.Config.Validate checks.
func Service(t TB, opts ...ServiceOption) *RunningService {
	t.Helper()
	var c serviceConfig
	for _, opt := range opts {
		opt(&c)
	}
	if c.store == nil {
		c.store = Store(t)
	}
	cfg := server.Config{Store: c.store, Authenticator: server.Anonymous(anonymous), Authorization: c.authz}
	var dial []grpc.DialOption
	transport := insecure.NewCredentials()
	if c.tls {
		ca := testca.New(t, "fencertest")
		cfg.TLS = &tls.Config{Certificates: []tls.Certificate{ca.ServerCert(t)}, MinVersion: tls.VersionTLS13}
		clientTLS := &tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS13}
		if c.clientCert != "" {
			cfg.TLS.ClientCAs = ca.Pool()
			cfg.TLS.ClientAuth = tls.RequireAndVerifyClientCert
			cfg.Authenticator = server.ClientCertificates{}
			clientTLS.Certificates = []tls.Certificate{ca.ClientCert(t, c.clientCert)}
		}
		transport = credentials.NewTLS(clientTLS)
	}
	dial = append(dial, grpc.WithTransportCredentials(transport))
	if c.bearer != "" {
		auth, err := server.NewBearerTokens(map[string]string{c.bearer: c.principal})
		if err != nil {
			t.Fatalf("fencertest: bearer token: %v", err)
		}
		cfg.Authenticator = auth
		dial = append(dial, grpc.WithPerRPCCredentials(client.BearerToken(c.bearer, c.tls)))
	}
	addr, srv := Serve(t, cfg)
	s := &RunningService{Addr: addr, Store: c.store, Server: srv, dial: dial}
	s.Client = s.Dial(t, c.clientOpts...)
	return s
}

// Dial returns another client of s, on a connection of its own with the
// credentials of s.Client, that is closed when t ends.
func (s *RunningService) Dial(t TB, opts ...client.Option) *client.Client {
	t.Helper()
	cc, err := grpc.NewClient(s.Addr, s.dial...)
	if err != nil {
		t.Fatalf("fencertest: dial %s: %v", s.Addr, err)
	}
	t.Cleanup(func() { cc.Close() })
	return client.New(cc, opts...)
}

// Serve serves cfg on a free loopback port until t ends, then shuts the
// server down gracefully (within Timeout), and returns its address and the
// server, as httptest.NewServer does for HTTP.
func Serve(t TB, cfg server.Config) (string, *server.Server) {
	t.Helper()
	srv, err := server.New(cfg)
	if err != nil {
		t.Fatalf("fencertest: serve: %v", err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("fencertest: serve: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(lis) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
	})
	return lis.Addr().String(), srv
}

// randomToken returns a bearer token of 32 random hex digits.
func randomToken() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return hex.EncodeToString(b)
}
