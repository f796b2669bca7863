package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/fencer-dev/fencer/client"
	"github.com/fencer-dev/fencer/embedetcd"
	"github.com/fencer-dev/fencer/internal/testkit/testca"
	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
)

// replaceFile puts content at path the way a rotation does: a new file
// renamed over the old.
func replaceFile(t *testing.T, path string, content []byte) {
	t.Helper()
	require.NoError(t, os.WriteFile(path+".new", content, 0o600))
	require.NoError(t, os.Rename(path+".new", path))
}

// TestServeRotatesTokensAndCertificates rotates the token file and the
// serving certificate of a running fencer serve: the new token is
// accepted and the old one refused, and new connections get the new
// certificate, without a restart.
func TestServeRotatesTokensAndCertificates(t *testing.T) {
	p := newPKI(t)
	addr := startServe(t, serveFlags{etcdEndpoints: startEtcd(t), prefix: "/rotate/", tlsCert: p.serverCert, tlsKey: p.serverKey, tokenFile: p.tokenFile, authzAllowAll: true})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(p.ca.CertPEM())
	call := func(tok string) codes.Code {
		cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: roots})),
			grpc.WithPerRPCCredentials(client.BearerToken(tok, true)))
		require.NoError(t, err)
		defer cc.Close()
		_, err = fencerv1.NewFencerServiceClient(cc).ListLeases(ctx, &fencerv1.ListLeasesRequest{})
		return status.Code(err)
	}
	served := func() []byte {
		conn, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: roots, NextProtos: []string{"h2"}})
		require.NoError(t, err)
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0].Raw
	}

	const oldTok, newTok = "alice-token-0123456789", "alice-token-rotated-0123"
	require.Equal(t, codes.OK, call(oldTok))
	replaceFile(t, p.tokenFile, []byte(newTok+" alice\n"))
	require.Eventually(t, func() bool { return call(newTok) == codes.OK }, 10*time.Second, 50*time.Millisecond)
	require.Equal(t, codes.Unauthenticated, call(oldTok))

	before := served()
	dir := t.TempDir()
	certFile, keyFile := testca.WriteKeyPair(t, dir, "next", p.ca.ServerCert(t))
	certPEM, err := os.ReadFile(certFile)
	require.NoError(t, err)
	keyPEM, err := os.ReadFile(keyFile)
	require.NoError(t, err)
	replaceFile(t, p.serverKey, keyPEM)
	replaceFile(t, p.serverCert, certPEM)
	block, _ := pem.Decode(certPEM)
	require.NotEqual(t, before, block.Bytes)
	// The watcher reacts to the rename, or at the latest polls every 10 s.
	require.Eventually(t, func() bool { return bytes.Equal(served(), block.Bytes) }, 20*time.Second, 50*time.Millisecond)
	require.Equal(t, codes.OK, call(newTok))
}

// TestServeEmbeddedEtcd runs fencer serve on its embedded etcd: the
// member listens only on a 0600 unix socket in the data directory, whose
// endpoint the log names; the metrics port answers the probes without
// credentials and serves the member's space metrics; and a second fencer serve on the same data directory fails
// at once, naming it.
func TestServeEmbeddedEtcd(t *testing.T) {
	dataDir := t.TempDir()
	metrics := freeAddr(t)
	embedded := serveFlags{dataDir: dataDir, prefix: "/fencer/", etcdQuota: embedetcd.DefaultQuotaBytes, etcdRetention: embedetcd.DefaultCompactionRetention}
	first := embedded
	first.metricsListen, first.logFormat, first.tokenFile, first.authzAllowAll = metrics, "json", newPKI(t).tokenFile, true
	_, logs := startServeLogged(t, first)

	sock := filepath.Join(dataDir, "etcd.sock")
	fi, err := os.Stat(sock)
	require.NoError(t, err)
	require.Equal(t, os.ModeSocket, fi.Mode().Type())
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	var started map[string]any
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var rec map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &rec), "--log-format json wrote %q", line)
		if rec["msg"] == "embedded etcd" {
			started = rec
		}
	}
	require.Equal(t, "unix://"+sock, started["endpoint"], logs.String())

	get := func(path string) int {
		resp, err := http.Get("http://" + metrics + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode
	}
	// The metrics listener may start a moment after the gRPC one answers.
	require.Eventually(t, func() bool {
		conn, err := net.Dial("tcp", metrics)
		if err == nil {
			conn.Close()
		}
		return err == nil
	}, 10*time.Second, 20*time.Millisecond, "the metrics port never listened")
	require.Equal(t, http.StatusOK, get("/healthz"))
	require.Eventually(t, func() bool { return get("/readyz") == http.StatusOK }, 10*time.Second, 20*time.Millisecond)
	require.Equal(t, http.StatusNotFound, get("/debug/pprof/"), "profiles only with --enable-pprof")
	resp, err := http.Get("http://" + metrics + "/metrics")
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	for _, series := range []string{"fencer_embedded_etcd_db_size_bytes ", "fencer_embedded_etcd_compactions_total ", "fencer_embedded_etcd_nospace_recoveries_total 0"} {
		require.True(t, strings.Contains(string(body), series), "no %q in /metrics: the embedded member's space metrics", series)
	}

	second := make(chan error, 1)
	go func() {
		again := embedded
		again.listen = freeAddr(t)
		second <- serve(context.Background(), again, io.Discard)
	}()
	select {
	case err = <-second:
	case <-time.After(10 * time.Second):
		t.Fatal("a second fencer serve on the data directory hangs")
	}
	var locked *embedetcd.LockedError
	require.True(t, errors.As(err, &locked), "%v", err)
	require.Contains(t, err.Error(), dataDir)
}

