package main

import (
	"context"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/fencer-dev/fencer/client"
	"github.com/fencer-dev/fencer/embedetcd"
	"github.com/fencer-dev/fencer/etcdstore"
	"github.com/fencer-dev/fencer/token"
)

// embeddedServe runs fencer serve on the embedded etcd in dataDir until
// stop is called, and returns a client of it and the embedded etcd's
// endpoint, read from the log line that prints it.
func embeddedServe(t *testing.T, dataDir string) (cli *client.Client, endpoint string, stop func()) {
	t.Helper()
	f := serveFlags{listen: freeAddr(t), dataDir: dataDir, prefix: etcdstore.DefaultPrefix, batch: etcdstore.DefaultBatch, grace: 5 * time.Second,
		etcdQuota: embedetcd.DefaultQuotaBytes, etcdRetention: embedetcd.DefaultCompactionRetention}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var stderr safeBuffer
	go func() { done <- serve(ctx, f, &stderr) }()
	cc, err := grpc.NewClient(f.listen, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cc.Close()
		cancel()
		require.NoError(t, <-done, stderr.String())
	}
	t.Cleanup(stop)
	cli = client.New(cc)
	re := regexp.MustCompile(`msg="embedded etcd" .*endpoint=(\S+)`)
	require.Eventually(t, func() bool {
		lctx, lcancel := context.WithTimeout(ctx, time.Second)
		defer lcancel()
		_, err := cli.List(lctx)
		return err == nil && re.MatchString(stderr.String())
	}, 30*time.Second, 20*time.Millisecond, stderr.String())
	return cli, re.FindStringSubmatch(stderr.String())[1], stop
}

// TestBackupAndRestoreEmbedded follows docs/operations.md's backup and
// restore of the embedded etcd: snapshot it while fencer serve runs, let a
// lease change hands after the snapshot, stop, restore the snapshot with a
// revision bump into a new data directory, and serve from it. The data of
// the snapshot is back, and the token issued after the snapshot, which a
// holder may still carry, is refused: a new acquisition's token is greater.
// Without the bump (RevisionBump 0) the same steps after the restore land
// on the revisions issued before it, and the test fails.
func TestBackupAndRestoreEmbedded(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cli, endpoint, stop := embeddedServe(t, filepath.Join(dir, "data"))
	s, err := cli.NewSession()
	require.NoError(t, err)
	l1, err := s.Acquire(ctx, "backup")
	require.NoError(t, err)
	_, err = cli.Put(ctx, l1.Token(), "k", []byte("in the snapshot"))
	require.NoError(t, err)
	require.NoError(t, l1.Release(ctx))

	backup := filepath.Join(dir, "backup.db")
	_, err = snapshot.NewV3(zap.NewNop()).Save(ctx, clientv3.Config{Endpoints: []string{endpoint}, Logger: zap.NewNop()}, backup)
	require.NoError(t, err)

	require.NoError(t, s.Close(ctx))
	// A new session, as the restored store will see: without a revision
	// bump, the same steps after the restore land on the same revisions.
	s2, err := cli.NewSession()
	require.NoError(t, err)
	l2, err := s2.Acquire(ctx, "backup")
	require.NoError(t, err)
	after := l2.Token() // issued after the snapshot; its holder lives on
	_, err = cli.Put(ctx, after, "k", []byte("after the snapshot"))
	require.NoError(t, err)
	require.NoError(t, s2.Close(ctx))
	stop()

	restored := filepath.Join(dir, "restored")
	require.NoError(t, snapshot.NewV3(zap.NewNop()).Restore(snapshot.RestoreConfig{
		SnapshotPath:        backup,
		Name:                "fencer",
		OutputDataDir:       restored,
		OutputWALDir:        filepath.Join(restored, "wal"),
		PeerURLs:            []string{"http://localhost:2380"},
		InitialCluster:      "fencer=http://localhost:2380",
		InitialClusterToken: "fencer",
		RevisionBump:        1_000_000_000,
		MarkCompacted:       true,
	}))

	cli, _, _ = embeddedServe(t, restored)
	v, found, err := cli.Get(ctx, "k")
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, "in the snapshot", string(v.Data))
	s, err = cli.NewSession()
	require.NoError(t, err)
	defer s.Close(ctx)
	l3, err := s.Acquire(ctx, "backup")
	require.NoError(t, err)
	order, err := l3.Token().Compare(after)
	require.NoError(t, err)
	require.Equal(t, 1, order, "the restored store reissued %s as %s", after, l3.Token())
	_, err = cli.Put(ctx, after, "k", []byte("stale"))
	require.ErrorIs(t, err, token.ErrStale)
	_, err = cli.Put(ctx, l3.Token(), "k", []byte("restored"))
	require.NoError(t, err)
}
