package embedetcd_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencer-dev/fencer/embedetcd"
)

// spaceQuota is the quota of the bounded space tests: small, so that a
// few seconds of writes fill it when nothing compacts.
const spaceQuota = 16 << 20

// load is the record of a writeLoad: what was written, what etcd
// acknowledged, and what it refused for space.
type load struct {
	mu      sync.Mutex
	acked   map[string]string // unique key -> value, for every acknowledged write
	lastHot string            // the hot key's value of the highest acknowledged revision
	lastRev int64

	written    atomic.Int64 // bytes of values acknowledged
	puts       atomic.Int64 // acknowledged writes
	noSpace    atomic.Int64 // writes refused with NOSPACE
	firstNoSp  atomic.Int64 // unix nanos of the first NOSPACE refusal
	recoveredA atomic.Int64 // unix nanos of the first acknowledged write after it
	maxDB      atomic.Int64 // the largest database file sampled
}

// writeLoad runs writers goroutines, each writing in a loop one Txn that
// overwrites the hot key with a value of valueSize bytes (the history that
// fills a member) and, with unique, creates a small unique key (live data,
// which must all read back), until stop says so or ctx ends. A write refused with
// NOSPACE is counted, and the writer goes on. Every 50 ms it samples the
// member's database size.
func writeLoad(ctx context.Context, t *testing.T, srv *embedetcd.Server, cli *clientv3.Client, writers, valueSize int, unique bool, stop func(*load) bool) *load {
	t.Helper()
	l := &load{acked: map[string]string{}}
	var seq atomic.Int64
	var wg sync.WaitGroup
	done := make(chan struct{})
	var stopOnce sync.Once
	finish := func() { stopOnce.Do(func() { close(done) }) }
	errs := make(chan error, writers)
	for w := 0; w < writers; w++ {
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				case <-ctx.Done():
					errs <- fmt.Errorf("load did not finish: %w", ctx.Err())
					finish()
					return
				default:
				}
				n := seq.Add(1)
				key, small := fmt.Sprintf("acked/%08d", n), fmt.Sprintf("v%d", n)
				big := fmt.Sprintf("%08d", n) + strings.Repeat("x", valueSize-8)
				ops := []clientv3.Op{clientv3.OpPut("hot", big)}
				if unique {
					ops = append(ops, clientv3.OpPut(key, small))
				}
				resp, err := cli.Txn(ctx).Then(ops...).Commit()
				switch {
				case errors.Is(err, rpctypes.ErrNoSpace):
					l.noSpace.Add(1)
					l.firstNoSp.CompareAndSwap(0, time.Now().UnixNano())
					time.Sleep(10 * time.Millisecond)
				case err != nil:
					if ctx.Err() == nil {
						errs <- err
					}
					finish()
					return
				default:
					if l.firstNoSp.Load() != 0 {
						l.recoveredA.CompareAndSwap(0, time.Now().UnixNano())
					}
					l.puts.Add(1)
					l.written.Add(int64(valueSize))
					l.mu.Lock()
					if unique {
						l.acked[key] = small
					}
					if resp.Header.Revision > l.lastRev {
						l.lastRev, l.lastHot = resp.Header.Revision, big[:8]
					}
					l.mu.Unlock()
				}
				if stop(l) {
					finish()
				}
			}
		})
	}
	wg.Go(func() {
		for {
			if st, err := cli.Status(ctx, srv.Endpoint()); err == nil && st.DbSize > l.maxDB.Load() {
				l.maxDB.Store(st.DbSize)
			}
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	})
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	return l
}

