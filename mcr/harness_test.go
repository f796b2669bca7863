package mcr_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/cluster"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	crlog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"
	mccontroller "sigs.k8s.io/multicluster-runtime/pkg/controller"
	mchandler "sigs.k8s.io/multicluster-runtime/pkg/handler"
	mcmanager "sigs.k8s.io/multicluster-runtime/pkg/manager"
	"sigs.k8s.io/multicluster-runtime/pkg/manager/coordinator/sharded"
	"sigs.k8s.io/multicluster-runtime/pkg/manager/coordinator/sharded/peers"
	mcsharder "sigs.k8s.io/multicluster-runtime/pkg/manager/coordinator/sharded/sharder"
	"sigs.k8s.io/multicluster-runtime/pkg/multicluster"
	mcreconcile "sigs.k8s.io/multicluster-runtime/pkg/reconcile"
	mcsource "sigs.k8s.io/multicluster-runtime/pkg/source"

	"github.com/fencer-dev/fencer/kubeadapter"
	"github.com/fencer-dev/fencer/kubeadapter/fenced"
	"github.com/fencer-dev/fencer/kubeadapter/kubefencertest"
	"github.com/fencer-dev/fencer/kubeadapter/shard"
	"github.com/fencer-dev/fencer/mcr"
	"github.com/fencer-dev/fencer/token"
)

func TestMain(m *testing.M) {
	logger := logr.Discard()
	if os.Getenv("FENCER_MCR_LOG") != "" {
		logger = funcr.New(func(prefix, args string) { fmt.Fprintln(os.Stderr, prefix, args) }, funcr.Options{Verbosity: 1})
	}
	crlog.SetLogger(logger)
	code := m.Run()
	stopSharedAPI()
	if code == 0 {
		// Goroutines of the libraries that nobody can wait for: mcr's
		// sharded coordinator (the baseline) releases its fences on
		// goroutines that may still be retrying against a stopped API
		// server, and controller-runtime's multi-namespace cache waits,
		// forever, for the sync of a handler whose informer stopped
		// before it synced (a replica whose network was cut).
		if err := goleak.Find(
			goleak.IgnoreAnyFunction("sigs.k8s.io/multicluster-runtime/pkg/manager/coordinator/sharded.(*leaseGuard).Release"),
			goleak.IgnoreTopFunction("sigs.k8s.io/controller-runtime/pkg/cache.newMultiNamespaceInformerHandlerRegistration.func1"),
			goleak.IgnoreTopFunction("sigs.k8s.io/controller-runtime/pkg/cache.newMultiNamespaceInformer.func1"),
		); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: errors on successful test run: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// shared is the API server the red-team tests share, started by the first
// that asks (sharedAPI) and stopped when every test has run.
var shared struct {
	once sync.Once
	api  *kubefencertest.APIServer
	dir  string
	err  error
}

// sharedAPI returns the API server the tests that call it share, with the
// admission policy installed; each such test works in namespaces of its
// own. It fails or skips t as kubefencertest.APIServerForTest does.
func sharedAPI(t *testing.T) *kubefencertest.APIServer {
	t.Helper()
	shared.once.Do(func() {
		start := time.Now()
		shared.dir, shared.err = os.MkdirTemp("", "mcr-api-")
		if shared.err != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), kubefencertest.StartTimeout)
		defer cancel()
		shared.api, shared.err = kubefencertest.StartAPIServer(ctx, shared.dir)
		if shared.err == nil {
			shared.err = kubefencertest.InstallPolicy(ctx, shared.api.Admin())
		}
		t.Logf("kubefencertest: shared kube-apiserver ready in %v", time.Since(start).Round(time.Millisecond))
	})
	kubefencertest.SkipIfNoBinaries(t, shared.err)
	require.NoError(t, shared.err)
	return shared.api
}

// stopSharedAPI stops the shared API server, if one was started.
func stopSharedAPI() {
	if shared.api != nil {
		shared.api.Stop()
	}
	if shared.dir != "" {
		_ = os.RemoveAll(shared.dir)
	}
}

// kind says which coordinator a replica runs.
type kind int

