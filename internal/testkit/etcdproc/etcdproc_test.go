package etcdproc_test

import (
	"context"
	"crypto/tls"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/fencer-dev/fencer/fencertest"
	"github.com/fencer-dev/fencer/internal/testkit/etcdproc"
	"github.com/fencer-dev/fencer/internal/testkit/testca"
)

func TestMain(m *testing.M) {
	etcdproc.RunIfMember()
	os.Exit(fencertest.CheckLeaks(m.Run(), fencertest.IgnoreInProcessPeers()))
}

func client(t *testing.T, endpoints ...string) *clientv3.Client {
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	require.NoError(t, err)
	t.Cleanup(func() { cli.Close() })
	return cli
}

// TestClusterFaults kills, restarts and isolates members and moves the
// leadership, and checks that each fault is real: a killed member's
// endpoint is gone, an isolated member cannot serve a linearizable read
// while the others can, and the data survives.
func TestClusterFaults(t *testing.T) {
	c := etcdproc.Start(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	all := client(t, c.Endpoints()...)
	_, err := all.Put(ctx, "k", "v1")
	require.NoError(t, err)

	t.Run("kill and restart the leader", func(t *testing.T) {
		l, err := c.Leader(ctx)
		require.NoError(t, err)
		c.Kill(l)
		defer func() { _ = c.Restart(ctx, l) }() // if the test fails before it does
		one := client(t, c.Endpoints()[l])
		sctx, scancel := context.WithTimeout(ctx, 300*time.Millisecond)
		_, err = one.Get(sctx, "k")
		scancel()
		require.Error(t, err, "the killed member still answers")
		nl, err := c.Leader(ctx)
		require.NoError(t, err)
		require.NotEqual(t, l, nl)
		_, err = all.Put(ctx, "k", "v2")
		require.NoError(t, err)
		require.NoError(t, c.Restart(ctx, l))
		resp, err := one.Get(ctx, "k")
		require.NoError(t, err)
		require.Equal(t, "v2", string(resp.Kvs[0].Value))
	})

	t.Run("move the leader", func(t *testing.T) {
		l, err := c.Leader(ctx)
		require.NoError(t, err)
		to := (l + 1) % c.Len()
		require.NoError(t, c.MoveLeader(ctx, to))
		nl, err := c.Leader(ctx)
		require.NoError(t, err)
		require.Equal(t, to, nl)
	})

	t.Run("isolate a member", func(t *testing.T) {
		if !etcdproc.CanIsolate {
			t.Skip("this system cannot tell which member opened a connection")
		}
		l, err := c.Leader(ctx)
		require.NoError(t, err)
		c.Isolate(l)
		defer c.Heal()
		one := client(t, c.Endpoints()[l])
		sctx, scancel := context.WithTimeout(ctx, 3*time.Second)
		_, err = one.Get(sctx, "k")
		scancel()
		require.Error(t, err, "an isolated member served a linearizable read")
		var others []string
		for i, ep := range c.Endpoints() {
			if i != l {
				others = append(others, ep)
			}
		}
		_, err = client(t, others...).Put(ctx, "k", "v3")
		require.NoError(t, err, "the majority side does not serve")
		c.Heal()
		require.Eventually(t, func() bool {
			sctx, scancel := context.WithTimeout(ctx, time.Second)
			defer scancel()
			resp, err := one.Get(sctx, "k")
			return err == nil && string(resp.Kvs[0].Value) == "v3"
		}, 30*time.Second, 100*time.Millisecond, "the healed member does not catch up")
	})
}

// TestClientTLSAndAuth starts a cluster WithClientTLS, enables
// authentication, and checks that each guard bites: plaintext, a client
// without a certificate, one with a certificate of another CA, a wrong
// password, and a key outside the user's prefix are all refused, while the
// user with its password and a certificate writes under its prefix.
func TestClientTLSAndAuth(t *testing.T) {
	ca := testca.New(t, "etcd CA")
	c := etcdproc.Start(t, 3, etcdproc.WithClientTLS(ca))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.ErrorIs(t, etcdproc.Start(t, 1).EnableAuth(ctx, "u", "p", "/"), etcdproc.ErrNoClientTLS)
	require.NoError(t, c.EnableAuth(ctx, "fencer", "pw", "/fencer/"))
	for _, ep := range c.Endpoints() {
		require.True(t, strings.HasPrefix(ep, "https://"), ep)
	}
	dir := t.TempDir()
	certFile, keyFile := c.ClientCert(t, dir, "fencer")
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	require.NoError(t, err)
	other := testca.New(t, "another CA")
	connect := func(t *testing.T, endpoints []string, tlsCfg *tls.Config, user, password string) error {
		cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, TLS: tlsCfg, Username: user, Password: password, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			return err
		}
		defer cli.Close()
		sctx, scancel := context.WithTimeout(ctx, 3*time.Second)
		defer scancel()
		_, err = cli.Put(sctx, "/fencer/k", "v")
		return err
	}
	good := &tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	require.NoError(t, connect(t, c.Endpoints(), good, "fencer", "pw"))
	plain := strings.Replace(c.Endpoints()[0], "https://", "http://", 1)
	for name, err := range map[string]error{
		"plaintext":           connect(t, []string{plain}, nil, "fencer", "pw"),
		"no certificate":      connect(t, c.Endpoints(), &tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12}, "fencer", "pw"),
		"another CA's client": connect(t, c.Endpoints(), &tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{other.ClientCert(t, "fencer")}, MinVersion: tls.VersionTLS12}, "fencer", "pw"),
		"wrong password":      connect(t, c.Endpoints(), good, "fencer", "nope"),
	} {
		require.Error(t, err, name)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), TLS: good, Username: "fencer", Password: "pw", DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	require.NoError(t, err)
	defer cli.Close()
	_, err = cli.Put(ctx, "/other/k", "v")
	require.ErrorIs(t, err, rpctypes.ErrPermissionDenied)
}
