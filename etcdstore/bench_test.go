package etcdstore_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/fencer-dev/fencer/etcdstore"
	"github.com/fencer-dev/fencer/fencertest"
	"github.com/fencer-dev/fencer/token"
)

// timeRounds runs each variant n times, interleaved in rounds of 50 so that
// drift on a shared machine hits every variant alike, and returns each
// variant's total time.
func timeRounds(b *testing.B, n int, variants ...func(i int) error) []time.Duration {
	b.Helper()
	wall, _ := timeCPURounds(b, n, variants...)
	return wall
}

// timeCPURounds is timeRounds that also returns each variant's total
// process CPU time (etcd's and the clients').
func timeCPURounds(b *testing.B, n int, variants ...func(i int) error) (wall, cpu []time.Duration) {
	b.Helper()
	wall, cpu = make([]time.Duration, len(variants)), make([]time.Duration, len(variants))
	const round = 50
	for done := 0; done < n; done += round {
		for v, f := range variants {
			cpu0, start := cpuTime(b), time.Now()
			for i := done; i < min(done+round, n); i++ {
				if err := f(i); err != nil {
					b.Fatal(err)
				}
			}
			wall[v] += time.Since(start)
			cpu[v] += cpuTime(b) - cpu0
		}
	}
	return wall, cpu
}

// mutexSession returns an etcd concurrency.Session on st's client, closed
// when b ends.
func mutexSession(b *testing.B, st *etcdstore.Store) *concurrency.Session {
	b.Helper()
	es, err := concurrency.NewSession(st.Client(), concurrency.WithTTL(10))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { es.Close() })
	return es
}

// benchLease returns a store on the shared etcd member and the token of
// its lease "bench", held by a session that ends with b.
func benchLease(b *testing.B) (*etcdstore.Store, token.Token) {
	b.Helper()
	st := fencertest.SharedStore(b)
	l, err := newSession(b, st).Acquire(context.Background(), "bench")
	if err != nil {
		b.Fatal(err)
	}
	return st, l.Token()
}

