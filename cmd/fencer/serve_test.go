package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"

	"github.com/fencer-dev/fencer/etcdstore"
	"github.com/fencer-dev/fencer/internal/freeport"
	"github.com/fencer-dev/fencer/internal/testkit/testca"
	"github.com/fencer-dev/fencer/server"
)

// pki is a CA with a serving key pair, client key pairs for alice and bob
// and a token file, written to a test directory.
type pki struct {
	ca                    *testca.CA
	caFile                string
	serverCert, serverKey string
	aliceCert, aliceKey   string
	bobCert, bobKey       string
	tokenFile             string
}

func newPKI(t *testing.T) pki {
	t.Helper()
	dir := t.TempDir()
	p := pki{ca: testca.New(t, "fencer test CA")}
	p.caFile = p.ca.WriteCA(t, dir, "ca.crt")
	p.serverCert, p.serverKey = testca.WriteKeyPair(t, dir, "server", p.ca.ServerCert(t))
	p.aliceCert, p.aliceKey = testca.WriteKeyPair(t, dir, "alice", p.ca.ClientCert(t, "alice"))
	p.bobCert, p.bobKey = testca.WriteKeyPair(t, dir, "bob", p.ca.ClientCert(t, "bob"))
	p.tokenFile = filepath.Join(dir, "tokens")
	require.NoError(t, os.WriteFile(p.tokenFile, []byte("# test tokens\nalice-token-0123456789 alice\n"), 0o600))
	return p
}

func TestServeSecurityFlags(t *testing.T) {
	p := newPKI(t)
	empty := filepath.Join(t.TempDir(), "empty.pem")
	require.NoError(t, os.WriteFile(empty, []byte("no certificates here\n"), 0o600))
	type want struct {
		err        string // substring of the error; "" for success
		tls        bool
		clientAuth tls.ClientAuthType
		auth       any // the Authenticator's type
	}
	anon := want{auth: server.Anonymous("")}
	cases := []struct {
		name string
		f    serveFlags
		want want
	}{
		{"loopback plaintext anonymous", serveFlags{listen: "127.0.0.1:7890"}, anon},
		{"other loopback address", serveFlags{listen: "127.0.0.2:7890"}, anon},
		{"IPv6 loopback", serveFlags{listen: "[::1]:7890"}, anon},
		{"localhost", serveFlags{listen: "localhost:7890"}, anon},
		{"all interfaces, plaintext", serveFlags{listen: ":7890"}, want{err: "refusing plaintext"}},
		{"0.0.0.0, plaintext", serveFlags{listen: "0.0.0.0:7890"}, want{err: "refusing plaintext"}},
		{"[::], plaintext", serveFlags{listen: "[::]:7890"}, want{err: "refusing plaintext"}},
		{"host name, plaintext", serveFlags{listen: "fencer.example:7890"}, want{err: "refusing plaintext"}},
		{"no port", serveFlags{listen: "127.0.0.1"}, want{err: "refusing plaintext"}},
		{"tokens over plaintext", serveFlags{listen: ":7890", tokenFile: p.tokenFile}, want{err: "refusing plaintext"}},
		{"TLS without authentication", serveFlags{listen: ":7890", tlsCert: p.serverCert, tlsKey: p.serverKey}, want{err: "refusing unauthenticated"}},
		{"TLS and tokens", serveFlags{listen: ":7890", tlsCert: p.serverCert, tlsKey: p.serverKey, tokenFile: p.tokenFile},
			want{tls: true, auth: &server.TokenFile{}}},
		{"mutual TLS", serveFlags{listen: ":7890", tlsCert: p.serverCert, tlsKey: p.serverKey, tlsClientCA: p.caFile},
			want{tls: true, clientAuth: tls.RequireAndVerifyClientCert, auth: server.ClientCertificates{}}},
		{"mutual TLS and tokens", serveFlags{listen: ":7890", tlsCert: p.serverCert, tlsKey: p.serverKey, tlsClientCA: p.caFile, tokenFile: p.tokenFile},
			want{tls: true, clientAuth: tls.RequireAndVerifyClientCert, auth: &server.TokenFile{}}},
		{"insecure plaintext", serveFlags{listen: ":7890", insecure: true}, anon},
		{"insecure TLS", serveFlags{listen: ":7890", insecure: true, tlsCert: p.serverCert, tlsKey: p.serverKey}, want{tls: true, auth: server.Anonymous("")}},
		{"cert without key", serveFlags{listen: "127.0.0.1:7890", tlsCert: p.serverCert}, want{err: "tls"}},
		{"key without cert", serveFlags{listen: "127.0.0.1:7890", tlsKey: p.serverKey}, want{err: "tls"}},
		{"client CA without TLS", serveFlags{listen: "127.0.0.1:7890", tlsClientCA: p.caFile}, want{err: "--tls-client-ca needs --tls-cert"}},
		{"client CA file without certificates", serveFlags{listen: "127.0.0.1:7890", tlsCert: p.serverCert, tlsKey: p.serverKey, tlsClientCA: empty}, want{err: "no certificates"}},
		{"missing client CA file", serveFlags{listen: "127.0.0.1:7890", tlsCert: p.serverCert, tlsKey: p.serverKey, tlsClientCA: empty + ".missing"}, want{err: "no such file"}},
		{"missing token file", serveFlags{listen: "127.0.0.1:7890", tokenFile: empty + ".missing"}, want{err: "no such file"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg, auth, _, err := tc.f.security(slog.New(slog.DiscardHandler))
			if tc.want.err != "" {
				require.ErrorContains(t, err, tc.want.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want.tls, cfg != nil)
			if cfg != nil {
				require.Equal(t, tc.want.clientAuth, cfg.ClientAuth)
				require.GreaterOrEqual(t, cfg.MinVersion, uint16(tls.VersionTLS12))
			}
			require.IsType(t, tc.want.auth, auth)
		})
	}
}

func TestServeRejectsABatchSizeOutOfRange(t *testing.T) {
	for _, arg := range []string{"-1", strconv.Itoa(etcdstore.MaxBatch + 1), "many"} {
		var stderr bytes.Buffer
		require.Equal(t, 2, runServe(context.Background(), []string{"--batch", arg}, &bytes.Buffer{}, &stderr), arg)
		require.Contains(t, stderr.String(), "batch", arg)
	}
}

// freeAddr returns a free loopback address (see freeport).
func freeAddr(t *testing.T) string {
	t.Helper()
	ports, release, err := freeport.Take(1)
	require.NoError(t, err)
	release()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0]))
}

