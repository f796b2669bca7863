package server_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fencer-dev/fencer/client"
	"github.com/fencer-dev/fencer/fencertest"
)

// BenchmarkAcquireWhileHolding measures whether one session's
// acquisitions through the service slow as it holds more leases: it
// acquires leases with 32 goroutines up to FENCER_HELD_MAX (default 50,000) and reports,
// at 1,000, 10,000, 50,000 and 100,000 held (each point up to the
// maximum), the wall time of the next 5,000 acquisitions divided by 5,000,
// and logs the time of every 1,000. A flat curve means an acquisition costs the same whatever the session
// holds.
func BenchmarkAcquireWhileHolding(b *testing.B) {
	most := 50000
	if v := os.Getenv("FENCER_HELD_MAX"); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(b, err)
		most = n
	}
	const block, workers = 1000, 32
	ctx := context.Background()
	for i := 0; i < b.N; i++ {
		st := fencertest.Store(b)
		addr, _ := startServer(b, st)
		s := newSession(b, client.New(dial(b, alice, addr)), client.WithTTL(60*time.Second))
		held := 0
		acquire := func(n int) time.Duration {
			var next atomic.Int64
			var wg sync.WaitGroup
			errs := make(chan error, workers)
			start := time.Now()
			for range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						j := int(next.Add(1)) - 1
						if j >= n {
							return
						}
						if _, err := s.Acquire(ctx, "l"+strconv.Itoa(held+j)); err != nil {
							errs <- err
							return
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			require.NoError(b, <-errs)
			held += n
			return time.Since(start)
		}
		// Every block is timed and logged; the points report the mean of
		// the five blocks from each, to smooth a shared machine's noise.
		var blocks []time.Duration
		for held < most+5*block {
			blocks = append(blocks, acquire(block))
		}
		for j, d := range blocks {
			b.Logf("held %6d: %4.0f us/acquire", j*block, float64(d.Microseconds())/block)
		}
		for _, at := range []int{1000, 10000, 50000, 100000} {
			if at > most {
				break
			}
			var sum time.Duration
			for _, d := range blocks[at/block : at/block+5] {
				sum += d
			}
			b.ReportMetric(float64(sum.Microseconds())/(5*block), fmt.Sprintf("us/acquire@%d", at))
		}
	}
	b.ReportMetric(0, "ns/op")
}