// BenchmarkGuardedPut compares Store.Put (an exact token, the key's owner)
// with the hand-written guarded etcd Txn of the P1 target,
// If(CreateRevision(holder) = rev).Then(OpPut), and with a plain,
// unguarded Put, on the same embedded etcd and client. Two more hand-written Txns take fencer's Put apart: the exact
// guard alone (the holder key's create revision and the epoch key's value,
// which Check, Release and Advance use), and the holder key's create
// revision with the key's owner record, the Txn fencer sends for a key
// whose owner record is the token's own (exact, since the record was
// written under the token's full guard). Throughput ratios above 1 mean
// faster than the baseline; ratio-vs-rawtxn is the P1 figure.
func BenchmarkGuardedPut(b *testing.B) {
	ctx := context.Background()
	st, tok := benchLease(b)
	key := st.DataKey("k")
	holderKey, epochKey, ownerKey := st.Prefix()+"leases/bench", st.Prefix()+"epochs/bench", st.OwnerKey("k")
	val := []byte("value")
	if _, err := st.Put(ctx, tok, "k", val); err != nil { // claim k, as every Put after the first finds it
		b.Fatal(err)
	}
	cli := st.Client()
	guarded := clientv3.Compare(clientv3.CreateRevision(holderKey), "=", tok.Revision)
	exact := []clientv3.Cmp{guarded, clientv3.Compare(clientv3.Value(epochKey), "=", strconv.FormatUint(tok.Epoch, 10))}
	owned := []clientv3.Cmp{guarded, clientv3.Compare(clientv3.Value(ownerKey), "=", "bench "+tok.String())}
	committed := func(r *clientv3.TxnResponse, err error) error {
		if err == nil && !r.Succeeded {
			err = fmt.Errorf("hand-written guarded txn failed")
		}
		return err
	}
	b.ResetTimer()
	t, cpu := timeCPURounds(b, b.N,
		func(int) error { _, err := st.Put(ctx, tok, "k", val); return err },
		func(int) error {
			return committed(cli.Txn(ctx).If(guarded).Then(clientv3.OpPut(key, string(val))).Commit())
		},
		func(int) error { _, err := cli.Put(ctx, key, string(val)); return err },
		func(int) error {
			return committed(cli.Txn(ctx).If(exact...).Then(clientv3.OpPut(key, string(val))).Commit())
		},
		func(int) error {
			return committed(cli.Txn(ctx).If(owned...).Then(clientv3.OpPut(key, string(val))).Commit())
		},
	)
	b.StopTimer()
	perPut := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / float64(b.N) }
	b.ReportMetric(perPut(t[0]), "fencer-ns/put")
	b.ReportMetric(perPut(t[1]), "rawtxn-ns/put")
	b.ReportMetric(perPut(t[2]), "plain-ns/put")
	b.ReportMetric(perPut(t[3]), "exact-rawtxn-ns/put")
	b.ReportMetric(perPut(t[4]), "owned-rawtxn-ns/put")
	b.ReportMetric(t[1].Seconds()/t[0].Seconds(), "ratio-vs-rawtxn")
	b.ReportMetric(t[2].Seconds()/t[0].Seconds(), "ratio-vs-plainput")
	b.ReportMetric(t[1].Seconds()/t[3].Seconds(), "exact-rawtxn-ratio-vs-rawtxn")
	b.ReportMetric(t[1].Seconds()/t[4].Seconds(), "owned-rawtxn-ratio-vs-rawtxn")
	// CPU per put (etcd runs in the process) varies less than wall time on
	// a machine shared with other work.
	if cpu[0] > 0 {
		b.ReportMetric(float64(cpu[0].Microseconds())/float64(b.N), "fencer-cpu-us/put")
		b.ReportMetric(float64(cpu[1].Microseconds())/float64(b.N), "rawtxn-cpu-us/put")
		b.ReportMetric(float64(cpu[4].Microseconds())/float64(b.N), "owned-rawtxn-cpu-us/put")
		b.ReportMetric(cpu[1].Seconds()/cpu[0].Seconds(), "cpu-ratio-vs-rawtxn")
	}
	b.ReportMetric(0, "ns/op")
}

