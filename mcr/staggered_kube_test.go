package mcr_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/multicluster-runtime/pkg/multicluster"

	"github.com/fencer-dev/fencer/kubeadapter"
	"github.com/fencer-dev/fencer/kubeadapter/kubefencertest"
	"github.com/fencer-dev/fencer/kubeadapter/shard"
	"github.com/fencer-dev/fencer/mcr"
)

// bareReplica is fencer's Coordinator with a recording aware runnable and
// no manager: what the coordinator engages, for many clusters.
type bareReplica struct {
	name    string
	coord   *mcr.Coordinator
	engaged *engagements
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

func startBareReplica(t *testing.T, cfg *rest.Config, ns, name string, clusters []string) *bareReplica {
	t.Helper()
	cs, err := kubernetes.NewForConfig(unthrottled(cfg))
	require.NoError(t, err)
	w, err := kubeadapter.NewWatcher(cs.CoordinationV1(), kubeadapter.WatchNamespaces(ns))
	require.NoError(t, err)
	sc := fastShardConfig(ns, name)
	sc.Watcher = w
	s, err := shard.NewSharder(cs.CoordinationV1(), sc)
	require.NoError(t, err)
	c, err := mcr.New(s)
	require.NoError(t, err)
	r := &bareReplica{name: name, coord: c, engaged: newEngagements()}
	c.AddAware(r.engaged)
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	r.wg.Go(func() { _ = w.Start(ctx) })
	r.wg.Go(func() { _ = c.Runnable().Start(ctx) })
	for _, n := range clusters {
		require.NoError(t, c.Engage(ctx, multicluster.ClusterName(n), stubCluster{}))
	}
	t.Cleanup(r.stop)
	return r
}

// stop leaves gracefully and waits.
func (r *bareReplica) stop() {
	r.cancel()
	r.wg.Wait()
}

// TestStaggeredStartAndRollingRestart starts 3 replicas named as a
// StatefulSet's pods 2s apart over 3,000 clusters, then restarts each in
// turn under the same name, sampling the engagements themselves
// throughout: no cluster is ever engaged by two replicas at once, every
// cluster ends engaged by exactly one, and each replica's share is within
// 10% of an equal share.
func TestStaggeredStartAndRollingRestart(t *testing.T) {
	start := time.Now()
	api := kubefencertest.APIServerForTest(t)
	const ns, n = "stagger", 3000
	cs, err := kubernetes.NewForConfig(api.Admin())
	require.NoError(t, err)
	_, err = cs.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	require.NoError(t, err)
	clusters := make([]string, n)
	for i := range clusters {
		clusters[i] = fmt.Sprintf("project-%d", i)
	}

	var mu sync.Mutex
	replicas := map[string]*bareReplica{} // the current ones, by name
	var all []*bareReplica                // every one started: the sampler's
	var doubles []string
	samples := 0
	stop, sampled := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			mu.Lock()
			rs := append([]*bareReplica(nil), all...)
			mu.Unlock()
			samples++
			live := map[multicluster.ClusterName]int{}
			for _, r := range rs {
				for c, l := range r.engaged.live() {
					live[c] += l
				}
			}
			for c, l := range live {
				if l < 2 {
					continue
				}
				// The replicas were read one after the other: read c
				// again in the reverse order. An engagement seen live
				// twice was live in between, so two seen live again
				// overlapped.
				again := 0
				for i := len(rs) - 1; i >= 0; i-- {
					n, _ := rs[i].engaged.count(c)
					again += n
				}
				if again > 1 && len(doubles) < 10 {
					doubles = append(doubles, fmt.Sprintf("%s engaged %d times at %v", c, again, time.Since(start).Round(time.Millisecond)))
				}
			}
		}
	}()
	finish := func() {
		close(stop)
		<-sampled
	}
	defer func() {
		select {
		case <-stop:
		default:
			finish()
		}
	}()
	// shares waits until every cluster is engaged by exactly one replica
	// and every replica's share is within 10% of an equal share, and
	// returns each replica's count.
	shares := func(what string) map[string]int {
		var got map[string]int
		require.True(t, waitFor(5*time.Minute, func() bool {
			mu.Lock()
			defer mu.Unlock()
			got = map[string]int{}
			for _, c := range clusters {
				owner := ""
				for name, r := range replicas {
					if l, _ := r.engaged.count(multicluster.ClusterName(c)); l > 0 {
						if owner != "" {
							return false
						}
						owner = name
					}
				}
				if owner == "" {
					return false
				}
				got[owner]++
			}
			for name := range replicas {
				if d := got[name] - n/len(replicas); d > n/len(replicas)/10 || -d > n/len(replicas)/10 {
					return false
				}
			}
			return true
		}), "%s: the clusters were not each engaged by one replica, in shares within 10%% of equal: %v", what, got)
		t.Logf("%s at %v: %v", what, time.Since(start).Round(time.Millisecond), got)
		return got
	}

	names := []string{"replica-0", "replica-1", "replica-2"}
	for i, name := range names {
		if i > 0 {
			time.Sleep(2 * time.Second)
		}
		r := startBareReplica(t, api.Admin(), ns, name, clusters)
		mu.Lock()
		replicas[name] = r
		all = append(all, r)
		mu.Unlock()
	}
	got := shares("staggered start")
	for _, name := range names {
		require.InDelta(t, n/len(names), got[name], float64(n/len(names))/10, "%s's share", name)
	}

	for _, name := range names {
		mu.Lock()
		old := replicas[name]
		delete(replicas, name)
		mu.Unlock()
		old.stop()
		r := startBareReplica(t, api.Admin(), ns, name, clusters)
		mu.Lock()
		replicas[name] = r
		all = append(all, r)
		mu.Unlock()
		shares("restarted " + name)
	}
	finish()
	require.Empty(t, doubles, "clusters engaged by two replicas at once (%d samples)", samples)
	t.Logf("%d samples of %d clusters, none engaged twice; wall time %v", samples, n, time.Since(start).Round(time.Millisecond))
}
