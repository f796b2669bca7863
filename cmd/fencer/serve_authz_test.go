package main

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestServeAuthzRequiredWithAuthentication runs the built binary through
// each combination of authentication and authorization flags. Without
// authentication on loopback (the development default) serve starts and
// every call is allowed. With --token-file or --tls-client-ca but neither
// --authz-file nor --authz-allow-all, serve refuses with a usage error
// (exit 2) that names the authenticating flag and both ways out, before
// it binds --listen, makes --data-dir or starts etcd. --authz-allow-all
// with authentication starts and lets every principal use every name;
// with --authz-file, or without authentication, it is a usage error.
// Token file and authorization file together enforce the grants:
// TestExitCodes ("permission denied") and TestServeAuthorizationFile
// (mutual TLS) cover that.
func TestServeAuthzRequiredWithAuthentication(t *testing.T) {
	p := newPKI(t)
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	require.NoError(t, os.WriteFile(tokens, []byte("alice-token-0123456789 alice\nbob-token-01234567890 bob\n"), 0o600))
	authz := filepath.Join(dir, "authz.yaml")
	require.NoError(t, os.WriteFile(authz, []byte("principals:\n  alice:\n    leases: [\"*\"]\n"), 0o600))
	alice := []string{"FENCER_AUTH_TOKEN=alice-token-0123456789"}
	bob := []string{"FENCER_AUTH_TOKEN=bob-token-01234567890"}

	t.Run("no authentication on loopback: starts, every call allowed", func(t *testing.T) {
		s := startServeProc(t)
		for _, name := range []string{"orders", "billing"} {
			code, _, stderr := s.fencer(nil, "acquire", name, "--", "sh", "-c", s.bin+` put --token "$FENCER_TOKEN" `+name+`/k v`)
			require.Equal(t, 0, code, stderr)
		}
	})

	t.Run("token file and --authz-allow-all: starts, every principal allowed", func(t *testing.T) {
		s := startServeProc(t, "--token-file", tokens, "--authz-allow-all")
		for _, who := range [][]string{alice, bob} {
			for _, name := range []string{"orders", "billing"} {
				code, _, stderr := s.fencer(who, "acquire", name, "--", "sh", "-c", s.bin+` put --token "$FENCER_TOKEN" `+name+`/k v`)
				require.Equal(t, 0, code, "%s %s: %s", who, name, stderr)
			}
		}
		require.Contains(t, s.log.String(), "authorization=allow-all", "the start is logged with its authorization mode")
	})

	bin := fencerBinary(t)
	for _, tc := range []struct {
		name string
		args []string
		want []string // substrings of the message
	}{
		{"token file without authorization", []string{"--token-file", tokens},
			[]string{"fencer serve: --token-file authenticates principals but no --authz-file says what each may do", "give --authz-file, or --authz-allow-all"}},
		{"client CA without authorization", []string{"--tls-cert", p.serverCert, "--tls-key", p.serverKey, "--tls-client-ca", p.caFile},
			[]string{"fencer serve: --tls-client-ca authenticates principals but no --authz-file says what each may do", "give --authz-file, or --authz-allow-all"}},
		{"--authz-allow-all with --authz-file", []string{"--token-file", tokens, "--authz-file", authz, "--authz-allow-all"},
			[]string{"fencer serve: --authz-allow-all and --authz-file"}},
		{"--authz-allow-all without authentication", []string{"--authz-allow-all"},
			[]string{"fencer serve: --authz-allow-all needs --token-file or --tls-client-ca"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := filepath.Join(t.TempDir(), "data")
			addr := freeAddr(t)
			code, stdout, stderr := runBinary(t, bin, append([]string{"serve", "--listen", addr, "--metrics-listen", "", "--data-dir", data}, tc.args...)...)
			require.Equal(t, exitUsage, code, "stdout: %s\nstderr: %s", stdout, stderr)
			for _, w := range tc.want {
				require.Contains(t, stderr, w)
			}
			require.Contains(t, stderr, "Run 'fencer serve --help' for usage.")
			require.NotContains(t, stderr, "etcd", "etcd was started: %s", stderr)
			_, err := os.Stat(data)
			require.True(t, errors.Is(err, os.ErrNotExist), "--data-dir was made: %v", err)
			lis, err := net.Listen("tcp", addr) // serve never held --listen, and holds nothing now
			require.NoError(t, err)
			require.NoError(t, lis.Close())
			require.Empty(t, strings.TrimSpace(stdout))
		})
	}
}

// TestServeCheckAuthz checks each combination of the authentication and
// authorization flags against checkAuthz: the refusals are usage errors.
func TestServeCheckAuthz(t *testing.T) {
	for _, tc := range []struct {
		name string
		f    serveFlags
		err  string // substring of the usage error; "" for none
	}{
		{"no flags", serveFlags{}, ""},
		{"authorization file alone", serveFlags{authzFile: "authz.yaml"}, ""},
		{"token file", serveFlags{tokenFile: "tokens"}, "--token-file authenticates principals but no --authz-file says what each may do: give --authz-file, or --authz-allow-all"},
		{"client CA", serveFlags{tlsClientCA: "ca.crt"}, "--tls-client-ca authenticates principals but no --authz-file"},
		{"token file and client CA", serveFlags{tokenFile: "tokens", tlsClientCA: "ca.crt"}, "--token-file authenticates principals but no --authz-file"},
		{"token file, authorization file", serveFlags{tokenFile: "tokens", authzFile: "authz.yaml"}, ""},
		{"client CA, authorization file", serveFlags{tlsClientCA: "ca.crt", authzFile: "authz.yaml"}, ""},
		{"token file, allow all", serveFlags{tokenFile: "tokens", authzAllowAll: true}, ""},
		{"client CA, allow all", serveFlags{tlsClientCA: "ca.crt", authzAllowAll: true}, ""},
		{"allow all and authorization file", serveFlags{tokenFile: "tokens", authzFile: "authz.yaml", authzAllowAll: true}, "--authz-allow-all and --authz-file exclude each other"},
		{"allow all without authentication", serveFlags{authzAllowAll: true}, "--authz-allow-all needs --token-file or --tls-client-ca"},
		{"allow all, insecure, no authentication", serveFlags{listen: ":7890", insecure: true, authzAllowAll: true}, "--authz-allow-all needs --token-file or --tls-client-ca"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.f.checkAuthz()
			if tc.err == "" {
				require.NoError(t, err)
				return
			}
			var usage *usageError
			require.ErrorAs(t, err, &usage)
			require.ErrorContains(t, err, tc.err)
		})
	}
}
