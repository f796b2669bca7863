package server_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencer-dev/fencer/client"
	"github.com/fencer-dev/fencer/etcdstore"
	"github.com/fencer-dev/fencer/fencertest"
	"github.com/fencer-dev/fencer/internal/holderkey"
)

// BenchmarkServiceGuardedPut compares a guarded Put through the gRPC
// service with the same guarded etcd Txn made directly, at 1 and 64
// concurrent clients. Three variants share one etcd member and one etcd
// client, and run interleaved in rounds so that drift on a shared machine
// hits them alike:
//
//   - direct: a hand-written guarded Txn per Put,
//     If(CreateRevision(holder) = token).Then(OpPut), the physical limit of
//     one write per Txn;
//   - grpc: client.Client.Put through a server whose store batches
//     concurrent writes (the default, etcdstore.DefaultBatch, as fencer
//     serve does);
//   - unbatched: the same through a server whose store sends one Txn per
//     Put (etcdstore.WithBatching(0)).
//
// ratio is grpc over direct throughput and unbatched-ratio is unbatched
// over direct. cpu-us/put is the process's CPU time (etcd, servers and
// clients all run in it) per Put of each variant, where the platform
// reports it.
func BenchmarkServiceGuardedPut(b *testing.B) {
	for _, conc := range []int{1, 64} {
		b.Run(fmt.Sprintf("clients=%d", conc), func(b *testing.B) {
			ctx := context.Background()
			st := fencertest.SharedStore(b)
			unbatched, err := etcdstore.New(st.Client(), etcdstore.WithPrefix(st.Prefix()), etcdstore.WithBatching(0))
			require.NoError(b, err)
			addr, _ := startServer(b, st)
			unbatchedAddr, _ := startServer(b, unbatched)
			c, u := client.New(dial(b, alice, addr)), client.New(dial(b, alice, unbatchedAddr))
			l, err := newSession(b, c).Acquire(ctx, "bench")
			require.NoError(b, err)
			tok := l.Token()
			// The baseline is the documented hand-written guard, one compare.
			guard := clientv3.Compare(clientv3.CreateRevision(holderkey.Key(st.Prefix(), tok.Lease)), "=", tok.Revision)
			value := []byte("some value of a typical size, say sixty-four bytes long........")
			variants := []func(key string) error{
				func(key string) error {
					r, err := st.Client().Txn(ctx).If(guard).Then(clientv3.OpPut(st.DataKey(key), string(value))).Commit()
					if err == nil && !r.Succeeded {
						err = fmt.Errorf("direct guarded Txn failed")
					}
					return err
				},
				func(key string) error { _, err := c.Put(ctx, tok, key, value); return err },
				func(key string) error { _, err := u.Put(ctx, tok, key, value); return err },
			}
			b.ResetTimer()
			wall, cpu := runRounds(b, conc, b.N, variants)
			b.StopTimer()
			for i, name := range []string{"direct", "grpc", "unbatched"} {
				b.ReportMetric(float64(b.N)/wall[i].Seconds(), name+"-puts/s")
				b.ReportMetric(float64(cpu[i].Microseconds())/float64(b.N), name+"-cpu-us/put")
			}
			b.ReportMetric(wall[0].Seconds()/wall[1].Seconds(), "ratio")
			b.ReportMetric(wall[0].Seconds()/wall[2].Seconds(), "unbatched-ratio")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// runRounds runs n calls of each variant on conc workers, in rounds of at
// most 1000 calls per variant, and returns each variant's wall-clock and
// process CPU time. Calls write 1024 distinct keys in turn.
func runRounds(b *testing.B, conc, n int, variants []func(key string) error) (wall, cpu []time.Duration) {
	b.Helper()
	wall, cpu = make([]time.Duration, len(variants)), make([]time.Duration, len(variants))
	const round = 1000
	for done := 0; done < n; done += round {
		end := int64(min(done+round, n))
		for v, call := range variants {
			next := atomic.Int64{}
			next.Store(int64(done))
			var wg sync.WaitGroup
			cpu0, start := cpuTime(b), time.Now()
			for w := 0; w < conc; w++ {
				wg.Go(func() {
					for i := next.Add(1); i <= end; i = next.Add(1) {
						if err := call("k" + strconv.Itoa(int(i%1024))); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			wall[v] += time.Since(start)
			cpu[v] += cpuTime(b) - cpu0
		}
	}
	return wall, cpu
}

// BenchmarkWatchLeaseFanout measures what WatchLease streams cost while
// leases change hands: Acquire+Release cycles of one lease, made directly
// on the store, with 1 and then with 200 other remote sessions holding a
// lease each (and so each with a WatchLease stream open). Every cycle
// changes a holder key twice. It reports the process's CPU time per cycle
// in each phase and their ratio: near 1 when the streams share one etcd
// watch, growing with the number of streams when each has its own.
func BenchmarkWatchLeaseFanout(b *testing.B) {
	ctx := context.Background()
	st := fencertest.SharedStore(b)
	addr, _ := startServer(b, st)
	c := client.New(dial(b, alice, addr))
	churn, err := st.NewSession(ctx)
	require.NoError(b, err)
	b.Cleanup(func() { _ = churn.Close(ctx) })
	hold := func(n int) {
		for i := 0; i < n; i++ {
			_, err := newSession(b, c).Acquire(ctx, fmt.Sprintf("held-%d-%d", n, i))
			require.NoError(b, err)
		}
		time.Sleep(100 * time.Millisecond) // the streams are open
	}
	cycles := func() time.Duration {
		cpu0 := cpuTime(b)
		for i := 0; i < b.N; i++ {
			l, err := churn.Acquire(ctx, "churn")
			require.NoError(b, err)
			require.NoError(b, l.Release(ctx))
		}
		return cpuTime(b) - cpu0
	}
	b.ResetTimer()
	hold(1)
	one := cycles()
	b.StopTimer()
	hold(199)
	b.StartTimer()
	many := cycles()
	b.StopTimer()
	b.ReportMetric(float64(one.Microseconds())/float64(b.N), "streams1-cpu-us/cycle")
	b.ReportMetric(float64(many.Microseconds())/float64(b.N), "streams200-cpu-us/cycle")
	b.ReportMetric(many.Seconds()/one.Seconds(), "cpu-ratio")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkServiceRSS10kLeases measures the resident memory of a fencer
// serve process (built from ./cmd/fencer, on the shared etcd member) that
// serves 10,000 held leases: one session holding them all, renewed and
// watched by one client. It reports the server's RSS in MB before and with
// the leases held. Each iteration is one full run; use -benchtime 1x.
func BenchmarkServiceRSS10kLeases(b *testing.B) {
	const leases = 10000
	_, file, _, _ := runtime.Caller(0)
	bin := filepath.Join(b.TempDir(), "fencer")
	build := exec.Command("go", "build", "-o", bin, "./cmd/fencer")
	build.Dir = filepath.Join(filepath.Dir(file), "..")
	out, err := build.CombinedOutput()
	require.NoError(b, err, string(out))
	for i := 0; i < b.N; i++ {
		st := fencertest.SharedStore(b)
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(b, err)
		addr := lis.Addr().String()
		lis.Close()
		cmd := exec.Command(bin, "serve", "--etcd-endpoints", fencertest.SharedEtcd(b), "--prefix", st.Prefix(), "--listen", addr, "--metrics-listen", "")
		require.NoError(b, cmd.Start())
		b.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
		ctx := context.Background()
		c := client.New(dial(b, "", addr))
		require.Eventually(b, func() bool { _, _, err := c.Get(ctx, "x"); return err == nil }, 10*time.Second, 50*time.Millisecond)
		idle := rssMB(b, cmd.Process.Pid)
		s := newSession(b, c, client.WithTTL(30*time.Second))
		_, err = s.Acquire(ctx, "l0")
		require.NoError(b, err)
		var next atomic.Int64
		var wg sync.WaitGroup
		for w := 0; w < 32; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := next.Add(1); j < leases; j = next.Add(1) {
					if _, err := s.Acquire(ctx, "l"+strconv.Itoa(int(j))); err != nil {
						b.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		list, err := c.List(ctx)
		require.NoError(b, err)
		require.Len(b, list, leases)
		runtime.GC()
		time.Sleep(time.Second)
		b.ReportMetric(idle, "idle-rss-MB")
		b.ReportMetric(rssMB(b, cmd.Process.Pid), "rss-MB")
	}
}

func rssMB(b *testing.B, pid int) float64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(b, err)
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			require.NoError(b, err)
			return kb / 1024
		}
	}
	b.Fatal("no VmRSS")
	return 0
}