// BenchmarkGuardedPutFreshKey measures the first guarded Put of a key,
// which also records the key's owner: Store.Put of a fresh key each time,
// beside two hand-written Txns under the same exact guard that each claim a
// fresh key: the chain Store.Put sends (three nested compares, each alone
// proving the owner foreign, with the write in the innermost branch once),
// and the earlier two-branch shape (the lease's own records, then no
// record, with the write in both branches, so a value is sent twice).
// chain-ratio-vs-twobranch above 1 means the chain is faster.
func BenchmarkGuardedPutFreshKey(b *testing.B) {
	ctx := context.Background()
	st, tok := benchLease(b)
	cli, val := st.Client(), "value"
	guard := []clientv3.Cmp{
		clientv3.Compare(clientv3.CreateRevision(st.Prefix()+"leases/bench"), "=", tok.Revision),
		clientv3.Compare(clientv3.Value(st.Prefix()+"epochs/bench"), "=", strconv.FormatUint(tok.Epoch, 10)),
	}
	claim := func(key string) []clientv3.Op {
		return []clientv3.Op{clientv3.OpPut(st.OwnerKey(key), "bench "+tok.String()), clientv3.OpPut(st.DataKey(key), val)}
	}
	chain := func(key string) clientv3.Op {
		owner, branch := st.OwnerKey(key), claim(key)
		for _, foreign := range []clientv3.Cmp{
			clientv3.Compare(clientv3.Value(owner), "=", "bench!"),
			clientv3.Compare(clientv3.Value(owner), ">", "bench!"),
			clientv3.Compare(clientv3.Value(owner), "<", "bench \x00"),
		} {
			branch = []clientv3.Op{clientv3.OpTxn([]clientv3.Cmp{foreign}, []clientv3.Op{clientv3.OpGet(owner)}, branch)}
		}
		return branch[0]
	}
	twoBranch := func(key string) clientv3.Op {
		owner, c := st.OwnerKey(key), claim(key)
		mine := []clientv3.Cmp{clientv3.Compare(clientv3.Value(owner), ">", "bench "), clientv3.Compare(clientv3.Value(owner), "<", "bench!")}
		free := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(owner), "=", 0)}
		return clientv3.OpTxn(mine, c, []clientv3.Op{clientv3.OpTxn(free, c, []clientv3.Op{clientv3.OpGet(owner)})})
	}
	raw := func(shape func(string) clientv3.Op, name string) func(int) error {
		return func(i int) error {
			r, err := cli.Txn(ctx).If(guard...).Then(shape(fmt.Sprintf("%s-%d", name, i))).Commit()
			if err == nil && !r.Succeeded {
				err = fmt.Errorf("hand-written %s txn failed its guard", name)
			}
			return err
		}
	}
	b.ResetTimer()
	t, _ := timeCPURounds(b, b.N,
		func(i int) error { _, err := st.Put(ctx, tok, fmt.Sprintf("fencer-%d", i), []byte(val)); return err },
		raw(chain, "chain"),
		raw(twoBranch, "twobranch"),
	)
	b.StopTimer()
	perPut := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / float64(b.N) }
	b.ReportMetric(perPut(t[0]), "fencer-ns/put")
	b.ReportMetric(perPut(t[1]), "chain-rawtxn-ns/put")
	b.ReportMetric(perPut(t[2]), "twobranch-rawtxn-ns/put")
	b.ReportMetric(t[2].Seconds()/t[1].Seconds(), "chain-ratio-vs-twobranch")
	b.ReportMetric(t[2].Seconds()/t[0].Seconds(), "fencer-ratio-vs-twobranch")
	b.ReportMetric(0, "ns/op")
}

