package mcr_test

import (
	"context"
	"fmt"
	"net/http"
	"sync"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/cluster"
	"sigs.k8s.io/multicluster-runtime/pkg/multicluster"
)

// nsProvider is a multicluster-runtime provider whose clusters are
// namespaces of one API server: each cluster is a controller-runtime
// cluster.Cluster whose cache sees that namespace only. (mcr's own
// providers/namespace does not compile against controller-runtime
// v0.25.2.) Remove ends a cluster's engagement, as a provider does when a
// cluster goes away.
type nsProvider struct {
	cfg  *rest.Config
	http *http.Client
	init []string

	mu       sync.Mutex
	clusters map[multicluster.ClusterName]*nsCluster
	wg       sync.WaitGroup
}

type nsCluster struct {
	cl     cluster.Cluster
	cancel context.CancelFunc
}

var _ multicluster.ProviderRunnable = (*nsProvider)(nil)

func newNSProvider(cfg *rest.Config, namespaces ...string) (*nsProvider, error) {
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, err
	}
	return &nsProvider{cfg: cfg, http: hc, init: namespaces, clusters: map[multicluster.ClusterName]*nsCluster{}}, nil
}

// Start engages a cluster for each namespace and returns when ctx ends
// and every cluster has stopped.
func (p *nsProvider) Start(ctx context.Context, aware multicluster.Aware) error {
	defer p.wg.Wait()
	for _, ns := range p.init {
		if err := p.add(ctx, aware, ns); err != nil {
			return err
		}
	}
	<-ctx.Done()
	return nil
}

func (p *nsProvider) add(ctx context.Context, aware multicluster.Aware, ns string) error {
	cl, err := cluster.New(p.cfg, func(o *cluster.Options) {
		o.Scheme = clientgoscheme.Scheme
		o.HTTPClient = p.http
		o.Cache.DefaultNamespaces = map[string]cache.Config{ns: {}}
	})
	if err != nil {
		return fmt.Errorf("cluster %s: %w", ns, err)
	}
	cctx, cancel := context.WithCancel(ctx)
	p.wg.Go(func() { _ = cl.Start(cctx) })
	p.mu.Lock()
	p.clusters[multicluster.ClusterName(ns)] = &nsCluster{cl: cl, cancel: cancel}
	p.mu.Unlock()
	return aware.Engage(cctx, multicluster.ClusterName(ns), cl)
}

// Remove ends the cluster's engagement and forgets it.
func (p *nsProvider) Remove(name multicluster.ClusterName) {
	p.mu.Lock()
	c := p.clusters[name]
	delete(p.clusters, name)
	p.mu.Unlock()
	if c != nil {
		c.cancel()
	}
}

func (p *nsProvider) Get(_ context.Context, name multicluster.ClusterName) (cluster.Cluster, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c := p.clusters[name]; c != nil {
		return c.cl, nil
	}
	return nil, multicluster.ErrClusterNotFound
}

func (p *nsProvider) IndexField(context.Context, client.Object, string, client.IndexerFunc) error {
	return nil
}

// freezable is a Lease client whose watches hold back the events of
// chosen Leases while frozen and deliver them, in order, when thawed: the
// member that uses it does not learn that those Leases changed, as a
// paused process does not. Its other calls pass through.
type freezable struct {
	coordinationv1client.LeasesGetter

	mu     sync.Mutex
	names  map[string]bool
	thawed chan struct{}
}

func (f *freezable) Leases(ns string) coordinationv1client.LeaseInterface {
	return frozenLeases{LeaseInterface: f.LeasesGetter.Leases(ns), f: f}
}

// freeze holds back the events of the Leases named.
func (f *freezable) freeze(names ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.names = map[string]bool{}
	for _, n := range names {
		f.names[n] = true
	}
	f.thawed = make(chan struct{})
}

// thaw delivers the held events and holds no more.
func (f *freezable) thaw() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.names != nil {
		f.names = nil
		close(f.thawed)
	}
}

// state returns whether ev is held back, and the channel closed at the
// next thaw (nil when not frozen).
func (f *freezable) state(ev *watch.Event) (bool, <-chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.names == nil {
		return false, nil
	}
	if ev == nil {
		return false, f.thawed
	}
	l, ok := ev.Object.(*coordinationv1.Lease)
	return ok && f.names[l.Name], f.thawed
}

type frozenLeases struct {
	coordinationv1client.LeaseInterface
	f *freezable
}

func (l frozenLeases) Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	w, err := l.LeaseInterface.Watch(ctx, opts)
	if err != nil {
		return nil, err
	}
	fw := &frozenWatch{inner: w, f: l.f, out: make(chan watch.Event), stop: make(chan struct{})}
	go fw.run()
	return fw, nil
}

type frozenWatch struct {
	inner watch.Interface
	f     *freezable
	out   chan watch.Event
	stop  chan struct{}
	once  sync.Once
}

func (w *frozenWatch) Stop() {
	w.once.Do(func() { close(w.stop) })
	w.inner.Stop()
}

func (w *frozenWatch) ResultChan() <-chan watch.Event { return w.out }

func (w *frozenWatch) run() {
	defer close(w.out)
	var held []watch.Event
	send := func(ev watch.Event) bool {
		select {
		case w.out <- ev:
			return true
		case <-w.stop:
			return false
		}
	}
	for {
		_, thawed := w.f.state(nil)
		if thawed == nil && len(held) > 0 {
			for _, ev := range held {
				if !send(ev) {
					return
				}
			}
			held = nil
		}
		select {
		case ev, ok := <-w.inner.ResultChan():
			if !ok {
				return
			}
			if hold, _ := w.f.state(&ev); hold {
				held = append(held, ev)
				continue
			}
			if !send(ev) {
				return
			}
		case <-thawed:
		case <-w.stop:
			return
		}
	}
}
