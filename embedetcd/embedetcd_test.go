package embedetcd_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fencer-dev/fencer/embedetcd"
	"github.com/fencer-dev/fencer/internal/etcdtest"
)

func TestMain(m *testing.M) { etcdtest.Main(m) }

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
	cli := etcdtest.Client(t, again.Endpoint())
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

func put(t *testing.T, endpoint, k, v string) {
	t.Helper()
	_, err := etcdtest.Client(t, endpoint).Put(context.Background(), k, v)
	require.NoError(t, err)
}
