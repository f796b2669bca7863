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
	return benchMembersEvery(b, k, ring, n, shards, 2*time.Second)
}

// benchMembersEvery is benchMembers with renewals every period (the
// lease duration and renew deadline scaled as client-go's 15s/10s/2s are
// at 2s, and 40s/30s at 10s).
func benchMembersEvery(b *testing.B, k *kube, ring string, n int, shards []string, period time.Duration) []*ringMember {
	b.Helper()
	var members []*ringMember
	for i := range n {
		cfg := kubeadapter.DefaultShardConfig(k.ns, ring, fmt.Sprintf("x-%d", i))
		if period != cfg.RetryPeriod {
			cfg.LeaseDuration, cfg.RenewDeadline, cfg.RetryPeriod = 4*period, 3*period, period
		}
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

// bracketed returns the Lease writes the API server accepted between two
// instants, window apart, and the time between them: each instant is the
// middle of a scrape of the API server's /metrics, so the count covers
// exactly the time returned, up to the scrapes' own durations (reported
// by the caller as the bracket's slack). Before each scrape it reads the
// members' own renewal counters, whose difference it also returns.
func bracketed(b *testing.B, k *kube, members []*ringMember, window time.Duration) (writes, renewed float64, elapsed, slack time.Duration) {
	b.Helper()
	scrape := func() (float64, float64, time.Time, time.Duration) {
		r := renewals(b, members)
		before := time.Now()
		w := apiLeaseWrites(b, k)
		took := time.Since(before)
		return w, r, before.Add(took / 2), took
	}
	w0, r0, t0, s0 := scrape()
	time.Sleep(window)
	w1, r1, t1, s1 := scrape()
	return w1 - w0, r1 - r0, t1.Sub(t0), s0/2 + s1/2
}

// BenchmarkShardRenewals: the steady-state Lease writes of 10,000 shards
// on 3 members, counted by the API server (apiserver_request_total)
// between two bracketed instants at least 30s and 5 renewal periods
// apart, for fencer (one
// heartbeat per member) and for the one-Lease-per-shard baseline of the
// peers (GET+PUT of each shard's Lease every period, by 64 renewers, each
// Lease lasting two periods as mcr's do), at the same period, in the same
// run: 2s (client-go's RetryPeriod) and 10s (mcr's). The per-shard
// sub-benchmark reports its offered and achieved rates, the shard Leases
// expired at the end of the window (renewTime plus duration before the
// list began), and the ratio of its achieved rate to fencer's.
func BenchmarkShardRenewals(b *testing.B) {
	for _, period := range []time.Duration{2 * time.Second, 10 * time.Second} {
		b.Run(fmt.Sprintf("period=%v", period), func(b *testing.B) { benchRenewals(b, period) })
	}
}

func benchRenewals(b *testing.B, period time.Duration) {
	// A member renews k or k±1 times in a window of k of its periods,
	// by phase: members/window is the count's resolution, reported as
	// phase-resolution-writes/s. A window of 30s or more keeps it
	// within 0.1/s.
	window := max(30*time.Second, 5*period)
	k := newKube(b)
	shards := shardNames(benchShards)
	var fencerRate float64
	b.Run("fencer", func(b *testing.B) {
		members := benchMembersEvery(b, k, "renew", 3, shards, period)
		time.Sleep(period)
		b.ResetTimer()
		var writes, renewed float64
		var elapsed, slack time.Duration
		for b.Loop() {
			writes, renewed, elapsed, slack = bracketed(b, k, members, window)
		}
		fencerRate = writes / elapsed.Seconds()
		b.ReportMetric(fencerRate, "lease-writes/s")
		b.ReportMetric(writes, "lease-writes")
		b.ReportMetric(renewed/elapsed.Seconds(), "member-counted-renewals/s")
		b.ReportMetric(elapsed.Seconds(), "window-s")
		b.ReportMetric(slack.Seconds()*1000, "bracket-slack-ms")
		b.ReportMetric(float64(len(members))/period.Seconds(), "bound-writes/s")
		b.ReportMetric(float64(len(members))/elapsed.Seconds(), "phase-resolution-writes/s")
		for _, m := range members {
			m.stop()
		}
	})
	b.Run("per-shard", func(b *testing.B) {
		cs, err := kubernetes.NewForConfig(k.env.Admin())
		require.NoError(b, err)
		leases := cs.CoordinationV1().Leases(k.ns)
		ctx := context.Background()
		duration := 2 * period
		d := int32(duration / time.Second)
		labels := map[string]string{"fencer.dev/bench": "per-shard"}
		names := make(chan string, 256)
		var wg sync.WaitGroup
		for w := range 64 {
			wg.Go(func() {
				for i := w; i < benchShards; i += 64 {
					holder := "baseline"
					now := metav1.NewMicroTime(time.Now())
					_, err := leases.Create(ctx, &coordinationv1.Lease{
						ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("base-%d", i), Labels: labels},
						Spec:       coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &d, AcquireTime: &now, RenewTime: &now},
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
		// Every Lease has had its renewal offered at least twice before
		// the window.
		time.Sleep(2 * duration)
		b.ResetTimer()
		var writes float64
		var elapsed, slack time.Duration
		for b.Loop() {
			writes, _, elapsed, slack = bracketed(b, k, nil, window)
		}
		listStart := time.Now()
		list, err := leases.List(ctx, metav1.ListOptions{LabelSelector: "fencer.dev/bench=per-shard"})
		require.NoError(b, err)
		stop()
		wg.Wait()
		expired := 0
		for _, l := range list.Items {
			if l.Spec.RenewTime == nil || l.Spec.RenewTime.Add(duration).Before(listStart) {
				expired++
			}
		}
		achieved := writes / elapsed.Seconds()
		b.ReportMetric(float64(benchShards)/period.Seconds(), "offered-writes/s")
		b.ReportMetric(achieved, "lease-writes/s")
		b.ReportMetric(elapsed.Seconds(), "window-s")
		b.ReportMetric(slack.Seconds()*1000, "bracket-slack-ms")
		b.ReportMetric(float64(expired), "expired-leases")
		if fencerRate > 0 {
			b.ReportMetric(achieved/fencerRate, "baseline/fencer")
			b.ReportMetric(float64(benchShards)/period.Seconds()/fencerRate, "offered/fencer")
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
