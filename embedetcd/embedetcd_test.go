package embedetcd_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/fencer-dev/fencer/embedetcd"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// grpc-go's callback serializer exits shortly after the client closes.
		goleak.IgnoreTopFunction("google.golang.org/grpc/internal/grpcsync.(*CallbackSerializer).run"),
		// etcd members talk raft over keep-alive HTTP connections that
		// outlive Close until their idle timeout.
		goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreAnyFunction("net/http.(*conn).serve"),
		goleak.IgnoreAnyFunction("net/http.(*connReader).backgroundRead"),
	)
}

func TestRestartKeepsDataAndPorts(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv, err := embedetcd.Start(ctx, embedetcd.Member{Name: "m", Dir: t.TempDir()})
	require.NoError(t, err)
	require.NotZero(t, srv.Member().ClientPort)
	require.NotZero(t, srv.Member().PeerPort)
	require.True(t, srv.IsLeader())
	put(t, srv.Endpoint(), "k", "v")
	srv.Close()
	srv.Close() // idempotent

	again, err := embedetcd.Start(ctx, srv.Member())
	require.NoError(t, err)
	defer again.Close()
	require.Equal(t, srv.Endpoint(), again.Endpoint())
	cli := client(t, again.Endpoint())
	resp, err := cli.Get(ctx, "k")
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1)
	require.Equal(t, "v", string(resp.Kvs[0].Value))
}

func TestStartClusterElectsOneLeader(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	base := t.TempDir()
	servers, err := embedetcd.StartCluster(ctx, []embedetcd.Member{
		{Name: "a", Dir: base + "/a"}, {Name: "b", Dir: base + "/b"}, {Name: "c", Dir: base + "/c"},
	})
	require.NoError(t, err)
	defer func() {
		for _, s := range servers {
			s.Close()
		}
	}()
	require.Len(t, embedetcd.Endpoints(servers), 3)
	require.Eventually(t, func() bool {
		leaders := 0
		for _, s := range servers {
			if s.IsLeader() {
				leaders++
			}
		}
		return leaders == 1
	}, 10*time.Second, 10*time.Millisecond)
	put(t, servers[2].Endpoint(), "k", "v")
}

func TestStartRejectsBadConfig(t *testing.T) {
	ctx := context.Background()
	for name, members := range map[string][]embedetcd.Member{
		"none":              nil,
		"no name":           {{Dir: t.TempDir()}},
		"no dir":            {{Name: "a"}},
		"separator in name": {{Name: "a=b", Dir: t.TempDir()}},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := embedetcd.StartCluster(ctx, members)
			require.ErrorIs(t, err, embedetcd.ErrConfig)
		})
	}
}

func client(t *testing.T, endpoint string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	require.NoError(t, err)
	t.Cleanup(func() { cli.Close() })
	return cli
}

func put(t *testing.T, endpoint, k, v string) {
	t.Helper()
	_, err := client(t, endpoint).Put(context.Background(), k, v)
	require.NoError(t, err)
}