func TestServeRejectsBadLogAndTimeoutFlags(t *testing.T) {
	for _, args := range [][]string{{"--log-level", "loud"}, {"--log-format", "xml"}, {"--etcd-request-timeout", "0s"}} {
		var stderr bytes.Buffer
		require.Equal(t, 2, runServe(context.Background(), args, io.Discard, &stderr), args)
		require.Contains(t, stderr.String(), args[0])
	}
}

// TestServeRotatesTheClientCA replaces the --tls-client-ca bundle of a
// running fencer serve with another CA's: clients of the new CA are
// admitted and those of the old one refused from then on, without a
// restart.
func TestServeRotatesTheClientCA(t *testing.T) {
	p := newPKI(t)
	addr := startServe(t, serveFlags{etcdEndpoints: startEtcd(t), prefix: "/rotate-ca/", tlsCert: p.serverCert, tlsKey: p.serverKey, tlsClientCA: p.caFile, authzAllowAll: true})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admitted := func(cert tls.Certificate) bool {
		cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: p.ca.Pool(), Certificates: []tls.Certificate{cert}})))
		require.NoError(t, err)
		defer cc.Close()
		_, err = fencerv1.NewFencerServiceClient(cc).ListLeases(ctx, &fencerv1.ListLeasesRequest{})
		return err == nil
	}
	next := testca.New(t, "next client CA")
	oldCert, newCert := p.ca.ClientCert(t, "alice"), next.ClientCert(t, "alice")
	require.True(t, admitted(oldCert))
	require.False(t, admitted(newCert))
	replaceFile(t, p.caFile, next.CertPEM())
	require.Eventually(t, func() bool { return admitted(newCert) }, 10*time.Second, 50*time.Millisecond)
	require.False(t, admitted(oldCert))
}

// TestEtcdClientCertificateReloads replaces the --etcd-cert-file and
// --etcd-key-file pair while the etcd TLS configuration's watcher runs:
// a new connection presents the new certificate, without a restart. A
// TLS listener that records each client certificate stands in for etcd.
func TestEtcdClientCertificateReloads(t *testing.T) {
	p := newPKI(t)
	presented := make(chan []byte, 16)
	lis, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{
		Certificates: []tls.Certificate{p.ca.ServerCert(t)}, ClientAuth: tls.RequireAnyClientCert, MinVersion: tls.VersionTLS12,
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			presented <- raw[0]
			return nil
		},
	})
	require.NoError(t, err)
	defer lis.Close()
	go func() {
		for {
			conn, err := lis.Accept()
			if err != nil {
				return
			}
			_ = conn.(*tls.Conn).Handshake()
			conn.Close()
		}
	}()
	cfg, watch, err := etcdFlags{caFile: p.caFile, certFile: p.aliceCert, keyFile: p.aliceKey}.tlsConfig(nil)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	watching := make(chan error, 1)
	go func() { watching <- watch(ctx) }()
	defer func() {
		cancel()
		require.NoError(t, <-watching)
	}()
	connect := func() []byte {
		c := cfg.Clone()
		c.ServerName = "localhost"
		conn, err := tls.Dial("tcp", lis.Addr().String(), c)
		require.NoError(t, err)
		defer conn.Close()
		return <-presented
	}
	leaf := func(certFile string) []byte {
		pemBytes, err := os.ReadFile(certFile)
		require.NoError(t, err)
		block, _ := pem.Decode(pemBytes)
		return block.Bytes
	}
	alice := leaf(p.aliceCert)
	require.Equal(t, alice, connect())
	bobCert, err := os.ReadFile(p.bobCert)
	require.NoError(t, err)
	bobKey, err := os.ReadFile(p.bobKey)
	require.NoError(t, err)
	replaceFile(t, p.aliceKey, bobKey)
	replaceFile(t, p.aliceCert, bobCert)
	bob := leaf(p.bobCert)
	// The watcher reacts to the rename, or at the latest polls every 10 s.
	require.Eventually(t, func() bool { return bytes.Equal(connect(), bob) }, 20*time.Second, 50*time.Millisecond)
}

// TestServeEnablePprof: with --enable-pprof, the metrics port also serves
// Go's profiles.
func TestServeEnablePprof(t *testing.T) {
	metrics := freeAddr(t)
	f := serveFlags{dataDir: t.TempDir(), prefix: "/fencer/", etcdQuota: embedetcd.DefaultQuotaBytes, etcdRetention: embedetcd.DefaultCompactionRetention,
		metricsListen: metrics, pprof: true}
	startServeLogged(t, f)
	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + metrics + "/debug/pprof/cmdline")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 10*time.Second, 20*time.Millisecond)
}
