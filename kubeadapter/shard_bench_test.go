package kubeadapter_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/fencer-dev/fencer/kubeadapter"
	"github.com/fencer-dev/fencer/token"
)

// benchShards is the shard count of the sharding benchmarks.
const benchShards = 10000

func shardNames(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("shard-%d", i)
	}
	return out
}

// benchMembers starts n members of a ring over shards with the default
// durations (renewal every 2s), and waits until every shard is owned.
func benchMembers(b *testing.B, k *kube, ring string, n int, shards []string) []*ringMember {
	b.Helper()
	var members []*ringMember
	for i := range n {
		cfg := kubeadapter.DefaultShardConfig(k.ns, ring, fmt.Sprintf("x-%d", i))
		cfg.MovesPerSecond = 2000
		members = append(members, k.startMemberWith(b, cfg, shards))
	}
	ok := waitFor(5*time.Minute, func() bool {
		total := 0.0
		for _, m := range members {
			total += m.metric(b, kubeadapter.MetricShardsOwned)
		}
		return total == float64(len(shards))
	})
	require.True(b, ok, "the ring never owned every shard")
	return members
}

// BenchmarkOwns: Owns with 16 concurrent readers over a member that owns
// 10,000 shards (on the real API server, its Sharder running), beside the
// same lookup in a map behind a sync.RWMutex, in the same run; the ratio
// is reported on the fencer sub-benchmark.
func BenchmarkOwns(b *testing.B) {
	k := newKube(b)
	shards := shardNames(benchShards)
	m := benchMembers(b, k, "owns", 1, shards)[0]
	locked := struct {
		sync.RWMutex
		m map[string]token.Token
	}{m: map[string]token.Token{}}
	for _, sh := range shards {
		tok, ok := m.s.Owns(sh)
		require.True(b, ok)
		locked.m[sh] = tok
	}
	readers := func(b *testing.B, owns func(string) bool) float64 {
		b.SetParallelism(max(1, 16/runtime.GOMAXPROCS(0)))
		b.ResetTimer()
		start := time.Now()
		b.RunParallel(func(pb *testing.PB) {
			r := rand.New(rand.NewPCG(rand.Uint64(), 1))
			for pb.Next() {
				if !owns(shards[r.IntN(len(shards))]) {
					panic("not owned")
				}
			}
		})
		return float64(time.Since(start).Nanoseconds()) / float64(b.N)
	}
	var rw float64
	b.Run("rwmutex-map", func(b *testing.B) {
		rw = readers(b, func(sh string) bool {
			locked.RLock()
			_, ok := locked.m[sh]
			locked.RUnlock()
			return ok
		})
	})
	b.Run("fencer", func(b *testing.B) {
		fencer := readers(b, func(sh string) bool { _, ok := m.s.Owns(sh); return ok })
		b.ReportMetric(rw/fencer, "rwmutex/fencer")
	})
}

// BenchmarkShardRenewals: the steady-state Lease writes of 10,000 shards
// on 3 members, counted by the API server (apiserver_request_total),
// for fencer (one heartbeat per member) and for the one-Lease-per-shard
// baseline of the peers (GET+PUT of each shard's Lease every period, by
// 64 renewers), at the same 2s period, in the same run.
func BenchmarkShardRenewals(b *testing.B) {
	const period = 2 * time.Second
	const window = 3 * period
	k := newKube(b)
	shards := shardNames(benchShards)
	var fencerRate float64
	b.Run("fencer", func(b *testing.B) {
		members := benchMembers(b, k, "renew", 3, shards)
		time.Sleep(period)
		b.ResetTimer()
		for b.Loop() {
			w0 := apiLeaseWrites(b, k)
			time.Sleep(window)
			fencerRate = (apiLeaseWrites(b, k) - w0) / window.Seconds()
		}
		b.ReportMetric(fencerRate, "lease-writes/s")
		for _, m := range members {
			m.stop()
		}
	})
	b.Run("per-shard", func(b *testing.B) {
		cs, err := kubernetes.NewForConfig(k.env.Admin())
		require.NoError(b, err)
		leases := cs.CoordinationV1().Leases(k.ns)
		ctx := context.Background()
		d := int32(2 * period / time.Second * 5)
		names := make(chan string, 256)
		var wg sync.WaitGroup
		for w := range 64 {
			wg.Go(func() {
				for i := w; i < benchShards; i += 64 {
					holder := "baseline"
					_, err := leases.Create(ctx, &coordinationv1.Lease{
						ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("base-%d", i)},
						Spec:       coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &d},
					}, metav1.CreateOptions{})
					require.NoError(b, err)
				}
			})
		}
		wg.Wait()
		runCtx, stop := context.WithCancel(ctx)
		for range 64 {
			wg.Go(func() {
				for name := range names {
					l, err := leases.Get(runCtx, name, metav1.GetOptions{})
					if err != nil {
						continue
					}
					now := metav1.NewMicroTime(time.Now())
					l.Spec.RenewTime = &now
					_, _ = leases.Update(runCtx, l, metav1.UpdateOptions{})
				}
			})
		}
		// Offer every shard's renewal once per period, as each shard's
		// own timer would; a full queue delays the offers.
		wg.Go(func() {
			defer close(names)
			tick := time.NewTicker(period / benchShards * 10)
			defer tick.Stop()
			for i := 0; ; i++ {
				select {
				case <-runCtx.Done():
					return
				case <-tick.C:
				}
				for j := range 10 {
					select {
					case names <- fmt.Sprintf("base-%d", (i*10+j)%benchShards):
					case <-runCtx.Done():
						return
					}
				}
			}
		})
		time.Sleep(period)
		b.ResetTimer()
		var achieved float64
		for b.Loop() {
			w0 := apiLeaseWrites(b, k)
			time.Sleep(window)
			achieved = (apiLeaseWrites(b, k) - w0) / window.Seconds()
		}
		stop()
		wg.Wait()
		b.ReportMetric(float64(benchShards)/period.Seconds(), "offered-writes/s")
		b.ReportMetric(achieved, "lease-writes/s")
		if fencerRate > 0 {
			b.ReportMetric(achieved/fencerRate, "baseline/fencer")
		}
	})
}

