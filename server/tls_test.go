package server_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"testing"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/fencer-dev/fencer/client"
	"github.com/fencer-dev/fencer/etcdstore"
	"github.com/fencer-dev/fencer/fencertest"
	"github.com/fencer-dev/fencer/internal/testkit/testca"
	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
	"github.com/fencer-dev/fencer/server"
)

// tlsCreds returns client transport credentials that trust roots (nil:
// the system's roots) and present certs.
func tlsCreds(roots *x509.CertPool, certs ...tls.Certificate) grpc.DialOption {
	return grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
		RootCAs:      roots,
		Certificates: certs,
		ServerName:   "localhost",
		MinVersion:   tls.VersionTLS12,
	}))
}

// bearer returns per-call credentials for tok that grpc sends only over TLS.
func bearer(tok string) grpc.DialOption {
	return grpc.WithPerRPCCredentials(client.BearerToken(tok, true))
}

// keys returns the mod revision of every key under st's prefix, to show
// that a call wrote nothing there.
func keys(t *testing.T, st *etcdstore.Store) map[string]int64 {
	t.Helper()
	resp, err := st.Client().Get(fencertest.Context(t), st.Prefix(), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	require.NoError(t, err)
	out := make(map[string]int64, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		out[string(kv.Key)] = kv.ModRevision
	}
	return out
}

// requireRejected checks that an Acquire through cc fails with code and
// writes nothing.
func requireRejected(t *testing.T, st *etcdstore.Store, cc *grpc.ClientConn, code codes.Code) {
	t.Helper()
	before := keys(t, st)
	_, err := fencerv1.NewFencerServiceClient(cc).Acquire(fencertest.Context(t), &fencerv1.AcquireRequest{Name: "rejected"})
	require.Equal(t, code, status.Code(err), "%v", err)
	require.Equal(t, before, keys(t, st), "a rejected call wrote to etcd")
}

func TestTLSWithBearerTokens(t *testing.T) {
	ctx := fencertest.Context(t)
	ca := testca.New(t, "fencer test CA")
	st := fencertest.SharedStore(t)
	auth, err := server.NewBearerTokens(testTokens)
	require.NoError(t, err)
	addr, _ := serve(t, server.Config{Store: st, Authenticator: auth, TLS: &tls.Config{
		Certificates: []tls.Certificate{ca.ServerCert(t)},
		MinVersion:   tls.VersionTLS12,
	}})

	t.Run("client trusting the CA", func(t *testing.T) {
		c := client.New(dialWith(t, []grpc.DialOption{tlsCreds(ca.Pool()), bearer(alice)}, addr))
		l, err := newSession(t, c).Acquire(ctx, "tls")
		require.NoError(t, err)
		_, err = c.Put(ctx, l.Token(), "k", []byte("v"))
		require.NoError(t, err)
		v, found, err := c.Get(ctx, "k")
		require.NoError(t, err)
		require.True(t, found)
		require.Equal(t, "v", string(v.Data))
		list, err := c.List(ctx)
		require.NoError(t, err)
		require.Contains(t, list[0].Holder, "alice/")
	})
	t.Run("principals stay apart over TLS", func(t *testing.T) {
		requirePrincipalsIsolated(t,
			dialWith(t, []grpc.DialOption{tlsCreds(ca.Pool()), bearer(alice)}, addr), "alice",
			dialWith(t, []grpc.DialOption{tlsCreds(ca.Pool()), bearer(bob)}, addr))
	})
	rejected := map[string]struct {
		opts []grpc.DialOption
		code codes.Code
	}{
		"client without the CA":               {[]grpc.DialOption{tlsCreds(nil), bearer(alice)}, codes.Unavailable},
		"client trusting another CA":          {[]grpc.DialOption{tlsCreds(testca.New(t, "other CA").Pool()), bearer(alice)}, codes.Unavailable},
		"plaintext client":                    {[]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, codes.Unavailable},
		"unknown bearer token over TLS":       {[]grpc.DialOption{tlsCreds(ca.Pool()), bearer("not-a-known-token-at-all")}, codes.Unauthenticated},
		"no bearer token over TLS":            {[]grpc.DialOption{tlsCreds(ca.Pool())}, codes.Unauthenticated},
		"client certificate, no bearer token": {[]grpc.DialOption{tlsCreds(ca.Pool(), ca.ClientCert(t, "alice"))}, codes.Unauthenticated},
	}
	for name, tc := range rejected {
		t.Run(name, func(t *testing.T) { requireRejected(t, st, dialWith(t, tc.opts, addr), tc.code) })
	}
}

func TestBearerTokenNotSentInPlaintext(t *testing.T) {
	// client.BearerToken(tok, true) makes grpc refuse a plaintext
	// connection outright, so the token never leaves the process.
	_, err := grpc.NewClient("passthrough:///127.0.0.1:1", grpc.WithTransportCredentials(insecure.NewCredentials()), bearer(alice))
	require.Error(t, err)
}

func TestMutualTLS(t *testing.T) {
	ca := testca.New(t, "fencer test CA")
	st := fencertest.SharedStore(t)
	mtls := &tls.Config{
		Certificates: []tls.Certificate{ca.ServerCert(t)},
		ClientCAs:    ca.Pool(),
		ClientAuth:   tls.RequireAndVerifyClientCert,
		MinVersion:   tls.VersionTLS12,
	}
	addr, _ := serve(t, server.Config{Store: st, Authenticator: server.ClientCertificates{}, TLS: mtls})
	withCert := func(t *testing.T, cn string) *grpc.ClientConn {
		return dialWith(t, []grpc.DialOption{tlsCreds(ca.Pool(), ca.ClientCert(t, cn))}, addr)
	}

	t.Run("principal from the certificate", func(t *testing.T) {
		requirePrincipalsIsolated(t, withCert(t, "alice"), "alice", withCert(t, "bob"))
	})
	t.Run("TLS 1.2", func(t *testing.T) {
		cc := dialWith(t, []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
			RootCAs: ca.Pool(), Certificates: []tls.Certificate{ca.ClientCert(t, "carol")}, ServerName: "localhost",
			MinVersion: tls.VersionTLS12, MaxVersion: tls.VersionTLS12,
		}))}, addr)
		resp, err := fencerv1.NewFencerServiceClient(cc).Acquire(fencertest.Context(t), &fencerv1.AcquireRequest{Name: "tls12"})
		require.NoError(t, err)
		require.Contains(t, resp.GetHolder(), "carol/")
	})
	other := testca.New(t, "other CA")
	rejected := map[string]struct {
		opts []grpc.DialOption
		code codes.Code
	}{
		"no client certificate":               {[]grpc.DialOption{tlsCreds(ca.Pool())}, codes.Unavailable},
		"no client certificate, bearer token": {[]grpc.DialOption{tlsCreds(ca.Pool()), bearer(alice)}, codes.Unavailable},
		"certificate from another CA":         {[]grpc.DialOption{tlsCreds(ca.Pool(), other.ClientCert(t, "alice"))}, codes.Unavailable},
		"server certificate as client":        {[]grpc.DialOption{tlsCreds(ca.Pool(), ca.ServerCert(t))}, codes.Unavailable},
		"common name with a space":            {[]grpc.DialOption{tlsCreds(ca.Pool(), ca.ClientCert(t, "alice smith"))}, codes.Unauthenticated},
		"common name with a slash":            {[]grpc.DialOption{tlsCreds(ca.Pool(), ca.ClientCert(t, "alice/x"))}, codes.Unauthenticated},
		"empty common name":                   {[]grpc.DialOption{tlsCreds(ca.Pool(), ca.ClientCert(t, ""))}, codes.Unauthenticated},
		"client without the server's CA":      {[]grpc.DialOption{tlsCreds(other.Pool(), ca.ClientCert(t, "alice"))}, codes.Unavailable},
	}
	for name, tc := range rejected {
		t.Run(name, func(t *testing.T) { requireRejected(t, st, dialWith(t, tc.opts, addr), tc.code) })
	}
}

