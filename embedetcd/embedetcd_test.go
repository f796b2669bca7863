package embedetcd_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/etcdserver"

	"github.com/fencer-dev/fencer/embedetcd"
	"github.com/fencer-dev/fencer/fencertest"
)

func TestMain(m *testing.M) { fencertest.Main(m, fencertest.IgnoreInProcessPeers()) }

func TestRestartKeepsDataAndPorts(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv, err := embedetcd.Start(ctx, embedetcd.Member{Name: "m", Dir: t.TempDir()})
	require.NoError(t, err)
	require.NotZero(t, srv.Member().ClientPort)
	require.NotZero(t, srv.Member().PeerPort)
	require.True(t, srv.IsLeader())
	require.EqualValues(t, embedetcd.SoloCatchUpEntries, srv.CatchUpEntries(), "a single member keeps few raft entries after a snapshot")
	put(t, srv.Endpoint(), "k", "v")
	srv.Close()
	srv.Close() // idempotent

	again, err := embedetcd.Start(ctx, srv.Member())
	require.NoError(t, err)
	defer again.Close()
	require.Equal(t, srv.Endpoint(), again.Endpoint())
	cli := fencertest.Client(t, again.Endpoint())
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
	for _, s := range servers {
		require.EqualValues(t, etcdserver.DefaultSnapshotCatchUpEntries, s.CatchUpEntries(), "a cluster's members keep etcd's default for their followers")
	}
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
	_, err := fencertest.Client(t, endpoint).Put(context.Background(), k, v)
	require.NoError(t, err)
}

func TestSecondMemberOnADirFailsAtOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	m := embedetcd.Member{Name: "m", Dir: t.TempDir(), Socket: true}
	srv, err := embedetcd.Start(ctx, m)
	require.NoError(t, err)
	defer srv.Close()

	// Without the lock, etcd waits on its own file lock forever, deaf to
	// ctx; a deadline here tells "at once" from "hangs".
	second := make(chan error, 1)
	go func() {
		_, err := embedetcd.Start(ctx, m)
		second <- err
	}()
	select {
	case err = <-second:
	case <-time.After(5 * time.Second):
		t.Fatal("a second member on the data directory hangs")
	}
	var locked *embedetcd.LockedError
	require.ErrorAs(t, err, &locked)
	require.ErrorIs(t, err, embedetcd.ErrLocked)
	require.Equal(t, m.Dir, locked.Dir)
	require.Contains(t, err.Error(), m.Dir)

	// The first member is unharmed, and the lock goes with it.
	put(t, srv.Endpoint(), "k", "v")
	srv.Close()
	again, err := embedetcd.Start(ctx, m)
	require.NoError(t, err)
	again.Close()
}

func TestSocketMemberIsPrivateAndStable(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := t.TempDir()
	srv, err := embedetcd.Start(ctx, embedetcd.Member{Name: "m", Dir: dir, Socket: true})
	require.NoError(t, err)
	require.Equal(t, "unix://"+filepath.Join(dir, "etcd.sock"), srv.Endpoint())
	require.Zero(t, srv.Member().ClientPort)
	require.Zero(t, srv.Member().PeerPort)
	for _, name := range []string{"etcd.sock", "peer.sock"} {
		fi, err := os.Stat(filepath.Join(dir, name))
		require.NoError(t, err)
		require.Equal(t, os.ModeSocket, fi.Mode().Type(), name)
		require.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), name)
	}
	fi, err := os.Stat(dir)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o700), fi.Mode().Perm())
	put(t, srv.Endpoint(), "k", "v")
	srv.Close()

	again, err := embedetcd.Start(ctx, srv.Member())
	require.NoError(t, err)
	defer again.Close()
	require.Equal(t, srv.Endpoint(), again.Endpoint())
	resp, err := fencertest.Client(t, again.Endpoint()).Get(ctx, "k")
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1)
}

