package server_test

import (
	"crypto/tls"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	"github.com/fencer-dev/fencer/fencertest"
	"github.com/fencer-dev/fencer/internal/testkit/testca"
	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
	"github.com/fencer-dev/fencer/server"
)

// TestCAFileRotation serves mutual TLS against a client CA bundle file
// and replaces the bundle while the server runs: clients of the new CA are
// admitted and those of the old one refused from the reload on, without a
// restart; a bundle that does not load keeps the one in force.
func TestCAFileRotation(t *testing.T) {
	ctx := fencertest.Context(t)
	dir := t.TempDir()
	serverCA, oldCA, newCA := testca.New(t, "server CA"), testca.New(t, "old client CA"), testca.New(t, "new client CA")
	path := filepath.Join(dir, "clients.crt")
	writeAtomically(t, path, string(oldCA.CertPEM()))
	rec := newRecorder()
	cas, err := server.NewCAFile(path, slog.New(rec))
	require.NoError(t, err)
	follow(t, cas.Start)
	cfg := &tls.Config{Certificates: []tls.Certificate{serverCA.ServerCert(t)}, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12}
	cas.ServerConfig(cfg)
	addr, _ := serve(t, server.Config{Store: fencertest.SharedStore(t), Authenticator: server.ClientCertificates{}, TLS: cfg})
	oldCert, newCert := oldCA.ClientCert(t, "alice"), newCA.ClientCert(t, "alice")
	admitted := func(cert tls.Certificate) bool {
		cc := dialWith(t, []grpc.DialOption{tlsCreds(serverCA.Pool(), cert)}, addr)
		defer cc.Close()
		_, err := fencerv1.NewFencerServiceClient(cc).ListLeases(ctx, &fencerv1.ListLeasesRequest{})
		return err == nil
	}
	require.True(t, admitted(oldCert))
	require.False(t, admitted(newCert))

	writeAtomically(t, path, string(newCA.CertPEM()))
	require.Eventually(t, func() bool { return admitted(newCert) }, 10*time.Second, 20*time.Millisecond)
	require.False(t, admitted(oldCert))

	writeAtomically(t, path, "not a certificate\n")
	failed := func(m map[string]any) bool { return m["level"] == slog.LevelError }
	require.Eventually(t, func() bool { return len(rec.find(failed)) > 0 }, 10*time.Second, 20*time.Millisecond)
	require.True(t, admitted(newCert))
	require.False(t, admitted(oldCert))
}

func TestNewCAFileRejectsABadFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ca.crt")
	require.NoError(t, os.WriteFile(path, []byte("no PEM here\n"), 0o600))
	_, err := server.NewCAFile(path, nil)
	require.ErrorIs(t, err, server.ErrNoCertificates)
	_, err = server.NewCAFile(path+".missing", nil)
	require.ErrorIs(t, err, os.ErrNotExist)
}