func TestMutualTLSWithBearerTokens(t *testing.T) {
	// Client certificates gate the connection; the bearer token names the
	// principal (fencer serve --tls-client-ca with --token-file).
	ca := testca.New(t, "fencer test CA")
	st := fencertest.SharedStore(t)
	auth, err := server.NewBearerTokens(testTokens)
	require.NoError(t, err)
	addr, _ := serve(t, server.Config{Store: st, Authenticator: auth, TLS: &tls.Config{
		Certificates: []tls.Certificate{ca.ServerCert(t)},
		ClientCAs:    ca.Pool(),
		ClientAuth:   tls.RequireAndVerifyClientCert,
		MinVersion:   tls.VersionTLS12,
	}})
	// The certificate says alice, the token says bob: the token wins.
	cc := dialWith(t, []grpc.DialOption{tlsCreds(ca.Pool(), ca.ClientCert(t, "alice")), bearer(bob)}, addr)
	resp, err := fencerv1.NewFencerServiceClient(cc).Acquire(fencertest.Context(t), &fencerv1.AcquireRequest{Name: "both"})
	require.NoError(t, err)
	require.Contains(t, resp.GetHolder(), "bob/")
	requireRejected(t, st, dialWith(t, []grpc.DialOption{tlsCreds(ca.Pool(), ca.ClientCert(t, "alice"))}, addr), codes.Unauthenticated)
	requireRejected(t, st, dialWith(t, []grpc.DialOption{tlsCreds(ca.Pool()), bearer(bob)}, addr), codes.Unavailable)
}

