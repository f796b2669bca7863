package mcr_test

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/cluster"
	"sigs.k8s.io/multicluster-runtime/pkg/manager/coordinator/sharded"
	"sigs.k8s.io/multicluster-runtime/pkg/manager/coordinator/sharded/peers"
	"sigs.k8s.io/multicluster-runtime/pkg/multicluster"

	"github.com/fencer-dev/fencer/kubeadapter"
	"github.com/fencer-dev/fencer/kubeadapter/kubefencertest"
	"github.com/fencer-dev/fencer/kubeadapter/shard"
	"github.com/fencer-dev/fencer/mcr"
)

// benchClusters are the cluster counts of BenchmarkCoordinatorLeaseWrites;
// make bench (scripts/bench.sh) adds 10,000.
var benchClusters = flag.String("mcr-clusters", "1000", "comma-separated cluster counts of BenchmarkCoordinatorLeaseWrites")

// benchPeriod is both coordinators' renew period: fencer's RetryPeriod
// (heartbeats) and mcr's LeaseRenew (one Lease per cluster).
const benchPeriod = 2 * time.Second

// benchReplicas is the number of replicas of each coordinator.
const benchReplicas = 3

// stubCluster is the cluster the benchmark engages: the coordinators
// only pass it to the aware runnables, which do not use it.
type stubCluster struct{ cluster.Cluster }

// coordRun is one coordinator's replicas over n clusters.
type coordRun struct {
	engaged []*engagements
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	// started is when the first replica started.
	started time.Time

	mu sync.Mutex
	// err is the first error of an Engage whose context had not ended.
	err error
}

// engager is what both coordinators' Engage is.
type engager interface {
	Engage(context.Context, multicluster.ClusterName, cluster.Cluster) error
}

// engageAll engages every name on c from a goroutine of its own, as a
// provider does, so that engageLimit bounds a coordinator whose Engage
// blocks too (mcr's sharded coordinator's Engage waits for its lock,
// which it holds while it acquires fences one by one).
func (c *coordRun) engageAll(ctx context.Context, e engager, names []string) {
	c.wg.Go(func() {
		for _, n := range names {
			if ctx.Err() != nil {
				return // stopped before every cluster was engaged
			}
			if err := e.Engage(ctx, multicluster.ClusterName(n), stubCluster{}); err != nil {
				if ctx.Err() == nil {
					c.mu.Lock()
					c.err = cmp.Or(c.err, err)
					c.mu.Unlock()
				}
				return
			}
		}
	})
}

// engageErr returns the first error of an Engage, if any.
func (c *coordRun) engageErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// stop stops the replicas, ends the provider's contexts (mcr's sharded
// coordinator releases its fences then) and waits for them.
func (c *coordRun) stop() {
	c.cancel()
	c.wg.Wait()
}

// engagedCount returns how many clusters are engaged by some replica.
func (c *coordRun) engagedCount(names []string) int {
	n := 0
	for _, name := range names {
		for _, e := range c.engaged {
			if e.isLive(multicluster.ClusterName(name)) {
				n++
				break
			}
		}
	}
	return n
}

// engageLimit bounds the wait for every cluster to be engaged; a
// coordinator that has not engaged them all by then is measured as it
// is, and the clusters it engaged are reported.
const engageLimit = 10 * time.Minute

// unthrottled is cfg without client-side rate limits, so that the
// offered load reaches the API server.
func unthrottled(cfg *rest.Config) *rest.Config {
	c := rest.CopyConfig(cfg)
	c.QPS, c.Burst = -1, 0
	return c
}

// startFencer starts benchReplicas replicas of fencer's Coordinator over
// names, with Leases in ns.
func startFencer(b *testing.B, cfg *rest.Config, ns string, names []string) *coordRun {
	b.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	run := &coordRun{cancel: cancel, started: time.Now()}
	for i := range benchReplicas {
		cs, err := kubernetes.NewForConfig(unthrottled(cfg))
		require.NoError(b, err)
		w, err := kubeadapter.NewWatcher(cs.CoordinationV1(), kubeadapter.WatchNamespaces(ns))
		require.NoError(b, err)
		sc := shard.DefaultConfig(ns, "bench", fmt.Sprintf("replica-%d", i))
		sc.LeaseDuration, sc.RenewDeadline, sc.RetryPeriod = 4*benchPeriod, 3*benchPeriod, benchPeriod
		sc.MovesPerSecond = 2000
		sc.Watcher = w
		s, err := shard.NewSharder(cs.CoordinationV1(), sc)
		require.NoError(b, err)
		c, err := mcr.New(s)
		require.NoError(b, err)
		e := newEngagements()
		c.AddAware(e)
		run.engaged = append(run.engaged, e)
		run.wg.Go(func() { _ = w.Start(ctx) })
		run.wg.Go(func() { _ = c.Runnable().Start(ctx) })
		run.engageAll(ctx, c, names)
	}
	return run
}

// startSharded starts benchReplicas replicas of mcr's sharded coordinator
// over names, with Leases in ns, each with its own peer ID.
func startSharded(b *testing.B, cfg *rest.Config, ns string, names []string) *coordRun {
	b.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	run := &coordRun{cancel: cancel, started: time.Now()}
	for i := range benchReplicas {
		cl, err := client.New(unthrottled(cfg), client.Options{Scheme: clientgoscheme.Scheme})
		require.NoError(b, err)
		id := fmt.Sprintf("replica-%d", i)
		c := sharded.New(cl, logr.Discard(),
			sharded.WithPeerRegistry(peers.NewLeaseRegistry(cl, ns, "mcr-peer", id, 1, logr.Discard())),
			sharded.WithShardLease(ns, "mcr-shard"),
			sharded.WithLeaseTimings(4*benchPeriod, benchPeriod, 750*time.Millisecond),
			sharded.WithSynchronizationIntervals(time.Second, 5*time.Second))
		e := newEngagements()
		c.AddAware(e)
		run.engaged = append(run.engaged, e)
		r := c.Runnable()
		run.wg.Go(func() { _ = r.Start(ctx) })
		run.engageAll(ctx, c, names)
	}
	return run
}

