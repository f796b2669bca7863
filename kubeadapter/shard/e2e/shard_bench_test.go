package e2e_test

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
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"github.com/fencer-dev/fencer/internal/rendezvous"
	"github.com/fencer-dev/fencer/kubeadapter/shard"
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
		cfg := shard.DefaultConfig(k.ns, ring, fmt.Sprintf("x-%d", i))
		if period != cfg.RetryPeriod {
			cfg.LeaseDuration, cfg.RenewDeadline, cfg.RetryPeriod = 4*period, 3*period, period
		}
		cfg.MovesPerSecond = 2000
		members = append(members, k.startMemberWith(b, cfg, shards))
	}
	ok := waitFor(5*time.Minute, func() bool {
		total := 0.0
		for _, m := range members {
			total += m.metric(b, shard.MetricOwned)
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

// bracket is what bracketed counted between its two instants.
type bracket struct {
	// writes are the Lease writes the API server accepted, in every
	// namespace (apiserver_request_total); ring are the Lease events of
	// the benchmark's namespace seen on a watch, so writes-ring are the
	// API server's own (its identity Lease, renewed every 10s).
	writes, ring float64
	// renewed are the members' own renewal counts.
	renewed float64
	// elapsed is the time between the two instants, each the middle of
	// a scrape of /metrics; slack is half the two scrapes' durations.
	elapsed, slack time.Duration
}

func (c bracket) rate(n float64) float64 { return n / c.elapsed.Seconds() }

// bracketed counts the Lease writes between two instants window apart:
// the API server's own count, the events of k.ns on a watch that arrived
// between the instants, and the members' renewal counters, read just
// before each scrape.
func bracketed(b *testing.B, k *kube, members []*ringMember, window time.Duration) bracket {
	b.Helper()
	ctx := context.Background()
	leases := k.cs.CoordinationV1().Leases(k.ns)
	list, err := leases.List(ctx, metav1.ListOptions{Limit: 1})
	require.NoError(b, err)
	w, err := leases.Watch(ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion})
	require.NoError(b, err)
	var mu sync.Mutex
	var arrivals []time.Time
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for ev := range w.ResultChan() {
			if ev.Type == watch.Added || ev.Type == watch.Modified || ev.Type == watch.Deleted {
				mu.Lock()
				arrivals = append(arrivals, time.Now())
				mu.Unlock()
			}
		}
	}()
	scrape := func() (float64, float64, time.Time, time.Duration) {
		r := renewals(b, members)
		before := time.Now()
		n := apiLeaseWrites(b, k)
		took := time.Since(before)
		return n, r, before.Add(took / 2), took
	}
	w0, r0, t0, s0 := scrape()
	time.Sleep(window)
	w1, r1, t1, s1 := scrape()
	w.Stop()
	<-watched
	c := bracket{writes: w1 - w0, renewed: r1 - r0, elapsed: t1.Sub(t0), slack: s0/2 + s1/2}
	for _, at := range arrivals {
		if !at.Before(t0) && at.Before(t1) {
			c.ring++
		}
	}
	return c
}

// BenchmarkShardRenewals: the steady-state Lease writes of 10,000 shards
// on 3 members, counted between two bracketed instants at least 30s and
// 5 renewal periods apart by the API server (apiserver_request_total,
// every namespace) and as the events of the ring's namespace on a watch
// (the API server's own identity Lease is in kube-system), for fencer (one
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
		var c bracket
		for b.Loop() {
			c = bracketed(b, k, members, window)
		}
		fencerRate = c.rate(c.ring)
		reportBracket(b, c)
		b.ReportMetric(c.rate(c.renewed), "member-counted-renewals/s")
		b.ReportMetric(float64(len(members))/period.Seconds(), "bound-writes/s")
		b.ReportMetric(float64(len(members))/c.elapsed.Seconds(), "phase-resolution-writes/s")
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
		var c bracket
		for b.Loop() {
			c = bracketed(b, k, nil, window)
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
		achieved := c.rate(c.ring)
		reportBracket(b, c)
		b.ReportMetric(float64(benchShards)/period.Seconds(), "offered-writes/s")
		b.ReportMetric(float64(expired), "expired-leases")
		if fencerRate > 0 {
			b.ReportMetric(achieved/fencerRate, "baseline/fencer")
			b.ReportMetric(float64(benchShards)/period.Seconds()/fencerRate, "offered/fencer")
		}
	})
}