const (
	// mcrSharded is multicluster-runtime's own sharded coordinator, with
	// an unfenced reconciler: the baseline.
	mcrSharded kind = iota
	// fencerCoord is this package's Coordinator, Gate and a fenced client.
	fencerCoord
)

func (k kind) String() string { return [...]string{"mcr-sharded", "fencer"}[k] }

// env is one test's API server, with the policy installed, and its
// namespaces: ring (Leases), down (the shared downstream: the
// "downstream" ConfigMap and the dns-record-<project> records), and one
// namespace per project, each a cluster of the provider.
type env struct {
	api      *kubefencertest.APIServer
	admin    client.Client
	cs       *kubernetes.Clientset
	ring     string
	down     string
	projects []string
	log      *writeLog
	// handoff is the replicas' shard.Config.HandoffTimeout; 0 means
	// fastShardConfig's.
	handoff time.Duration
}

func newEnv(t *testing.T, api *kubefencertest.APIServer, prefix string, projects int) *env {
	t.Helper()
	admin, err := client.New(api.Admin(), client.Options{Scheme: clientgoscheme.Scheme})
	require.NoError(t, err)
	cs, err := kubernetes.NewForConfig(api.Admin())
	require.NoError(t, err)
	e := &env{api: api, admin: admin, cs: cs, ring: prefix + "-ring", down: prefix + "-down", log: &writeLog{}}
	for i := range projects {
		e.projects = append(e.projects, fmt.Sprintf("%s-p%d", prefix, i))
	}
	for _, ns := range append([]string{e.ring, e.down}, e.projects...) {
		require.NoError(t, admin.Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}))
	}
	for _, p := range e.projects {
		require.NoError(t, admin.Create(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: p, Name: "project"}}))
	}
	require.NoError(t, admin.Create(t.Context(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: e.down, Name: "downstream"}, Data: map[string]string{"v": "0"}}))
	return e
}

// setDownstream changes the shared downstream value, which every
// replica's raw source maps to a request for every project.
func (e *env) setDownstream(t *testing.T, v string) {
	t.Helper()
	var cm corev1.ConfigMap
	require.NoError(t, e.admin.Get(t.Context(), client.ObjectKey{Namespace: e.down, Name: "downstream"}, &cm))
	cm.Data = map[string]string{"v": v}
	require.NoError(t, e.admin.Update(t.Context(), &cm))
}

func (e *env) record(t *testing.T, project string) *corev1.ConfigMap {
	t.Helper()
	var cm corev1.ConfigMap
	require.NoError(t, e.admin.Get(t.Context(), client.ObjectKey{Namespace: e.down, Name: "dns-record-" + project}, &cm))
	return &cm
}

// write is one write of a DNS record by a replica's reconciler.
type write struct {
	replica, project, value string
	rv                      int64
	tok                     token.Token // the record's stamp after the write
	err                     error
}

// writeLog is what the replicas' reconcilers did.
type writeLog struct {
	mu         sync.Mutex
	reconciled map[[2]string][]string // (project, value) -> replicas that reconciled it
	writes     []write
}

func (l *writeLog) reconcile(replica, project, value string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.reconciled == nil {
		l.reconciled = map[[2]string][]string{}
	}
	k := [2]string{project, value}
	l.reconciled[k] = append(l.reconciled[k], replica)
}

// by returns the distinct replicas that reconciled project with value,
// sorted. (A replica may reconcile a request twice: a retry after a
// conflict, or two sources that enqueue it.)
func (l *writeLog) by(project, value string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := slices.Clone(l.reconciled[[2]string{project, value}])
	slices.Sort(out)
	return slices.Compact(out)
}

func (l *writeLog) wrote(w write) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.writes = append(l.writes, w)
}

func (l *writeLog) all() []write {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]write(nil), l.writes...)
}

// await waits up to d for replica's attempt to write value to project's
// record, and returns it; it fails t with msg if none comes.
func (l *writeLog) await(t *testing.T, d time.Duration, replica, project, value, msg string) write {
	t.Helper()
	var found write
	require.True(t, waitFor(d, func() bool {
		for _, w := range l.all() {
			if w.replica == replica && w.project == project && w.value == value {
				found = w
				return true
			}
		}
		return false
	}), msg)
	return found
}