// apiLeaseWrites returns the Lease writes the API server has accepted
// since it started, from its own apiserver_request_total: creates,
// updates, patches and deletes of leases answered 200 or 201.
func apiLeaseWrites(b *testing.B, cs *kubernetes.Clientset) float64 {
	b.Helper()
	raw, err := cs.Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
	require.NoError(b, err)
	total := 0.0
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "apiserver_request_total{") || !strings.Contains(line, `resource="leases"`) {
			continue
		}
		if !strings.Contains(line, `code="200"`) && !strings.Contains(line, `code="201"`) {
			continue
		}
		mutating := false
		for _, v := range []string{"POST", "PUT", "PATCH", "DELETE"} {
			mutating = mutating || strings.Contains(line, `verb="`+v+`"`)
		}
		if !mutating {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		require.NoError(b, err)
		total += v
	}
	require.NoError(b, sc.Err())
	return total
}

// BenchmarkCoordinatorLeaseWrites measures, on the real kube-apiserver, for
// each cluster count (-mcr-clusters), fencer's Coordinator beside mcr's
// sharded coordinator, 3 replicas each, at the same renew period (2s) and
// with unthrottled clients, one after the other in the same run:
//   - the time from a cold start until every cluster is engaged by a
//     replica (engage-all-s; -1 when not within 10 minutes, and then how
//     many were, in engaged);
//   - steady-state Lease writes/s, counted by the API server's
//     apiserver_request_total over a 20s window that starts 15s after
//     every cluster was engaged (writes/s);
//   - for mcr's, the offered renewal rate (its fences held at the window's
//     start over the renew period) and how many of its Leases had lapsed
//     at the window's end (renewTime plus leaseDurationSeconds in the
//     past).
//
// Run it with -benchtime 1x: one iteration measures all of it.
func BenchmarkCoordinatorLeaseWrites(b *testing.B) {
	api := kubefencertest.APIServerForTest(b)
	cs, err := kubernetes.NewForConfig(api.Admin())
	require.NoError(b, err)
	for _, f := range strings.Split(*benchClusters, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		require.NoError(b, err)
		b.Run(fmt.Sprintf("clusters=%d", n), func(b *testing.B) {
			names := make([]string, n)
			for i := range names {
				names[i] = fmt.Sprintf("cluster-%d", i)
			}
			measure := func(kind string, start func(*testing.B, *rest.Config, string, []string) *coordRun) (engageAll, engaged, writes float64, run *coordRun, ns string) {
				ns = fmt.Sprintf("bench-%s-%d", kind, n)
				_, err := cs.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
				require.NoError(b, err)
				run = start(b, api.Admin(), ns, names)
				if waitFor(engageLimit, func() bool { return run.engagedCount(names) == n }) {
					engageAll = time.Since(run.started).Seconds()
				} else {
					engageAll = -1
					b.Logf("%s: %d of %d clusters engaged after %v", kind, run.engagedCount(names), n, engageLimit)
				}
				require.NoError(b, run.engageErr())
				engaged = float64(run.engagedCount(names))
				time.Sleep(15 * time.Second)
				const window = 20 * time.Second
				before, t0 := apiLeaseWrites(b, cs), time.Now()
				time.Sleep(window)
				after, t1 := apiLeaseWrites(b, cs), time.Now()
				return engageAll, engaged, (after - before) / t1.Sub(t0).Seconds(), run, ns
			}
			for range b.N {
				fEngage, fEngaged, fWrites, fRun, _ := measure("fencer", startFencer)
				fRun.stop()
				mEngage, mEngaged, mWrites, mRun, mNS := measure("mcr", startSharded)
				leases, err := cs.CoordinationV1().Leases(mNS).List(context.Background(), metav1.ListOptions{})
				require.NoError(b, err)
				held, lapsed := 0, 0
				now := time.Now()
				for _, l := range leases.Items {
					if !strings.HasPrefix(l.Name, "mcr-shard-") || l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" {
						continue
					}
					held++
					if l.Spec.RenewTime == nil || l.Spec.LeaseDurationSeconds == nil ||
						l.Spec.RenewTime.Add(time.Duration(*l.Spec.LeaseDurationSeconds)*time.Second).Before(now) {
						lapsed++
					}
				}
				mRun.stop()
				b.ReportMetric(fWrites, "fencer-writes/s")
				b.ReportMetric(mWrites, "mcr-writes/s")
				b.ReportMetric(float64(held)/benchPeriod.Seconds(), "mcr-offered-writes/s")
				b.ReportMetric(float64(lapsed), "mcr-lapsed-leases")
				b.ReportMetric(mWrites/fWrites, "mcr/fencer-writes")
				b.ReportMetric(fEngage, "fencer-engage-all-s")
				b.ReportMetric(mEngage, "mcr-engage-all-s")
				if fEngage < 0 || mEngage < 0 {
					b.ReportMetric(fEngaged, "fencer-engaged")
					b.ReportMetric(mEngaged, "mcr-engaged")
				}
			}
		})
	}
}