// reportBracket reports the writes of c: lease-writes/s are those of the
// ring's namespace, apiserver-all-lease-writes/s the API server's count
// over every namespace, which adds its own identity Lease.
func reportBracket(b *testing.B, c bracket) {
	b.ReportMetric(c.rate(c.ring), "lease-writes/s")
	b.ReportMetric(c.ring, "lease-writes")
	b.ReportMetric(c.rate(c.writes), "apiserver-all-lease-writes/s")
	b.ReportMetric(c.elapsed.Seconds(), "window-s")
	b.ReportMetric(c.slack.Seconds()*1000, "bracket-slack-ms")
}

// handover times the moves of a rebalance: for each shard whose
// rendezvous owner changes, the instant the old owner's shard.Held ended
// and the instant the new owner was first seen owning it (its Owns,
// polled every millisecond). A sample in which the new owner owns a
// shard whose old shard.Held has not ended is an overlap.
type handover struct {
	mu       sync.Mutex
	ended    map[string]time.Time
	started  map[string]time.Time
	old      map[string]*shard.Held
	overlaps int
	stop     chan struct{}
	done     chan struct{}
}

// watchHandover arms a handover for the shards whose owner in prev is not
// their rendezvous owner among afterNames; members are the members now.
func watchHandover(b *testing.B, members []*ringMember, prev map[string]string, afterNames []string) *handover {
	b.Helper()
	ms := make([]rendezvous.Member, len(afterNames))
	for i, n := range afterNames {
		ms[i] = rendezvous.Member{Name: n, Weight: 1}
	}
	byName := map[string]*ringMember{}
	for _, m := range members {
		byName[m.name] = m
	}
	h := &handover{ended: map[string]time.Time{}, started: map[string]time.Time{}, old: map[string]*shard.Held{}}
	for sh, o := range prev {
		if want, _ := rendezvous.Owner(sh, ms); want == o {
			continue
		}
		held, err := byName[o].s.Shard(sh)
		require.NoError(b, err)
		h.old[sh] = held
		context.AfterFunc(held.Context(), func() {
			at := time.Now()
			h.mu.Lock()
			h.ended[sh] = at
			h.mu.Unlock()
		})
	}
	return h
}

// sample polls the new owners, named by rendezvous among after, until
// stopped.
func (h *handover) sample(after []*ringMember) {
	ms := make([]rendezvous.Member, len(after))
	byName := map[string]*ringMember{}
	for i, m := range after {
		ms[i] = rendezvous.Member{Name: m.name, Weight: 1}
		byName[m.name] = m
	}
	to := map[string]*ringMember{}
	for sh := range h.old {
		want, _ := rendezvous.Owner(sh, ms)
		to[sh] = byName[want]
	}
	h.stop, h.done = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(h.done)
		for len(to) > 0 {
			select {
			case <-h.stop:
				return
			case <-time.After(time.Millisecond):
			}
			for sh, m := range to {
				if _, ok := m.s.Owns(sh); !ok {
					continue
				}
				at := time.Now()
				h.mu.Lock()
				if h.old[sh].Err() == nil {
					h.overlaps++
				}
				h.started[sh] = at
				h.mu.Unlock()
				delete(to, sh)
			}
		}
	}()
}