// pauser pauses one reconcile of one project, once: the reconcile that
// reads the downstream value and then stops before writing, as a process
// that is paused mid-reconcile.
type pauser struct {
	mu      sync.Mutex
	project string
	value   string
	// stubborn makes the pause ignore the reconcile's context, as a
	// reconcile that does not check it.
	stubborn bool
	paused   chan string
	resume   chan struct{}
}

// arm makes the next reconcile of project that reads value pause (an
// earlier change's reconcile, still queued or retried, goes on); it sends
// the value on the returned channel and waits until resume is closed.
func (p *pauser) arm(project, value string) (paused <-chan string, resume chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.project, p.value, p.paused, p.resume, p.stubborn = project, value, make(chan string, 1), make(chan struct{}), false
	return p.paused, p.resume
}

// armStubborn is arm for a pause that ignores the reconcile's context.
func (p *pauser) armStubborn(project, value string) (paused <-chan string, resume chan struct{}) {
	paused, resume = p.arm(project, value)
	p.mu.Lock()
	p.stubborn = true
	p.mu.Unlock()
	return paused, resume
}

// maybe pauses if armed for project, and returns the context the
// reconcile goes on with: ctx, or for a stubborn pause one that never
// ends.
func (p *pauser) maybe(ctx context.Context, project, value string) context.Context {
	p.mu.Lock()
	if p.project != project || p.value != value {
		p.mu.Unlock()
		return ctx
	}
	paused, resume, stubborn := p.paused, p.resume, p.stubborn
	p.project = ""
	p.mu.Unlock()
	paused <- value
	if stubborn {
		ctx = context.Background()
	}
	select {
	case <-resume:
	case <-ctx.Done():
	case <-time.After(time.Minute):
	}
	return ctx
}

// engagements records, for one replica, the engagements of its aware
// runnables: an aware runnable of the manager, engaged by the coordinator
// as the controllers are. An engagement is live while its context is not
// done, read at the moment of asking, so a sample sees exactly what the
// controllers see.
type engagements struct {
	mu    sync.Mutex
	ctxs  map[multicluster.ClusterName][]context.Context // live ones, and ended ones not yet pruned
	total map[multicluster.ClusterName]int
	ended map[multicluster.ClusterName][]error
}

func newEngagements() *engagements {
	return &engagements{ctxs: map[multicluster.ClusterName][]context.Context{}, total: map[multicluster.ClusterName]int{}, ended: map[multicluster.ClusterName][]error{}}
}

func (e *engagements) Start(ctx context.Context) error { <-ctx.Done(); return nil }

func (e *engagements) Engage(ctx context.Context, name multicluster.ClusterName, _ cluster.Cluster) error {
	e.mu.Lock()
	e.ctxs[name] = append(e.ctxs[name], ctx)
	e.total[name]++
	e.mu.Unlock()
	context.AfterFunc(ctx, func() {
		e.mu.Lock()
		e.ended[name] = append(e.ended[name], context.Cause(ctx))
		e.mu.Unlock()
	})
	return nil
}

// liveLocked returns name's live engagements, pruning the ended ones.
func (e *engagements) liveLocked(name multicluster.ClusterName) int {
	ctxs := e.ctxs[name]
	live := ctxs[:0]
	for _, ctx := range ctxs {
		if ctx.Err() == nil {
			live = append(live, ctx)
		}
	}
	clear(ctxs[len(live):])
	e.ctxs[name] = live
	return len(live)
}

func (e *engagements) isLive(name multicluster.ClusterName) bool {
	live, _ := e.count(name)
	return live > 0
}

// count returns the live engagements of name and all of them so far.
func (e *engagements) count(name multicluster.ClusterName) (live, total int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.liveLocked(name), e.total[name]
}

// live returns the live engagements of every cluster that has one, read
// under one lock.
func (e *engagements) live() map[multicluster.ClusterName]int {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := map[multicluster.ClusterName]int{}
	for name := range e.ctxs {
		if n := e.liveLocked(name); n > 0 {
			out[name] = n
		}
	}
	return out
}

// endings returns the causes of the ended engagements of name.
func (e *engagements) endings(name multicluster.ClusterName) []error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]error(nil), e.ended[name]...)
}

