package e2e_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fencer-dev/fencer/internal/rendezvous"
	"github.com/fencer-dev/fencer/kubeadapter"
	"github.com/fencer-dev/fencer/kubeadapter/internal/kubetest"
	"github.com/fencer-dev/fencer/kubeadapter/shard"
)

// ringMember is one member of a ring in its own "process": its own
// clientsets, Watcher, metrics registry and Lease client that the test
// can stall or kill.
type ringMember struct {
	name   string
	s      *shard.Sharder
	reg    *prometheus.Registry
	leases *kubetest.Stallable
	net    *netCut
	crc    client.Client
	cancel context.CancelFunc
	done   chan struct{}
}

// fastShardConfig is a ShardConfig with short durations, so that a dead
// member's shards move in about 2s.
func fastShardConfig(ns, ring, identity string) shard.Config {
	c := shard.DefaultConfig(ns, ring, identity)
	c.LeaseDuration, c.RenewDeadline, c.RetryPeriod = 2*time.Second, 1500*time.Millisecond, 250*time.Millisecond
	c.HandoffTimeout = time.Second
	c.MovesPerSecond = 1000
	return c
}

// startMember starts a member of ring, whose Leases are in k.ns, tracking
// shards, with fastShardConfig. It is stopped (gracefully) when the test
// ends unless stopped before.
func (k *kube) startMember(tb testing.TB, ring, identity string, shards []string) *ringMember {
	tb.Helper()
	return k.startMemberWith(tb, fastShardConfig(k.ns, ring, identity), shards)
}

// startMemberWith is startMember with cfg, whose Watcher it sets.
func (k *kube) startMemberWith(tb testing.TB, cfg shard.Config, shards []string) *ringMember {
	tb.Helper()
	return k.startMemberVia(tb, cfg, shards, nil)
}

// startMemberVia is startMemberWith with the member's Lease client, inside
// its stallable, wrapped by wrap when wrap is not nil.
func (k *kube) startMemberVia(tb testing.TB, cfg shard.Config, shards []string, wrap func(coordinationv1client.LeasesGetter) coordinationv1client.LeasesGetter) *ringMember {
	tb.Helper()
	net := &netCut{inflight: map[int]context.CancelFunc{}}
	rc := rest.CopyConfig(k.env.Admin())
	rc.Wrap(net.wrap)
	cs, err := kubernetes.NewForConfig(rc)
	require.NoError(tb, err)
	crc, err := client.New(rc, client.Options{Scheme: clientgoscheme.Scheme})
	require.NoError(tb, err)
	var leases coordinationv1client.LeasesGetter = cs.CoordinationV1()
	if wrap != nil {
		leases = wrap(leases)
	}
	st := &kubetest.Stallable{LeasesGetter: leases}
	reg := prometheus.NewRegistry()
	w, err := kubeadapter.NewWatcher(st, kubeadapter.WatchNamespaces(cfg.Namespace), kubeadapter.WithRegisterer(reg))
	require.NoError(tb, err)
	cfg.Watcher = w
	cfg.Metrics, err = shard.NewMetrics(reg)
	require.NoError(tb, err)
	s, err := shard.NewSharder(st, cfg)
	require.NoError(tb, err)
	s.Track(shards...)
	ctx, cancel := context.WithCancel(context.Background())
	m := &ringMember{name: cfg.Identity, s: s, reg: reg, leases: st, net: net, crc: crc, cancel: cancel, done: make(chan struct{})}
	sharderDone := make(chan struct{})
	go func() {
		defer close(m.done)
		go func() { defer close(sharderDone); _ = s.Start(ctx) }()
		_ = w.Start(ctx)
		<-sharderDone
	}()
	tb.Cleanup(m.stop)
	return m
}

// netCut is a member's network link to the API server. While it is cut,
// every request fails at once without reaching the server, and every
// request in flight, watches included, is ended: a partition.
type netCut struct {
	mu       sync.Mutex
	cut      bool
	next     int
	inflight map[int]context.CancelFunc
}

var errPartitioned = errors.New("test: partitioned from the API server")

// set cuts the link (true) or heals it (false).
func (n *netCut) set(cut bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.cut = cut
	if cut {
		for _, cancel := range n.inflight {
			cancel()
		}
	}
}