// report stops the sampler and reports the gaps' p50, p99 and max in ms,
// the overlaps, and the moves it saw both ends of.
func (h *handover) report(b *testing.B) {
	close(h.stop)
	<-h.done
	h.mu.Lock()
	defer h.mu.Unlock()
	var gaps []time.Duration
	for sh, st := range h.started {
		if end, ok := h.ended[sh]; ok {
			gaps = append(gaps, st.Sub(end))
		}
	}
	b.ReportMetric(float64(len(gaps)), "moves-timed")
	b.ReportMetric(float64(h.overlaps), "overlaps")
	if h.overlaps > 0 {
		b.Errorf("%d shards were owned by the new owner while the old shard.Held had not ended", h.overlaps)
	}
	if len(gaps) == 0 {
		return
	}
	slices.Sort(gaps)
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(ms(gaps[len(gaps)/2]), "gap-p50-ms")
	b.ReportMetric(ms(gaps[len(gaps)*99/100]), "gap-p99-ms")
	b.ReportMetric(ms(gaps[len(gaps)-1]), "gap-max-ms")
	if gaps[0] < 0 {
		b.Errorf("a new owner started %v before the old shard.Held ended", -gaps[0])
	}
}

// names returns the members' names.
func names(members []*ringMember) []string {
	out := make([]string, len(members))
	for i, m := range members {
		out[i] = m.name
	}
	return out
}

// BenchmarkShardRebalance: a ring of 3 members over 10,000 shards (2s
// renewals, 15s lease duration) gets a fourth member, loses it
// gracefully, then loses a member to a crash (its Lease client killed, no
// release). For each, it reports the shards moved, the shard-Lease writes
// the members counted, the API server's Lease writes beside renewals,
// the time until every shard had its rendezvous owner again, and the
// handover gap of each move (see handover).
func BenchmarkShardRebalance(b *testing.B) {
	k := newKube(b)
	shards := shardNames(benchShards)
	members := benchMembers(b, k, "rebalance", 3, shards)
	owner := settled(b, members, shards)
	// measure runs change, which returns the members after it, and
	// reports what it cost until the ring settled.
	measure := func(b *testing.B, before []*ringMember, afterNames []string, change func() []*ringMember) []*ringMember {
		b.Helper()
		prev := owner
		c0 := countWrites(b, k, before)
		moves0 := moves(b, before, shard.MoveHandoff) + moves(b, before, shard.MoveOrphan)
		gap := watchHandover(b, before, prev, afterNames)
		start := time.Now()
		after := change()
		gap.sample(after)
		owner = settledWithin(b, 2*time.Minute, after, shards)
		converge := time.Since(start)
		gap.report(b)
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
		written := moves(b, all, shard.MoveHandoff) + moves(b, all, shard.MoveOrphan) - moves0
		b.ReportMetric(float64(moved), "shards-moved")
		b.ReportMetric(written, "shard-lease-writes")
		b.ReportMetric((c1.api-c0.api)-(c1.renewHi-c0.renewLo), "api-writes-beside-renewals")
		b.ReportMetric(converge.Seconds(), "s-to-converge")
		return after
	}
	parent := b
	var x3 *ringMember
	b.Run("join", func(b *testing.B) {
		measure(b, members, append(names(members), "x-3"), func() []*ringMember {
			cfg := shard.DefaultConfig(k.ns, "rebalance", "x-3")
			cfg.MovesPerSecond = 2000
			x3 = k.startMemberWith(parent, cfg, shards)
			return append(slices.Clone(members), x3)
		})
	})
	b.Run("leave", func(b *testing.B) {
		if x3 == nil {
			b.Skip("leave follows join")
		}
		measure(b, append(slices.Clone(members), x3), names(members), func() []*ringMember {
			x3.stop()
			return members
		})
	})
	b.Run("crash", func(b *testing.B) {
		measure(b, members, names(members[:2]), func() []*ringMember {
			members[2].leases.Killed.Store(true)
			return members[:2]
		})
	})
}