// replica is one replica of the controller, in its own "process": its
// own clients, provider, manager, coordinator and metrics registry.
type replica struct {
	name    string
	kind    kind
	e       *env
	api     client.Client
	mgr     mcmanager.Manager
	coord   *mcr.Coordinator
	gated   *mcr.GatedReconciler
	leases  *freezable
	prov    *nsProvider
	engaged *engagements
	peers   peers.Registry // mcr's sharded coordinator's peer view
	pause   pauser
	net     *netCut
	cancel  context.CancelFunc
	done    chan struct{}
}

// fastShardConfig is a shard.Config with short durations, so that a dead
// replica's clusters move in about 2s.
func fastShardConfig(ns, identity string) shard.Config {
	c := shard.DefaultConfig(ns, "mcr", identity)
	c.LeaseDuration, c.RenewDeadline, c.RetryPeriod = 2*time.Second, 1500*time.Millisecond, 250*time.Millisecond
	c.HandoffTimeout = time.Second
	c.MovesPerSecond = 1000
	return c
}

// startReplica starts a replica of kind k: an mcr manager over the
// namespace provider, with a controller that watches each project's
// objects and, through a raw source on the local cluster, the shared
// downstream ConfigMap, which enqueues every project on every change.
// Its reconcile copies the downstream value into dns-record-<project>.
// It is stopped when the test ends unless stopped before.
func (e *env) startReplica(t *testing.T, k kind, name string) *replica {
	t.Helper()
	net := &netCut{inflight: map[int]context.CancelFunc{}}
	rc := rest.CopyConfig(e.api.Admin())
	rc.Wrap(net.wrap)
	api, err := client.New(rc, client.Options{Scheme: clientgoscheme.Scheme})
	require.NoError(t, err)
	prov, err := newNSProvider(rc, e.projects...)
	require.NoError(t, err)
	r := &replica{name: name, kind: k, e: e, api: api, prov: prov, net: net, engaged: newEngagements(), done: make(chan struct{})}

	var opts []mcmanager.Option
	var watcher *kubeadapter.Watcher
	switch k {
	case mcrSharded:
		log := crlog.Log.WithName(name)
		reg := peers.NewLeaseRegistry(api, e.ring, "mcr-peer", name, 1, log)
		r.peers = reg
		opts = append(opts, mcmanager.WithCoordinator(sharded.New(api, log,
			sharded.WithPeerRegistry(reg),
			sharded.WithShardLease(e.ring, "mcr-shard"),
			sharded.WithLeaseTimings(6*time.Second, 2*time.Second, 200*time.Millisecond),
			sharded.WithSynchronizationIntervals(250*time.Millisecond, time.Second))))
	case fencerCoord:
		cs, err := kubernetes.NewForConfig(rc)
		require.NoError(t, err)
		r.leases = &freezable{LeasesGetter: cs.CoordinationV1()}
		w, err := kubeadapter.NewWatcher(r.leases, kubeadapter.WatchNamespaces(e.ring), kubeadapter.WithRegisterer(prometheus.NewRegistry()))
		require.NoError(t, err)
		cfg := fastShardConfig(e.ring, name)
		if e.handoff > 0 {
			cfg.HandoffTimeout = e.handoff
		}
		cfg.Watcher = w
		s, err := shard.NewSharder(r.leases, cfg)
		require.NoError(t, err)
		r.coord, err = mcr.New(s)
		require.NoError(t, err)
		opts = append(opts, mcmanager.WithCoordinator(r.coord))
		watcher = w
	}
	mgr, err := mcmanager.New(rc, prov, manager.Options{
		Scheme:  clientgoscheme.Scheme,
		Metrics: metricsserver.Options{BindAddress: "0"},
		// A replica whose network is cut cannot hand its clusters off:
		// bound its shutdown.
		GracefulShutdownTimeout: ptr.To(10 * time.Second),
		Cache:                   cache.Options{DefaultNamespaces: map[string]cache.Config{e.down: {}}},
		Controller:              config.Controller{SkipNameValidation: ptr.To(true)},
	}, opts...)
	require.NoError(t, err)
	r.mgr = mgr
	if k == fencerCoord {
		require.NoError(t, mgr.GetLocalManager().Add(watcher))
		r.mgr = mcr.Gated(mgr, r.coord)
	}
	require.NoError(t, r.mgr.Add(r.engaged))

	var rec reconcile.TypedReconciler[mcreconcile.Request]
	if k == fencerCoord {
		r.gated = mcr.Gate(r.coord, shard.ReconcilerFunc[mcreconcile.Request](r.reconcile))
		rec = r.gated
	} else {
		rec = reconcile.TypedFunc[mcreconcile.Request](func(ctx context.Context, req mcreconcile.Request) (reconcile.Result, error) {
			return r.reconcile(ctx, req, nil)
		})
	}
	ctrl, err := mccontroller.New("dns", r.mgr, mccontroller.Options{Reconciler: rec, SkipNameValidation: ptr.To(true)})
	require.NoError(t, err)
	require.NoError(t, ctrl.MultiClusterWatch(mcsource.Kind(&corev1.ConfigMap{}, mchandler.TypedEnqueueRequestForObject[*corev1.ConfigMap]())))
	projects := e.projects
	require.NoError(t, ctrl.Watch(source.TypedKind(mgr.GetLocalManager().GetCache(), &corev1.ConfigMap{},
		handler.TypedEnqueueRequestsFromMapFunc(func(_ context.Context, cm *corev1.ConfigMap) []mcreconcile.Request {
			if cm.Name != "downstream" {
				return nil
			}
			var out []mcreconcile.Request
			for _, p := range projects {
				out = append(out, projectRequest(p))
			}
			return out
		}))))
	if k == fencerCoord {
		require.NoError(t, ctrl.Watch(mcr.AcquiredSource(r.coord, func(_ context.Context, name multicluster.ClusterName) ([]mcreconcile.Request, error) {
			return []mcreconcile.Request{projectRequest(string(name))}, nil
		})))
	}

	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() {
		defer close(r.done)
		if err := r.mgr.Start(ctx); err != nil && ctx.Err() == nil {
			t.Errorf("replica %s: %v", name, err)
		}
	}()
	t.Cleanup(r.stop)
	return r
}

