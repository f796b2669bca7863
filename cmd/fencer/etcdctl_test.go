package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

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
		for _, args := range [][]string{{"get", "orders/a", "--endpoints", s.addr}, {"--endpoints=" + s.addr, "get", "orders/a"}} {
			code, stdout, stderr := s.fencer([]string{down}, args...)
			require.Equal(t, 0, code, "%q: %s", args, stderr)
			require.Equal(t, "1\n", stdout)
		}
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
			require.Contains(t, stderr, "$FENCER_SERVER", "a bad variable is named as the variable: %s", server)
		}
		code, _, stderr := s.fencer(nil, "get", "orders/a", "--endpoints", "grpc://"+s.addr)
		require.Equal(t, exitUsage, code, stderr)
		require.Contains(t, stderr, "invalid --endpoints", stderr)
	})

	t.Run("a bad value names where it came from", func(t *testing.T) {
		for _, tc := range []struct {
			env  []string
			args []string
			want string
		}{
			{[]string{"FENCER_OUTPUT=xml"}, nil, `fencer get: $FENCER_OUTPUT="xml": want text, table, json or yaml, e.g. FENCER_OUTPUT=json (the variable of --output)`},
			{nil, []string{"-o", "xml"}, `fencer get: invalid --output "xml": want text, table, json or yaml, e.g. --output json`},
			{[]string{"FENCER_SERVER=grpc://x:1"}, nil, `fencer get: $FENCER_SERVER="grpc://x:1": want host:port, http://host:port or https://host:port`},
		} {
			code, stdout, stderr := s.fencer(tc.env, append([]string{"get", "orders/a"}, tc.args...)...)
			require.Equal(t, exitUsage, code, stderr)
			require.Empty(t, stdout)
			require.Contains(t, stderr, tc.want)
		}
	})
}

// TestGetPrefix runs get --prefix through the built binary against fencer
// serve with an authorization file: each principal gets every key under
// the prefix that it may read, in key order, with its bytes, and none of
// the others.
func TestGetPrefix(t *testing.T) {
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	require.NoError(t, os.WriteFile(tokens, []byte("alice-token-0123456789 alice\nbob-token-0123456789ab bob\n"), 0o600))
	authz := filepath.Join(dir, "authz.yaml")
	require.NoError(t, os.WriteFile(authz, []byte("principals:\n  alice:\n    leases: [orders]\n    write: [\"orders/*\", \"secret/*\"]\n  bob:\n    read: [\"orders/*\"]\n"), 0o600))
	s := startServeProc(t, "--token-file", tokens, "--authz-file", authz)
	alice := []string{"FENCER_AUTH_TOKEN=alice-token-0123456789"}
	bob := []string{"FENCER_AUTH_TOKEN=bob-token-0123456789ab"}

	holder := s.startFencer(alice, "acquire", "orders")
	require.Eventually(t, func() bool { return strings.HasSuffix(holder.stdout.String(), "\n") }, printBound, 10*time.Millisecond, holder.stderr.String())
	writer := append([]string{"FENCER_TOKEN=" + strings.TrimSpace(holder.stdout.String())}, alice...)
	for _, kv := range [][2]string{{"orders/a", "1"}, {"orders/b", "\xff\xfe"}, {"orders/c", ""}, {"secret/x", "hidden"}} {
		p := s.startFencerIn(strings.NewReader(kv[1]), writer, "put", kv[0], "-")
		require.Equal(t, 0, p.wait(t, printBound), p.stderr.String())
	}

	get := func(env []string, args ...string) string {
		t.Helper()
		code, stdout, stderr := s.fencer(env, append([]string{"get", "--prefix"}, args...)...)
		require.Equal(t, 0, code, "get --prefix %q: %s", args, stderr)
		return stdout
	}
	orders := "orders/a\n1\norders/b\n\xff\xfe\norders/c\n\n"
	require.Equal(t, orders, get(alice, "orders/"))
	require.Equal(t, orders+"secret/x\nhidden\n", get(alice, ""))
	require.Equal(t, orders, get(bob, ""), "bob may read only orders/*")
	require.Empty(t, get(bob, "secret/"))
	require.Empty(t, get(alice, "nothing/"))

	var kvs []getView
	require.NoError(t, json.Unmarshal([]byte(get(bob, "orders/", "-w", "json")), &kvs))
	require.Len(t, kvs, 3)
	require.Equal(t, getView{Key: "orders/b", Found: true, Value: []byte("\xff\xfe"), CreateRevision: kvs[1].CreateRevision, ModRevision: kvs[1].ModRevision}, kvs[1])
	require.Equal(t, "[]\n", get(bob, "secret/", "-o", "json"))
	require.Regexp(t, `^KEY\s+VALUE\s+CREATE_REVISION\s+MOD_REVISION\norders/a\s+"1"\s+\d+\s+\d+\n`, get(alice, "orders/", "-o", "table"))
}
