package main

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"
)

// TestEtcdctlHabits runs the built binary against fencer serve with the
// flags etcdctl users type: --endpoints for --server, -w and --write-out
// for -o, --version, and servers given as http:// and https:// URLs.
func TestEtcdctlHabits(t *testing.T) {
	s := startServeProc(t)
	holder, tok := rtHold(t, s, "orders")
	defer func() { _ = holder.cmd.Process.Kill() }()
	code, _, stderr := s.fencer([]string{"FENCER_TOKEN=" + tok}, "put", "orders/a", "1")
	require.Equal(t, 0, code, stderr)
	down := "FENCER_SERVER=" + freeAddr(t)

	t.Run("--endpoints is --server and wins over FENCER_SERVER", func(t *testing.T) {
		code, stdout, stderr := s.fencer([]string{down}, "get", "orders/a", "--endpoints", s.addr)
		require.Equal(t, 0, code, stderr)
		require.Equal(t, "1\n", stdout)
	})

	t.Run("-w and --write-out are -o and win over FENCER_OUTPUT", func(t *testing.T) {
		for _, flag := range []string{"-w", "--write-out"} {
			code, stdout, stderr := s.fencer([]string{"FENCER_OUTPUT=yaml"}, "get", "orders/a", flag, "json")
			require.Equal(t, 0, code, stderr)
			var g getView
			require.NoError(t, json.Unmarshal([]byte(stdout), &g), stdout)
			require.Equal(t, []byte("1"), g.Value)
		}
		code, stdout, stderr := s.fencer(nil, "get", "orders/a", "-w", "yaml")
		require.Equal(t, 0, code, stderr)
		var g getView
		require.NoError(t, yaml.UnmarshalStrict([]byte(stdout), &g), stdout)
		require.Equal(t, "orders/a", g.Key)
		code, _, stderr = s.fencer(nil, "get", "orders/a", "-w", "xml")
		require.Equal(t, exitUsage, code, stderr)
	})

	t.Run("--version prints what fencer version prints", func(t *testing.T) {
		code, version, stderr := s.fencer(nil, "version")
		require.Equal(t, 0, code, stderr)
		code, stdout, stderr := s.fencer(nil, "--version")
		require.Equal(t, 0, code, stderr)
		require.Equal(t, version, stdout)
		require.Regexp(t, `^fencer \S+, commit `, stdout)
	})

	t.Run("http:// is plaintext", func(t *testing.T) {
		for _, server := range []string{"http://" + s.addr, "http://" + s.addr + "/"} {
			code, stdout, stderr := s.fencer([]string{"FENCER_SERVER=" + server}, "get", "orders/a")
			require.Equal(t, 0, code, "%s: %s", server, stderr)
			require.Equal(t, "1\n", stdout)
		}
	})

	t.Run("https:// is TLS", func(t *testing.T) {
		p := newPKI(t)
		ts := startServeProc(t, "--tls-cert", p.serverCert, "--tls-key", p.serverKey)
		code, stdout, stderr := ts.fencer(nil, "health", "--server", "https://"+ts.addr, "--tls-ca", p.caFile)
		require.Equal(t, 0, code, stderr)
		require.Contains(t, stdout, "SERVING")
		code, _, stderr = ts.fencer(nil, "health", "--server", "https://"+s.addr, "--tls-ca", p.caFile, "--timeout", "2s")
		require.Equal(t, exitUnavailable, code, "TLS to a plaintext server: %s", stderr)
		code, _, stderr = ts.fencer(nil, "health", "--server", "http://"+ts.addr, "--tls-ca", p.caFile)
		require.Equal(t, exitUsage, code, stderr)
		require.Contains(t, stderr, "give https:// or host:port")
	})

	t.Run("other URLs are usage errors naming host:port", func(t *testing.T) {
		for _, server := range []string{"grpc://" + s.addr, "unix:///tmp/fencer.sock", "http://" + s.addr + "/fencer", "http://" + s.addr + "," + s.addr, "https://"} {
			code, _, stderr := s.fencer([]string{"FENCER_SERVER=" + server}, "get", "orders/a")
			require.Equal(t, exitUsage, code, "%s: %s", server, stderr)
			require.Contains(t, stderr, "host:port", server)
		}
	})
}