// startServe runs fencer serve with f until the test ends and returns its
// address once it answers.
func startServe(t *testing.T, f serveFlags) string {
	t.Helper()
	f.metricsListen = ""
	addr, _ := startServeLogged(t, f)
	return addr
}

// startServeLogged is startServe with f's --metrics-listen, and returns
// the server's log too.
func startServeLogged(t *testing.T, f serveFlags) (string, *safeBuffer) {
	t.Helper()
	f.listen, f.grace = freeAddr(t), 5*time.Second
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var stderr safeBuffer
	go func() { done <- serve(ctx, f, &stderr) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done, stderr.String())
	})
	// serve binds its port before it starts etcd, and logs "listening"
	// once it serves.
	require.Eventually(t, func() bool {
		log := stderr.String()
		return strings.Contains(log, `msg=listening`) || strings.Contains(log, `"msg":"listening"`)
	}, 10*time.Second, 20*time.Millisecond, stderr.String())
	return f.listen, &stderr
}

func TestServeMutualTLS(t *testing.T) {
	p := newPKI(t)
	endpoint := startEtcd(t)
	addr := startServe(t, serveFlags{etcdEndpoints: endpoint, prefix: "/mtls/", tlsCert: p.serverCert, tlsKey: p.serverKey, tlsClientCA: p.caFile, authzAllowAll: true})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	as := func(cert, key string) []string {
		return []string{"--server", addr, "--tls-ca", p.caFile, "--tls-cert", cert, "--tls-key", key, "--timeout", "5s"}
	}

	var out, errb bytes.Buffer
	code := runAcquire(ctx, append(as(p.aliceCert, p.aliceKey), "jobs", "--", "sh", "-c", `echo "$FENCER_TOKEN"`), &out, &errb)
	require.Equal(t, 0, code, errb.String())
	tok := strings.TrimSpace(out.String())
	require.True(t, strings.HasPrefix(tok, "v1:1:"), tok)

	// The principal is the certificate's common name.
	out.Reset()
	require.Equal(t, 0, runStatus(ctx, append(as(p.bobCert, p.bobKey), "--output", "json"), &out, &errb), errb.String())
	var rows []statusRow
	require.NoError(t, json.Unmarshal(out.Bytes(), &rows))
	require.Len(t, rows, 1)
	require.False(t, rows[0].Held, "acquire released the lease when CMD exited")

	// Each fails at its handshake, at once; the long timeout only leaves
	// room for a loaded machine's slow handshake, which would otherwise
	// end in "did not answer in time".
	for name, args := range map[string][]string{
		"no client certificate": {"--server", addr, "--tls-ca", p.caFile, "--timeout", "20s"},
		"plaintext":             {"--server", addr, "--timeout", "20s"},
		"without the server CA": {"--server", addr, "--tls-cert", p.aliceCert, "--tls-key", p.aliceKey, "--timeout", "20s"},
	} {
		t.Run(name, func(t *testing.T) {
			var out, errb bytes.Buffer
			require.Equal(t, exitUnavailable, runStatus(ctx, args, &out, &errb), out.String())
			require.Contains(t, errb.String(), "cannot reach fencer at "+addr)
		})
	}

	t.Run("several servers", func(t *testing.T) {
		addr2 := startServe(t, serveFlags{etcdEndpoints: endpoint, prefix: "/mtls/", tlsCert: p.serverCert, tlsKey: p.serverKey, tlsClientCA: p.caFile, authzAllowAll: true})
		args := as(p.aliceCert, p.aliceKey)
		args[1] = addr + "," + addr2
		for range 4 { // round-robin reaches both
			var out, errb bytes.Buffer
			require.Equal(t, 0, runStatus(ctx, append(args, "--output", "json"), &out, &errb), errb.String())
		}
	})
}

