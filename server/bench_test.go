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

	"github.com/fencer-dev/fencer/client"
)

// BenchmarkServiceGuardedPut compares a guarded Put through the gRPC
// service with the same guarded etcd Txn made directly (etcdstore.Put), at
// 1 and 64 concurrent clients, in the same run. ratio is the service's
// throughput over the direct throughput.
func BenchmarkServiceGuardedPut(b *testing.B) {
	for _, conc := range []int{1, 64} {
		b.Run(fmt.Sprintf("clients=%d", conc), func(b *testing.B) {
			ctx := context.Background()
			st := newStore(b)
			addr, _ := startServer(b, st)
			c := client.New(dial(b, alice, addr))
			l, err := newSession(b, c).Acquire(ctx, "bench")
			require.NoError(b, err)
			tok := l.Token()
			value := []byte("some value of a typical size, say sixty-four bytes long........")
			run := func(put func(key string) error) time.Duration {
				var next atomic.Int64
				var wg sync.WaitGroup
				start := time.Now()
				for w := 0; w < conc; w++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for i := next.Add(1); i <= int64(b.N); i = next.Add(1) {
							if err := put("k" + strconv.Itoa(int(i%1024))); err != nil {
								b.Error(err)
								return
							}
						}
					}()
				}
				wg.Wait()
				return time.Since(start)
			}
			b.ResetTimer()
			direct := run(func(key string) error { _, err := st.Put(ctx, tok, key, value); return err })
			service := run(func(key string) error { _, err := c.Put(ctx, tok, key, value); return err })
			b.StopTimer()
			b.ReportMetric(float64(b.N)/direct.Seconds(), "direct-puts/s")
			b.ReportMetric(float64(b.N)/service.Seconds(), "grpc-puts/s")
			b.ReportMetric(direct.Seconds()/service.Seconds(), "ratio")
		})
	}
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
		st := newStore(b)
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(b, err)
		addr := lis.Addr().String()
		lis.Close()
		cmd := exec.Command(bin, "serve", "--etcd-endpoints", shared.Endpoint(), "--prefix", st.Prefix(), "--listen", addr, "--metrics-listen", "")
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