func TestConfigValidate(t *testing.T) {
	st := fencertest.SharedStore(t)
	ca := testca.New(t, "fencer test CA")
	cert := []tls.Certificate{ca.ServerCert(t)}
	anon := server.Anonymous("anyone")
	cases := map[string]struct {
		cfg server.Config
		ok  bool
	}{
		"plaintext anonymous":        {server.Config{Store: st, Authenticator: anon}, true},
		"no store":                   {server.Config{Authenticator: anon}, false},
		"no authenticator":           {server.Config{Store: st}, false},
		"TLS without a certificate":  {server.Config{Store: st, Authenticator: anon, TLS: &tls.Config{}}, false},
		"TLS with GetCertificate":    {server.Config{Store: st, Authenticator: anon, TLS: &tls.Config{GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return &cert[0], nil }}}, true},
		"client certs in plaintext":  {server.Config{Store: st, Authenticator: server.ClientCertificates{}}, false},
		"client certs not requested": {server.Config{Store: st, Authenticator: server.ClientCertificates{}, TLS: &tls.Config{Certificates: cert}}, false},
		"client certs not verified":  {server.Config{Store: st, Authenticator: server.ClientCertificates{}, TLS: &tls.Config{Certificates: cert, ClientAuth: tls.RequireAnyClientCert}}, false},
		"client certs if given":      {server.Config{Store: st, Authenticator: server.ClientCertificates{}, TLS: &tls.Config{Certificates: cert, ClientCAs: ca.Pool(), ClientAuth: tls.VerifyClientCertIfGiven}}, true},
		"client certs required":      {server.Config{Store: st, Authenticator: server.ClientCertificates{}, TLS: &tls.Config{Certificates: cert, ClientCAs: ca.Pool(), ClientAuth: tls.RequireAndVerifyClientCert}}, true},
		"client certs without a CA":  {server.Config{Store: st, Authenticator: server.ClientCertificates{}, TLS: &tls.Config{Certificates: cert, ClientAuth: tls.RequireAndVerifyClientCert}}, true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if tc.ok {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			_, nerr := server.New(tc.cfg)
			require.Error(t, nerr)
		})
	}
}

func TestClientCertificatesNeedsAVerifiedChain(t *testing.T) {
	// A certificate the TLS layer did not verify names nobody.
	ca := testca.New(t, "fencer test CA")
	leaf, err := x509.ParseCertificate(ca.ClientCert(t, "alice").Certificate[0])
	require.NoError(t, err)
	for name, ctx := range map[string]context.Context{
		"no peer":        context.Background(),
		"plaintext peer": peerContext(nil),
		"unverified":     peerContext(&tls.ConnectionState{PeerCertificates: []*x509.Certificate{leaf}}),
	} {
		t.Run(name, func(t *testing.T) {
			_, err := server.ClientCertificates{}.Authenticate(ctx)
			require.ErrorIs(t, err, server.ErrUnauthenticated)
		})
	}
	p, err := server.ClientCertificates{}.Authenticate(peerContext(&tls.ConnectionState{PeerCertificates: []*x509.Certificate{leaf}, VerifiedChains: [][]*x509.Certificate{{leaf}}}))
	require.NoError(t, err)
	require.Equal(t, "alice", p)
}

// peerContext returns a context whose peer has the TLS state st (nil: a
// plaintext peer).
func peerContext(st *tls.ConnectionState) context.Context {
	p := &peer.Peer{}
	if st != nil {
		p.AuthInfo = credentials.TLSInfo{State: *st}
	}
	return peer.NewContext(context.Background(), p)
}