func projectRequest(project string) mcreconcile.Request {
	var req mcreconcile.Request
	req.ClusterName = multicluster.ClusterName(project)
	req.Namespace, req.Name = project, "project"
	return req
}

// netCut is a replica's network link to the API server. While it is cut,
// every request fails at once without reaching the server, and every
// request in flight, watches included, is ended: a partition, or a
// process that died without releasing anything.
type netCut struct {
	mu       sync.Mutex
	cut      bool
	next     int
	inflight map[int]context.CancelFunc
}

var errPartitioned = errors.New("test: partitioned from the API server")

func (n *netCut) set(cut bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.cut = cut
	if cut {
		for id, cancel := range n.inflight {
			cancel()
			delete(n.inflight, id)
		}
	}
}

func (n *netCut) done(id int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if cancel := n.inflight[id]; cancel != nil {
		cancel()
		delete(n.inflight, id)
	}
}

func (n *netCut) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(req *http.Request) (*http.Response, error) {
		n.mu.Lock()
		if n.cut {
			n.mu.Unlock()
			return nil, errPartitioned
		}
		ctx, cancel := context.WithCancel(req.Context())
		id := n.next
		n.next++
		n.inflight[id] = cancel
		n.mu.Unlock()
		resp, err := rt.RoundTrip(req.WithContext(ctx))
		if err != nil {
			n.done(id)
			return nil, err
		}
		resp.Body = &closeHook{ReadCloser: resp.Body, done: func() { n.done(id) }}
		return resp, nil
	})
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

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

// stop stops the replica gracefully and waits for its manager to return.
func (r *replica) stop() {
	if r.leases != nil {
		r.leases.thaw()
	}
	r.cancel()
	select {
	case <-r.done:
	case <-time.After(30 * time.Second):
		panic("replica " + r.name + " did not stop within 30s")
	}
}