// BenchmarkShardRebalance: a ring of 3 members over 10,000 shards (2s
// renewals, 15s lease duration) gets a fourth member, loses it
// gracefully, then loses a member to a crash (its Lease client killed, no
// release). For each, it reports the shards moved, the shard-Lease writes
// the members counted, the API server's Lease writes beside renewals,
// and the time until every shard had its rendezvous owner again.
func BenchmarkShardRebalance(b *testing.B) {
	k := newKube(b)
	shards := shardNames(benchShards)
	members := benchMembers(b, k, "rebalance", 3, shards)
	owner := settled(b, members, shards)
	// measure runs change, which returns the members after it, and
	// reports what it cost until the ring settled.
	measure := func(b *testing.B, before []*ringMember, change func() []*ringMember) []*ringMember {
		b.Helper()
		prev := owner
		c0 := countWrites(b, k, before)
		moves0 := moves(b, before, kubeadapter.MoveHandoff) + moves(b, before, kubeadapter.MoveOrphan)
		start := time.Now()
		after := change()
		owner = settledWithin(b, 2*time.Minute, after, shards)
		converge := time.Since(start)
		time.Sleep(100 * time.Millisecond)
		// Members that left keep their counters; count every member seen.
		all := slices.Concat(before, after)
		slices.SortFunc(all, func(x, y *ringMember) int { return strings.Compare(x.name, y.name) })
		all = slices.CompactFunc(all, func(x, y *ringMember) bool { return x == y })
		c1 := countWrites(b, k, all)
		moved := 0
		for _, sh := range shards {
			if owner[sh] != prev[sh] {
				moved++
			}
		}
		written := moves(b, all, kubeadapter.MoveHandoff) + moves(b, all, kubeadapter.MoveOrphan) - moves0
		b.ReportMetric(float64(moved), "shards-moved")
		b.ReportMetric(written, "shard-lease-writes")
		b.ReportMetric((c1.api-c0.api)-(c1.renewHi-c0.renewLo), "api-writes-beside-renewals")
		b.ReportMetric(converge.Seconds(), "s-to-converge")
		return after
	}
	parent := b
	var x3 *ringMember
	b.Run("join", func(b *testing.B) {
		measure(b, members, func() []*ringMember {
			cfg := kubeadapter.DefaultShardConfig(k.ns, "rebalance", "x-3")
			cfg.MovesPerSecond = 2000
			x3 = k.startMemberWith(parent, cfg, shards)
			return append(slices.Clone(members), x3)
		})
	})
	b.Run("leave", func(b *testing.B) {
		if x3 == nil {
			b.Skip("leave follows join")
		}
		measure(b, append(slices.Clone(members), x3), func() []*ringMember {
			x3.stop()
			return members
		})
	})
	b.Run("crash", func(b *testing.B) {
		measure(b, members, func() []*ringMember {
			members[2].leases.killed.Store(true)
			return members[:2]
		})
	})
}