func TestClientTLSFlagsNeverFallBackToPlaintext(t *testing.T) {
	p := newPKI(t)
	addr, _ := startService(t) // plaintext
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out, errb bytes.Buffer
	require.Equal(t, 0, runStatus(ctx, []string{"--server", addr}, &out, &errb), errb.String())
	for _, tc := range []struct {
		name string
		args []string
		code int
	}{
		{"client certificate", []string{"--tls-cert", p.aliceCert, "--tls-key", p.aliceKey}, exitUnavailable},
		{"CA", []string{"--tls-ca", p.caFile}, exitUnavailable},
		{"certificate, no key", []string{"--tls-cert", p.aliceCert}, exitUsage},
		{"key, no certificate", []string{"--tls-key", p.aliceKey}, exitUsage},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			require.Equal(t, tc.code, runStatus(ctx, append([]string{"--server", addr, "--timeout", "5s"}, tc.args...), &out, &errb), out.String())
		})
	}
}

func TestClientSendsBearerTokensInPlaintextOnlyToLoopback(t *testing.T) {
	t.Setenv("FENCER_AUTH_TOKEN", "alice-token-0123456789")
	for _, tc := range []struct {
		name string
		args []string
		err  string // "" when the connection is made
	}{
		{"remote address", []string{"--server", "10.1.2.3:7890"}, "refusing to send the bearer token in plaintext to 10.1.2.3:7890"},
		{"one remote among several", []string{"--server", "127.0.0.1:7890,fencer.example:7890"}, "in plaintext to fencer.example:7890"},
		{"remote address, --insecure", []string{"--server", "10.1.2.3:7890", "--insecure"}, ""},
		{"loopback", []string{"--server", "127.0.0.1:7890"}, ""},
		{"localhost", []string{"--server", "localhost:7890"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c connFlags
			fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
			c.register(fs)
			require.NoError(t, fs.Parse(tc.args))
			cc, err := c.dial()
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				require.Nil(t, cc)
				return
			}
			require.NoError(t, err)
			require.NoError(t, cc.Close())
		})
	}
}

// TestServeAuthorizationFile serves with mutual TLS and an authorization
// file granting alice the lease "jobs" only: alice acquires it, bob is
// refused; a file that does not parse stops serve before it listens.
func TestServeAuthorizationFile(t *testing.T) {
	p := newPKI(t)
	endpoint := startEtcd(t)
	authz := filepath.Join(t.TempDir(), "authz.yaml")
	require.NoError(t, os.WriteFile(authz, []byte("principals:\n  alice:\n    leases: [\"jobs\"]\n"), 0o600))
	addr := startServe(t, serveFlags{etcdEndpoints: endpoint, prefix: "/authz/", tlsCert: p.serverCert, tlsKey: p.serverKey, tlsClientCA: p.caFile, authzFile: authz})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	as := func(cert, key string) []string {
		return []string{"--server", addr, "--tls-ca", p.caFile, "--tls-cert", cert, "--tls-key", key, "--timeout", "5s"}
	}
	var out, errb bytes.Buffer
	require.Equal(t, 0, runAcquire(ctx, append(as(p.aliceCert, p.aliceKey), "jobs", "--", "true"), &out, &errb), errb.String())
	errb.Reset()
	require.NotEqual(t, 0, runAcquire(ctx, append(as(p.bobCert, p.bobKey), "jobs", "--", "true"), &out, &errb))
	require.Contains(t, errb.String(), "permission denied")

	bad := filepath.Join(t.TempDir(), "bad.yaml")
	require.NoError(t, os.WriteFile(bad, []byte("principals:\n  alice:\n    leases: [\"a*b\"]\n"), 0o600))
	err := serve(ctx, serveFlags{etcdEndpoints: endpoint, listen: freeAddr(t), authzFile: bad}, &bytes.Buffer{})
	require.ErrorContains(t, err, bad)
}