// TestCompactionKeepsTheDatabaseBounded overwrites one key with 16 KiB
// values for rounds of 300 revisions, about 5 MiB of history a round. After
// each round it waits for automatic compaction to pass the round's first
// revision; freed pages are then reused, so the database file stops
// growing at a few rounds' worth while the history written keeps growing.
func TestCompactionKeepsTheDatabaseBounded(t *testing.T) {
	// 2,400 writes of 16 KiB, each fsynced: seconds on a quiet machine,
	// over a minute on a loaded one.
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	srv, err := embedetcd.Start(ctx, embedetcd.Member{Name: "m", Dir: t.TempDir()}, embedetcd.WithCompactionRetention(time.Second))
	require.NoError(t, err)
	defer srv.Close()
	cli := fencertest.Client(t, srv.Endpoint())
	value := strings.Repeat("x", 16<<10)
	const rounds, perRound = 8, 300
	var written int64
	for round := 0; round < rounds; round++ {
		var first int64
		for i := 0; i < perRound; i++ {
			resp, err := cli.Put(ctx, "k", value)
			require.NoError(t, err)
			if i == 0 {
				first = resp.Header.Revision
			}
			written += int64(len(value))
		}
		for {
			_, err := cli.Get(ctx, "k", clientv3.WithRev(first))
			if errors.Is(err, rpctypes.ErrCompacted) {
				break
			}
			require.NoError(t, err)
			select {
			case <-ctx.Done():
				t.Fatalf("round %d: revision %d never compacted", round, first)
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	st, err := cli.Status(ctx, srv.Endpoint())
	require.NoError(t, err)
	t.Logf("wrote %d MiB of values; database %d MiB, %d MiB in use", written>>20, st.DbSize>>20, st.DbSizeInUse>>20)
	require.Less(t, st.DbSize, written/2, "the database grew with the history: compaction does not free space")
}

// TestQuotaRefusesWritesWithNoSpace fills a 2 MiB quota. etcd's warnings
// reach the logger; its info logs do not. The only info records are the
// start-up warnings the member's logger knows to be moot or a once-only
// race at start, and only those may come at info.
func TestQuotaRefusesWritesWithNoSpace(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var logs logBuffer
	srv, err := embedetcd.Start(ctx, embedetcd.Member{Name: "m", Dir: t.TempDir()},
		embedetcd.WithQuota(2<<20), embedetcd.WithLogger(slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))))
	require.NoError(t, err)
	defer srv.Close()
	fillUntilNoSpace(ctx, t, fencertest.Client(t, srv.Endpoint()))
	records := logs.records(t)
	require.NotEmpty(t, records)
	for _, r := range records {
		if r["component"] == "embedetcd" {
			continue // the compactor's, at NOSPACE (TestNoSpaceRecoversByItself)
		}
		require.Equal(t, "etcd", r["component"], r)
		if r["level"] == "INFO" {
			require.Contains(t, demotedAtStart, r["msg"], "etcd logs below warn reach the logger: %v", r)
			continue
		}
		require.Contains(t, []string{"WARN", "ERROR"}, r["level"], "etcd logs below warn reach the logger: %v", r)
	}
}

// demotedAtStart are the warnings, and the one error, that a member's
// logger sends out at info (see moot and startupRace in slogcore.go).
var demotedAtStart = []any{
	"Running http and grpc server on single port. This is not recommended for production.",
	"simple token is not cryptographically signed",
	"Failed to detect schema version",
	"failed to update storage version",
}

func TestStartRejectsBadOptions(t *testing.T) {
	ctx := context.Background()
	one := []embedetcd.Member{{Name: "a", Dir: t.TempDir()}}
	for name, tc := range map[string]struct {
		members []embedetcd.Member
		opts    []embedetcd.Option
	}{
		"retention under a second": {one, []embedetcd.Option{embedetcd.WithCompactionRetention(time.Millisecond)}},
		"zero quota":               {one, []embedetcd.Option{embedetcd.WithQuota(0)}},
		"socket in a cluster": {[]embedetcd.Member{
			{Name: "a", Dir: t.TempDir(), Socket: true}, {Name: "b", Dir: t.TempDir(), Socket: true},
		}, nil},
		"socket path too long": {[]embedetcd.Member{{Name: "a", Dir: filepath.Join(t.TempDir(), strings.Repeat("d", 120)), Socket: true}}, nil},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := embedetcd.StartCluster(ctx, tc.members, tc.opts...)
			require.ErrorIs(t, err, embedetcd.ErrConfig)
		})
	}
}

// logBuffer collects JSON log lines written concurrently.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) records(t *testing.T) []map[string]any {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []map[string]any
	for _, line := range bytes.Split(bytes.TrimSpace(b.buf.Bytes()), []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		var r map[string]any
		require.NoError(t, json.Unmarshal(line, &r), string(line))
		out = append(out, r)
	}
	return out
}

