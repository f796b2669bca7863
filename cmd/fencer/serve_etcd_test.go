package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestServeEtcdCredentialFlags checks every combination of the --etcd-*
// flags that clientConfig accepts or refuses, and what it builds.
func TestServeEtcdCredentialFlags(t *testing.T) {
	p := newPKI(t)
	dir := t.TempDir()
	pwFile := filepath.Join(dir, "password")
	require.NoError(t, os.WriteFile(pwFile, []byte("s3cret\n"), 0o600))
	emptyPw := filepath.Join(dir, "empty")
	require.NoError(t, os.WriteFile(emptyPw, []byte("\n"), 0o600))
	notPEM := filepath.Join(dir, "not.pem")
	require.NoError(t, os.WriteFile(notPEM, []byte("no certificates here\n"), 0o600))
	const tlsEP, plainEP = "https://127.0.0.1:2379", "http://127.0.0.1:2379"
	type want struct {
		err             string // substring of the refusal; "" to accept
		tls, clientCert bool
		rootCAs         bool
		user, password  string
	}
	cases := []struct {
		name      string
		e         etcdFlags
		endpoints []string
		env       string // $FENCER_ETCD_PASSWORD, set when not ""
		insecure  bool
		want      want
	}{
		{name: "embedded, no credentials", want: want{}},
		{name: "embedded with a CA", e: etcdFlags{caFile: p.caFile}, want: want{err: "need --etcd-endpoints"}},
		{name: "embedded with a user", e: etcdFlags{username: "fencer", passwordFile: pwFile}, want: want{err: "need --etcd-endpoints"}},
		{name: "embedded with a password in the environment", env: "pw", want: want{err: "need --etcd-endpoints"}},
		{name: "plaintext", endpoints: []string{plainEP, "127.0.0.1:2380"}, want: want{}},
		{name: "https with system roots", endpoints: []string{tlsEP}, want: want{tls: true}},
		{name: "CA only", endpoints: []string{tlsEP}, e: etcdFlags{caFile: p.caFile}, want: want{tls: true, rootCAs: true}},
		{name: "mutual TLS", endpoints: []string{tlsEP}, e: etcdFlags{caFile: p.caFile, certFile: p.aliceCert, keyFile: p.aliceKey},
			want: want{tls: true, rootCAs: true, clientCert: true}},
		{name: "mutual TLS and a user", endpoints: []string{tlsEP}, e: etcdFlags{caFile: p.caFile, certFile: p.aliceCert, keyFile: p.aliceKey, username: "fencer", passwordFile: pwFile},
			want: want{tls: true, rootCAs: true, clientCert: true, user: "fencer", password: "s3cret"}},
		{name: "user with the password in the environment", endpoints: []string{tlsEP}, e: etcdFlags{caFile: p.caFile, username: "fencer"}, env: "from-env",
			want: want{tls: true, rootCAs: true, user: "fencer", password: "from-env"}},
		{name: "user over plaintext loopback", endpoints: []string{plainEP}, e: etcdFlags{username: "fencer", passwordFile: pwFile}, want: want{user: "fencer", password: "s3cret"}},
		{name: "user over plaintext to another host", endpoints: []string{"http://10.0.0.1:2379"}, e: etcdFlags{username: "fencer", passwordFile: pwFile},
			want: want{err: "refusing to send the etcd password in plaintext to http://10.0.0.1:2379"}},
		{name: "user over plaintext to another host, --insecure", endpoints: []string{"10.0.0.1:2379"}, e: etcdFlags{username: "fencer", passwordFile: pwFile}, insecure: true,
			want: want{user: "fencer", password: "s3cret"}},
		{name: "TLS flags with a plaintext endpoint", endpoints: []string{tlsEP, plainEP}, e: etcdFlags{caFile: p.caFile}, want: want{err: "http://127.0.0.1:2379 would be plaintext"}},
		{name: "https and a bare host:port", endpoints: []string{tlsEP, "127.0.0.1:2380"}, want: want{err: "127.0.0.1:2380 would be plaintext"}},
		{name: "user over a unix socket", endpoints: []string{"unix:///run/etcd.sock"}, e: etcdFlags{username: "fencer", passwordFile: pwFile}, want: want{user: "fencer", password: "s3cret"}},
		{name: "unknown scheme", endpoints: []string{"ftp://127.0.0.1:2379"}, want: want{err: "is not http://, https://"}},
		{name: "certificate without key", endpoints: []string{tlsEP}, e: etcdFlags{certFile: p.aliceCert}, want: want{err: "go together"}},
		{name: "key without certificate", endpoints: []string{tlsEP}, e: etcdFlags{keyFile: p.aliceKey}, want: want{err: "go together"}},
		{name: "certificate and a key that does not match", endpoints: []string{tlsEP}, e: etcdFlags{certFile: p.aliceCert, keyFile: p.bobKey}, want: want{err: "etcd client certificate"}},
		{name: "CA file without certificates", endpoints: []string{tlsEP}, e: etcdFlags{caFile: notPEM}, want: want{err: "no certificates in"}},
		{name: "missing CA file", endpoints: []string{tlsEP}, e: etcdFlags{caFile: notPEM + ".missing"}, want: want{err: "no such file"}},
		{name: "user without password", endpoints: []string{tlsEP}, e: etcdFlags{username: "fencer"}, want: want{err: "--etcd-username needs"}},
		{name: "password without user", endpoints: []string{tlsEP}, e: etcdFlags{passwordFile: pwFile}, want: want{err: "needs --etcd-username"}},
		{name: "password in the environment without user", endpoints: []string{tlsEP}, env: "pw", want: want{err: "needs --etcd-username"}},
		{name: "two passwords", endpoints: []string{tlsEP}, e: etcdFlags{username: "fencer", passwordFile: pwFile}, env: "pw", want: want{err: "keep one"}},
		{name: "empty password", endpoints: []string{tlsEP}, e: etcdFlags{username: "fencer", passwordFile: emptyPw}, want: want{err: "password is empty"}},
		{name: "missing password file", endpoints: []string{tlsEP}, e: etcdFlags{username: "fencer", passwordFile: pwFile + ".missing"}, want: want{err: "no such file"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.env != "" {
				t.Setenv("FENCER_ETCD_PASSWORD", tc.env)
			}
			cfg, _, err := tc.e.clientConfig(tc.endpoints, tc.insecure, nil)
			if tc.want.err != "" {
				require.ErrorIs(t, err, errEtcdFlags)
				require.ErrorContains(t, err, tc.want.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.endpoints, cfg.Endpoints)
			require.Equal(t, tc.want.tls, cfg.TLS != nil)
			if cfg.TLS != nil {
				require.Equal(t, tc.want.rootCAs, cfg.TLS.RootCAs != nil)
				require.Equal(t, tc.want.clientCert, cfg.TLS.GetClientCertificate != nil)
			}
			require.Equal(t, tc.want.user, cfg.Username)
			require.Equal(t, tc.want.password, cfg.Password)
		})
	}
}

// TestServeRefusesEtcdCredentialsWithoutEndpoints runs fencer serve with a
// credential flag and no --etcd-endpoints: it stops before starting the
// embedded etcd, so the data directory is never created.
func TestServeRefusesEtcdCredentialsWithoutEndpoints(t *testing.T) {
	p := newPKI(t)
	data := filepath.Join(t.TempDir(), "data")
	var stderr bytes.Buffer
	code := runServe(context.Background(), []string{"--listen", freeAddr(t), "--metrics-listen", "", "--data-dir", data, "--etcd-ca-file", p.caFile}, &bytes.Buffer{}, &stderr)
	require.Equal(t, 1, code)
	require.Contains(t, stderr.String(), "need --etcd-endpoints")
	require.NoDirExists(t, data)
}

// FuzzEtcdEndpoints feeds clientConfig arbitrary --etcd-endpoints lists:
// it never panics, and a configuration with TLS on never holds an endpoint
// that the etcd client would dial in plaintext.
func FuzzEtcdEndpoints(f *testing.F) {
	for _, s := range []string{"http://127.0.0.1:2379", "https://a:1,https://b:2", "127.0.0.1:2379", "https://a:1,b:2", "unix:///tmp/s", "://", "https://", "unixs:///run/s", "HTTPS://a:1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, list string) {
		cfg, _, err := etcdFlags{}.clientConfig(splitList(list), false, nil)
		if err != nil {
			require.ErrorIs(t, err, errEtcdFlags)
			return
		}
		if cfg.TLS != nil {
			for _, ep := range cfg.Endpoints {
				require.Regexp(t, `^(?i)(https://|unixs:)`, ep)
			}
		}
	})
}