// readBack checks that every write l saw acknowledged is in the store:
// each unique key with its value, and the hot key with the value of the
// highest acknowledged revision.
func readBack(ctx context.Context, t *testing.T, cli *clientv3.Client, l *load) {
	t.Helper()
	got, err := cli.Get(ctx, "acked/", clientv3.WithPrefix())
	require.NoError(t, err)
	have := make(map[string]string, len(got.Kvs))
	for _, kv := range got.Kvs {
		have[string(kv.Key)] = string(kv.Value)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for k, v := range l.acked {
		require.Equal(t, v, have[k], "acknowledged write of %s lost", k)
	}
	hot, err := cli.Get(ctx, "hot")
	require.NoError(t, err)
	require.Len(t, hot.Kvs, 1)
	require.Equal(t, l.lastHot, string(hot.Kvs[0].Value[:8]), "the hot key's last acknowledged value is lost")
}

// TestDefaultCompactionKeepsFastWritesUnderTheQuota writes, as fast as 8
// writers can, twice a 16 MiB quota of 16 KiB values over one hot
// key: history, not live data. With the default policy no write is
// refused for space and the database file stays under the quota.
// (TestNoSpaceRecoversByItself runs the same load without the size rule,
// as the old policy did, and reaches NOSPACE.)
func TestDefaultCompactionKeepsFastWritesUnderTheQuota(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, err := embedetcd.Start(ctx, embedetcd.Member{Name: "m", Dir: t.TempDir()}, embedetcd.WithQuota(spaceQuota))
	require.NoError(t, err)
	defer srv.Close()
	cli := srv.Client()
	defer cli.Close()
	start := time.Now()
	l := writeLoad(ctx, t, srv, cli, 8, 16<<10, true, func(l *load) bool {
		return l.written.Load() >= 2*spaceQuota || l.noSpace.Load() > 0
	})
	took := time.Since(start)
	t.Logf("wrote %d MiB in %d writes in %s (%.0f writes/s); largest database file %.1f MiB; %d refused for space",
		l.written.Load()>>20, l.puts.Load(), took.Round(time.Millisecond), float64(l.puts.Load())/took.Seconds(), float64(l.maxDB.Load())/(1<<20), l.noSpace.Load())
	require.Zero(t, l.noSpace.Load(), "writes refused for space")
	require.Less(t, l.maxDB.Load(), int64(spaceQuota))
	readBack(ctx, t, cli, l)
}

// recoveryBound is how soon after the first write refused for space a
// member must accept writes again by itself: a compactor tick (100 ms), the
// compaction, a defragmentation of a 16 MiB file and a raft round, with a
// wide margin for a loaded machine.
const recoveryBound = 10 * time.Second

// TestNoSpaceRecoversByItself runs TestDefaultCompactionKeepsFastWritesUnderTheQuota's
// load with the compactor's size rule off and a 1 h retention: etcd's
// periodic compaction at its old default, which compacts nothing for the
// first hour. The member reaches NOSPACE (what fencer serve did under the
// old default). Its compactor then compacts, defragments and disarms by
// itself: writes are accepted again within recoveryBound, and every write
// acknowledged before, during and after reads back.
func TestNoSpaceRecoversByItself(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var logs logBuffer
	srv, err := embedetcd.Start(ctx, embedetcd.Member{Name: "m", Dir: t.TempDir()}, embedetcd.WithQuota(spaceQuota),
		embedetcd.WithCompactionRetention(time.Hour), embedetcd.WithoutSizeBound(),
		embedetcd.WithLogger(slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))))
	require.NoError(t, err)
	defer srv.Close()
	cli := srv.Client()
	defer cli.Close()
	var after atomic.Int64 // acknowledged writes at the recovery
	l := writeLoad(ctx, t, srv, cli, 8, 16<<10, true, func(l *load) bool {
		if l.recoveredA.Load() == 0 {
			if first := l.firstNoSp.Load(); first != 0 {
				return time.Since(time.Unix(0, first)) > recoveryBound // no recovery: give up
			}
			return l.written.Load() >= 2*spaceQuota // the quota holds 16 MiB: NOSPACE comes first
		}
		after.CompareAndSwap(0, l.puts.Load())
		return l.puts.Load() >= after.Load()+100
	})
	require.NotZero(t, l.firstNoSp.Load(), "2 quotas of history written and no NOSPACE: something compacts")
	require.NotZero(t, l.recoveredA.Load(), "writes never accepted again after NOSPACE")
	took := time.Duration(l.recoveredA.Load() - l.firstNoSp.Load())
	t.Logf("%d writes acknowledged (%d MiB), %d refused for space; writes accepted again %s after the first refusal; largest database file %.1f MiB; %+v",
		l.puts.Load(), l.written.Load()>>20, l.noSpace.Load(), took.Round(time.Millisecond), float64(l.maxDB.Load())/(1<<20), srv.SpaceStats())
	require.Less(t, took, recoveryBound)
	st := srv.SpaceStats()
	require.GreaterOrEqual(t, st.NoSpaceAlarms, int64(1))
	require.GreaterOrEqual(t, st.Recoveries, int64(1))
	readBack(ctx, t, cli, l)
	alarms, err := cli.AlarmList(ctx)
	require.NoError(t, err)
	require.Empty(t, alarms.Alarms)
	var msgs []any
	for _, r := range logs.records(t) {
		if r["component"] == "embedetcd" {
			msgs = append(msgs, r["level"].(string)+" "+r["msg"].(string))
		}
	}
	require.Contains(t, msgs, "WARN etcd out of space: compacting all history, defragmenting and disarming the NOSPACE alarm")
	require.Contains(t, msgs, "INFO etcd space recovered: NOSPACE alarm disarmed, writes accepted again")
}