func (n *netCut) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(req *http.Request) (*http.Response, error) {
		ctx, cancel := context.WithCancel(req.Context())
		n.mu.Lock()
		if n.cut {
			n.mu.Unlock()
			cancel()
			return nil, errPartitioned
		}
		id := n.next
		n.next++
		n.inflight[id] = cancel
		n.mu.Unlock()
		done := func() {
			n.mu.Lock()
			delete(n.inflight, id)
			n.mu.Unlock()
			cancel()
		}
		resp, err := rt.RoundTrip(req.WithContext(ctx))
		if err != nil {
			done()
			return nil, err
		}
		resp.Body = &closeHook{ReadCloser: resp.Body, done: done}
		return resp, nil
	})
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// closeHook calls done once, when the body is closed.
type closeHook struct {
	io.ReadCloser
	once sync.Once
	done func()
}

func (c *closeHook) Close() error {
	err := c.ReadCloser.Close()
	c.once.Do(c.done)
	return err
}

// stop leaves the ring gracefully and waits until the member's goroutines
// have returned.
func (m *ringMember) stop() {
	m.leases.Stalled.Store(false)
	m.cancel()
	<-m.done
}

// metric returns the sum of the member's series of name whose labels
// include want.
func (m *ringMember) metric(t testing.TB, name string, want ...string) float64 {
	t.Helper()
	mfs, err := m.reg.Gather()
	require.NoError(t, err)
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, s := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range s.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			for i := 0; i+1 < len(want); i += 2 {
				if labels[want[i]] != want[i+1] {
					continue series
				}
			}
			switch {
			case s.GetCounter() != nil:
				sum += s.GetCounter().GetValue()
			case s.GetGauge() != nil:
				sum += s.GetGauge().GetValue()
			}
		}
	}
	return sum
}

// owners returns, for each shard, the members that own it now.
func owners(members []*ringMember, shards []string) map[string][]string {
	out := map[string][]string{}
	for _, sh := range shards {
		for _, m := range members {
			if _, ok := m.s.Owns(sh); ok {
				out[sh] = append(out[sh], m.name)
			}
		}
	}
	return out
}

// settled waits until every shard has exactly one owner among members,
// its rendezvous owner, and returns the owner of each.
func settled(t testing.TB, members []*ringMember, shards []string) map[string]string {
	t.Helper()
	return settledWithin(t, 20*time.Second, members, shards)
}

// settledWithin is settled with a deadline of d.
func settledWithin(t testing.TB, d time.Duration, members []*ringMember, shards []string) map[string]string {
	t.Helper()
	ms := make([]rendezvous.Member, len(members))
	for i, m := range members {
		ms[i] = rendezvous.Member{Name: m.name, Weight: 1}
	}
	var last map[string][]string
	ok := waitFor(d, func() bool {
		last = owners(members, shards)
		for _, sh := range shards {
			want, _ := rendezvous.Owner(sh, ms)
			if len(last[sh]) != 1 || last[sh][0] != want {
				return false
			}
		}
		return true
	})
	require.True(t, ok, "ring did not settle: %d shards", len(last))
	out := map[string]string{}
	for sh, o := range last {
		out[sh] = o[0]
	}
	return out
}

// waitFor polls cond every 50ms until it holds or d passes.
func waitFor(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// shardsOwnedBy returns n shard names with prefix whose rendezvous owner
// among ids is want.
func shardsOwnedBy(prefix, want string, n int, ids ...string) []string {
	ms := make([]rendezvous.Member, len(ids))
	for i, id := range ids {
		ms[i] = rendezvous.Member{Name: id, Weight: 1}
	}
	var out []string
	for i := 0; len(out) < n; i++ {
		sh := fmt.Sprintf("%s%d", prefix, i)
		if o, _ := rendezvous.Owner(sh, ms); o == want {
			out = append(out, sh)
		}
	}
	return out
}

// apiLeaseWrites returns the Lease writes the API server has accepted
// since it started, from its own apiserver_request_total: creates,
// updates, patches and deletes of leases answered 200 or 201.
func apiLeaseWrites(tb testing.TB, k *kube) float64 {
	tb.Helper()
	raw, err := k.cs.Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
	require.NoError(tb, err)
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
		require.NoError(tb, err)
		total += v
	}
	require.NoError(tb, sc.Err())
	return total
}