// TestDefragmentThroughTheSocket follows the documented defrag path on a
// Socket member: compact, then defragment through the member's unix
// socket endpoint (what etcdctl --endpoints unix://<data-dir>/etcd.sock
// defrag does), and the database file shrinks.
func TestDefragmentThroughTheSocket(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv, err := embedetcd.Start(ctx, embedetcd.Member{Name: "m", Dir: t.TempDir(), Socket: true})
	require.NoError(t, err)
	defer srv.Close()
	cli := fencertest.Client(t, srv.Endpoint())
	value := strings.Repeat("x", 64<<10)
	var last int64
	for i := 0; i < 200; i++ {
		resp, err := cli.Put(ctx, "k", value)
		require.NoError(t, err)
		last = resp.Header.Revision
	}
	_, err = cli.Compact(ctx, last, clientv3.WithCompactPhysical())
	require.NoError(t, err)
	before, err := cli.Status(ctx, srv.Endpoint())
	require.NoError(t, err)
	_, err = cli.Defragment(ctx, srv.Endpoint())
	require.NoError(t, err)
	after, err := cli.Status(ctx, srv.Endpoint())
	require.NoError(t, err)
	t.Logf("database %d KiB before defragmentation, %d KiB after", before.DbSize>>10, after.DbSize>>10)
	require.Less(t, after.DbSize, before.DbSize/2)
}

// TestInProcessClient: the member's in-process client serves what fencer
// uses (KV, Txn, leases, watches, compaction) with the errors a client over
// the socket gets, NOSPACE included, and the socket keeps serving beside it.
func TestInProcessClient(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv, err := embedetcd.Start(ctx, embedetcd.Member{Name: "m", Dir: t.TempDir(), Socket: true}, embedetcd.WithQuota(2<<20))
	require.NoError(t, err)
	defer srv.Close()
	cli := srv.Client()
	defer cli.Close()

	w := cli.Watch(ctx, "k", clientv3.WithPrefix())
	put, err := cli.Put(ctx, "k1", "v1")
	require.NoError(t, err)
	select {
	case ev := <-w:
		require.NoError(t, ev.Err())
		require.Len(t, ev.Events, 1)
		require.Equal(t, "k1", string(ev.Events[0].Kv.Key))
	case <-ctx.Done():
		t.Fatal("no watch event")
	}
	txn, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision("k1"), "=", put.Header.Revision)).
		Then(clientv3.OpPut("k1", "v2")).Commit()
	require.NoError(t, err)
	require.True(t, txn.Succeeded)

	g, err := cli.Grant(ctx, 5)
	require.NoError(t, err)
	_, err = cli.KeepAliveOnce(ctx, g.ID)
	require.NoError(t, err)
	_, err = cli.Revoke(ctx, g.ID)
	require.NoError(t, err)
	_, err = cli.KeepAliveOnce(ctx, g.ID)
	require.ErrorIs(t, err, rpctypes.ErrLeaseNotFound)

	_, err = cli.Compact(ctx, txn.Header.Revision)
	require.NoError(t, err)
	_, err = cli.Get(ctx, "k1", clientv3.WithRev(put.Header.Revision))
	require.ErrorIs(t, err, rpctypes.ErrCompacted)

	sock := fencertest.Client(t, srv.Endpoint())
	got, err := sock.Get(ctx, "k1")
	require.NoError(t, err)
	require.Equal(t, "v2", string(got.Kvs[0].Value), "the socket serves beside the in-process client")
	fillUntilNoSpace(ctx, t, cli)
}

// fillUntilNoSpace writes 256 KiB values through cli until etcd refuses
// one with NOSPACE, as a member with a 2 MiB quota must.
func fillUntilNoSpace(ctx context.Context, t *testing.T, cli *clientv3.Client) {
	t.Helper()
	value := strings.Repeat("x", 256<<10)
	for i := 0; ; i++ {
		_, err := cli.Put(ctx, fmt.Sprintf("big%d", i), value)
		if err != nil {
			require.ErrorIs(t, err, rpctypes.ErrNoSpace)
			return
		}
		require.Less(t, i, 100, "no NOSPACE after 25 MiB into a 2 MiB quota")
	}
}