// BenchmarkAcquireRelease compares Acquire+Release cycles with etcd's
// concurrency.Mutex Lock+Unlock on a session of the same etcd, with 1
// goroutine and with 64, each cycling a lease (and a Mutex) of its own. The
// store batches concurrent writes, as it does by default (DefaultBatch); a
// lone goroutine's writes are never batched.
func BenchmarkAcquireRelease(b *testing.B) {
	for _, conc := range []int{1, 64} {
		b.Run(fmt.Sprintf("goroutines=%d", conc), func(b *testing.B) {
			ctx := context.Background()
			st := fencertest.SharedStore(b)
			s := newSession(b, st)
			es := mutexSession(b, st)
			mus := make([]*concurrency.Mutex, conc)
			for g := range mus {
				mus[g] = concurrency.NewMutex(es, st.Prefix()+"mutex/bench"+strconv.Itoa(g))
			}
			b.ResetTimer()
			t := timeRoundsConcurrent(b, conc, b.N,
				func(g int) error {
					l, err := s.Acquire(ctx, "bench"+strconv.Itoa(g))
					if err != nil {
						return err
					}
					return l.Release(ctx)
				},
				func(g int) error {
					if err := mus[g].Lock(ctx); err != nil {
						return err
					}
					return mus[g].Unlock(ctx)
				},
			)
			b.StopTimer()
			b.ReportMetric(float64(b.N)/t[0].Seconds(), "fencer-cycles/s")
			b.ReportMetric(float64(b.N)/t[1].Seconds(), "mutex-cycles/s")
			b.ReportMetric(t[1].Seconds()/t[0].Seconds(), "ratio-vs-mutex")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// timeRoundsConcurrent runs n calls of each variant on conc goroutines,
// interleaved in rounds of 50 calls per goroutine, and returns each
// variant's total time. Goroutine g passes g to every call it makes.
func timeRoundsConcurrent(b *testing.B, conc, n int, variants ...func(g int) error) []time.Duration {
	b.Helper()
	totals := make([]time.Duration, len(variants))
	round := 50 * conc
	for done := 0; done < n; done += round {
		calls := min(round, n-done)
		for v, f := range variants {
			var next atomic.Int64
			var wg sync.WaitGroup
			start := time.Now()
			for g := 0; g < conc; g++ {
				wg.Go(func() {
					for next.Add(1) <= int64(calls) {
						if err := f(g); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			totals[v] += time.Since(start)
		}
	}
	return totals
}

// BenchmarkLossDetection measures the time from an external delete of the
// holder key returning to the holder's Done closing.
func BenchmarkLossDetection(b *testing.B) {
	ctx := context.Background()
	st := fencertest.SharedStore(b)
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

// BenchmarkAcquireReleaseCost takes a one-goroutine Acquire+Release cycle
// apart, beside Mutex Lock+Unlock, with raw etcd calls on the same client
// and session lease:
//
//   - mutex: concurrency.Mutex Lock+Unlock;
//   - raw-mutex-shape: a Txn creating a leased key, then a plain Delete;
//   - raw-protocol: the Txns of the protocol, on keys no watch sees: the
//     holder key and the epoch bump in one Txn, then a guarded delete;
//   - raw-protocol-watched: the same on a holder key under the prefix the
//     session watches, as fencer's are;
//   - fencer: Session.Acquire and Lease.Release.
//
// Each is reported in µs per cycle, and each raw variant as a ratio to
// mutex.
func BenchmarkAcquireReleaseCost(b *testing.B) {
	ctx := context.Background()
	st := fencertest.SharedStore(b)
	s := newSession(b, st)
	mu := concurrency.NewMutex(mutexSession(b, st), st.Prefix()+"mutex/bench")
	cli := st.Client()
	create := func(key string, extra ...clientv3.Op) (int64, error) {
		r, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
			Then(append([]clientv3.Op{clientv3.OpPut(key, "holder", clientv3.WithLease(s.LeaseID()))}, extra...)...).Commit()
		if err == nil && !r.Succeeded {
			err = fmt.Errorf("%s is held", key)
		}
		return r.Header.Revision, err
	}
	protocol := func(hk, ek string) func(int) error {
		return func(i int) error {
			rev, err := create(hk, clientv3.OpPut(ek, strconv.Itoa(i)))
			if err != nil {
				return err
			}
			r, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(hk), "=", rev)).Then(clientv3.OpDelete(hk)).Commit()
			if err == nil && !r.Succeeded {
				err = fmt.Errorf("guarded delete of %s failed", hk)
			}
			return err
		}
	}
	names := []string{"mutex", "raw-mutex-shape", "raw-protocol", "raw-protocol-watched", "fencer"}
	b.ResetTimer()
	t := timeRounds(b, b.N,
		func(int) error {
			if err := mu.Lock(ctx); err != nil {
				return err
			}
			return mu.Unlock(ctx)
		},
		func(int) error {
			if _, err := create(st.Prefix() + "unwatched/shape"); err != nil {
				return err
			}
			_, err := cli.Delete(ctx, st.Prefix()+"unwatched/shape")
			return err
		},
		protocol(st.Prefix()+"unwatched/protocol", st.Prefix()+"epochs/protocol"),
		protocol(st.Prefix()+"leases/protocol", st.Prefix()+"epochs/protocol-watched"),
		func(int) error {
			l, err := s.Acquire(ctx, "bench")
			if err != nil {
				return err
			}
			return l.Release(ctx)
		},
	)
	b.StopTimer()
	for i, name := range names {
		b.ReportMetric(float64(t[i].Microseconds())/float64(b.N), name+"-us/cycle")
		if i > 0 {
			b.ReportMetric(t[0].Seconds()/t[i].Seconds(), name+"-ratio")
		}
	}
	b.ReportMetric(0, "ns/op")
}