// TestSoak is the 10-minute soak of make bench (scripts/bench.sh), run only
// with FENCER_SOAK=1: 32 writers overwrite one key with 1 KiB values as
// fast as the member takes them, through its in-process client (faster
// than through fencer serve, which adds a gRPC hop), under a 256 MiB quota
// and the default compaction policy. FENCER_SOAK_DURATION overrides the
// 10 minutes. It asserts no write refused for space and the database file
// under the quota, and logs the largest file, the rate and the counts.
func TestSoak(t *testing.T) {
	if os.Getenv("FENCER_SOAK") != "1" {
		t.Skip("the 10-minute soak runs with FENCER_SOAK=1 (make bench)")
	}
	d := 10 * time.Minute
	if v := os.Getenv("FENCER_SOAK_DURATION"); v != "" {
		var err error
		d, err = time.ParseDuration(v)
		require.NoError(t, err, "FENCER_SOAK_DURATION")
	}
	const quota = 256 << 20
	ctx, cancel := context.WithTimeout(context.Background(), d+2*time.Minute)
	defer cancel()
	srv, err := embedetcd.Start(ctx, embedetcd.Member{Name: "m", Dir: t.TempDir()}, embedetcd.WithQuota(quota))
	require.NoError(t, err)
	defer srv.Close()
	cli := srv.Client()
	defer cli.Close()
	start := time.Now()
	l := writeLoad(ctx, t, srv, cli, 32, 1<<10, false, func(*load) bool { return time.Since(start) >= d })
	took := time.Since(start)
	st := srv.SpaceStats()
	t.Logf("soak: %s, %d writes of 1 KiB (%.0f writes/s, %d MiB); quota %d MiB; largest database file %.1f MiB, at the end %.1f MiB (%.1f MiB in use); %d refused for space; %d compactions (%d by size), %d NOSPACE alarms, %d recoveries",
		took.Round(time.Second), l.puts.Load(), float64(l.puts.Load())/took.Seconds(), l.written.Load()>>20, quota>>20,
		float64(l.maxDB.Load())/(1<<20), float64(st.DBSize)/(1<<20), float64(st.DBSizeInUse)/(1<<20), l.noSpace.Load(),
		st.Compactions, st.SizeCompactions, st.NoSpaceAlarms, st.Recoveries)
	require.Zero(t, l.noSpace.Load(), "writes refused for space")
	require.Less(t, l.maxDB.Load(), int64(quota))
	readBack(ctx, t, cli, l)
}