// reconcile copies the downstream value into the project's DNS record,
// through a fenced client of the project's Held when h is not nil.
func (r *replica) reconcile(ctx context.Context, req mcreconcile.Request, h *shard.Held) (reconcile.Result, error) {
	project := string(req.ClusterName)
	if _, err := r.mgr.GetCluster(ctx, req.ClusterName); err != nil {
		return reconcile.Result{}, err
	}
	var down corev1.ConfigMap
	if err := r.api.Get(ctx, client.ObjectKey{Namespace: r.e.down, Name: "downstream"}, &down); err != nil {
		return reconcile.Result{}, err
	}
	v := down.Data["v"]
	r.e.log.reconcile(r.name, project, v)
	ctx = r.pause.maybe(ctx, project, v)
	var c client.Client = r.api
	if h != nil {
		fc, err := fenced.NewClient(r.api, h)
		if err != nil {
			return reconcile.Result{}, err
		}
		c = fc
	}
	// Write the value read, retrying on a conflict with a fresh read of
	// the record, as many controllers do.
	var rec corev1.ConfigMap
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		rec = corev1.ConfigMap{}
		err := r.api.Get(ctx, client.ObjectKey{Namespace: r.e.down, Name: "dns-record-" + project}, &rec)
		switch {
		case apierrors.IsNotFound(err):
			rec = corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: r.e.down, Name: "dns-record-" + project}, Data: map[string]string{"v": v, "by": r.name}}
			return c.Create(ctx, &rec)
		case err != nil:
			return err
		}
		rec.Data = map[string]string{"v": v, "by": r.name}
		return c.Update(ctx, &rec)
	})
	rv, _ := strconv.ParseInt(rec.ResourceVersion, 10, 64)
	tok, _, _ := token.FromAnnotations(rec.Annotations)
	r.e.log.wrote(write{replica: r.name, project: project, value: v, rv: rv, tok: tok, err: err})
	return reconcile.Result{}, err
}

// waitFor polls cond every 20ms until it holds or d passes.
func waitFor(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// quiet waits up to d for the replicas' skip counts to stay unchanged for
// settle, and reports whether they did.
func quiet(rs []*replica, settle, d time.Duration) bool {
	total := func() (n int64) {
		for _, r := range rs {
			n += r.gated.Skipped()
		}
		return n
	}
	last, since := total(), time.Now()
	return waitFor(d, func() bool {
		if n := total(); n != last {
			last, since = n, time.Now()
		}
		return time.Since(since) >= settle
	})
}

// engagedBy returns the replicas whose runnables are engaged for project now.
func engagedBy(rs []*replica, project string) []*replica {
	var out []*replica
	for _, r := range rs {
		if r.engaged.isLive(multicluster.ClusterName(project)) {
			out = append(out, r)
		}
	}
	return out
}

// settle waits until every project is engaged by exactly one replica,
// which owns it (fencer's: Owns; mcr's: its HRW over a peer view that
// has every replica), and no engagement has changed for a second, and
// returns the owner of each.
func settle(t *testing.T, rs []*replica, projects []string, d time.Duration) map[string]*replica {
	t.Helper()
	var last map[string]*replica
	var since time.Time
	hrw := mcsharder.NewHRW()
	ok := waitFor(d, func() bool {
		cur := map[string]*replica{}
		for _, p := range projects {
			by := engagedBy(rs, p)
			if len(by) != 1 {
				last = nil
				return false
			}
			o := by[0]
			if o.coord != nil {
				if _, owns := o.coord.Owns(multicluster.ClusterName(p)); !owns {
					last = nil
					return false
				}
			}
			if o.peers != nil {
				if snap := o.peers.Snapshot(); len(snap) != len(rs) || !hrw.ShouldOwn(p, snap, o.peers.Self()) {
					last = nil
					return false
				}
			}
			cur[p] = o
		}
		if !maps.Equal(cur, last) {
			last, since = cur, time.Now()
			return false
		}
		return time.Since(since) >= time.Second
	})
	require.True(t, ok, "the projects were not each engaged by their owner, stably, within %v", d)
	return last
}

// requireNoWriteSince fails t if a write of project's record landed
// after (with a greater resourceVersion than) rv.
func requireNoWriteSince(t *testing.T, l *writeLog, project string, rv int64) {
	t.Helper()
	for _, w := range l.all() {
		if w.project == project && w.err == nil && w.rv > rv {
			t.Fatalf("%s wrote %q to %s at %d after %d", w.replica, w.value, project, w.rv, rv)
		}
	}
}
