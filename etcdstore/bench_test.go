package etcdstore_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/fencer-dev/fencer/internal/etcdtest"
)

// timeRounds runs each variant n times, interleaved in rounds of 50 so that
// drift on a shared machine hits every variant alike, and returns each
// variant's total time.
func timeRounds(b *testing.B, n int, variants ...func(i int) error) []time.Duration {
	b.Helper()
	totals := make([]time.Duration, len(variants))
	const round = 50
	for done := 0; done < n; done += round {
		for v, f := range variants {
			start := time.Now()
			for i := done; i < min(done+round, n); i++ {
				if err := f(i); err != nil {
					b.Fatal(err)
				}
			}
			totals[v] += time.Since(start)
		}
	}
	return totals
}

// BenchmarkGuardedPut compares Store.Put with a hand-written guarded etcd
// Txn (the physical limit) and with a plain, unguarded Put, on the same
// embedded etcd and client. Throughput ratios above 1 mean faster than the
// baseline.
func BenchmarkGuardedPut(b *testing.B) {
	ctx := context.Background()
	st := etcdtest.Store(b)
	s := newSession(b, st)
	l, err := s.Acquire(ctx, "bench")
	if err != nil {
		b.Fatal(err)
	}
	tok, key := l.Token(), st.DataKey("k")
	holderKey := st.Prefix() + "leases/bench"
	val := []byte("value")
	b.ResetTimer()
	t := timeRounds(b, b.N,
		func(int) error { _, err := st.Put(ctx, tok, "k", val); return err },
		func(int) error {
			r, err := st.Client().Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(holderKey), "=", tok.Revision)).
				Then(clientv3.OpPut(key, string(val))).Commit()
			if err == nil && !r.Succeeded {
				err = fmt.Errorf("raw guarded txn failed")
			}
			return err
		},
		func(int) error { _, err := st.Client().Put(ctx, key, string(val)); return err },
	)
	b.StopTimer()
	b.ReportMetric(float64(t[0].Nanoseconds())/float64(b.N), "fencer-ns/put")
	b.ReportMetric(float64(t[1].Nanoseconds())/float64(b.N), "rawtxn-ns/put")
	b.ReportMetric(float64(t[2].Nanoseconds())/float64(b.N), "plain-ns/put")
	b.ReportMetric(t[1].Seconds()/t[0].Seconds(), "ratio-vs-rawtxn")
	b.ReportMetric(t[2].Seconds()/t[0].Seconds(), "ratio-vs-plainput")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkAcquireRelease compares an Acquire+Release cycle with etcd's
// concurrency.Mutex Lock+Unlock on a session of the same etcd.
func BenchmarkAcquireRelease(b *testing.B) {
	ctx := context.Background()
	st := etcdtest.Store(b)
	s := newSession(b, st)
	es, err := concurrency.NewSession(st.Client(), concurrency.WithTTL(10))
	if err != nil {
		b.Fatal(err)
	}
	defer es.Close()
	mu := concurrency.NewMutex(es, st.Prefix()+"mutex/bench")
	b.ResetTimer()
	t := timeRounds(b, b.N,
		func(int) error {
			l, err := s.Acquire(ctx, "bench")
			if err != nil {
				return err
			}
			return l.Release(ctx)
		},
		func(int) error {
			if err := mu.Lock(ctx); err != nil {
				return err
			}
			return mu.Unlock(ctx)
		},
	)
	b.StopTimer()
	b.ReportMetric(float64(t[0].Nanoseconds())/float64(b.N), "fencer-ns/cycle")
	b.ReportMetric(float64(t[1].Nanoseconds())/float64(b.N), "mutex-ns/cycle")
	b.ReportMetric(t[1].Seconds()/t[0].Seconds(), "ratio-vs-mutex")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkLossDetection measures the time from an external delete of the
// holder key returning to the holder's Done closing.
func BenchmarkLossDetection(b *testing.B) {
	ctx := context.Background()
	st := etcdtest.Store(b)
	s := newSession(b, st)
	n := max(b.N, 200)
	lat := make([]time.Duration, 0, n)
	b.ResetTimer()
	for i := 0; i < n; i++ {
		l, err := s.Acquire(ctx, "bench")
		if err != nil {
			b.Fatal(err)
		}
		if _, err := st.Client().Delete(ctx, st.Prefix()+"leases/bench"); err != nil {
			b.Fatal(err)
		}
		returned := time.Now()
		select {
		case <-l.Done():
			lat = append(lat, time.Since(returned))
		case <-time.After(5 * time.Second):
			b.Fatal("Done did not close")
		}
	}
	b.StopTimer()
	slices.Sort(lat)
	q := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))].Nanoseconds()) / 1e6 }
	b.ReportMetric(q(0.5), "p50-ms")
	b.ReportMetric(q(0.99), "p99-ms")
	b.ReportMetric(float64(lat[len(lat)-1].Nanoseconds())/1e6, "max-ms")
	b.ReportMetric(0, "ns/op")
}
