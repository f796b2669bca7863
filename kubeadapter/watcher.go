package kubeadapter

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/watch"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"

	"github.com/fencer-dev/fencer/kubeadapter/internal/leaserecord"
	"github.com/fencer-dev/fencer/kubeadapter/internal/watcherr"
	"github.com/fencer-dev/fencer/token"
)

// Watcher is the one Lease watcher of a process. It lists and watches
// coordination.k8s.io/v1 Leases, in all namespaces or in those given to
// WatchNamespaces, and serves every Elector configured with it
// (Config.Watcher): each acquisition registers with it, and the Watcher
// ends the acquisition, cancelling its Context, as soon as an event shows
// that the Lease
//
//   - was deleted (ErrLeaseDeleted),
//   - was replaced by an object with another UID (ErrLeaseReplaced), or
//   - names another holder or another acquisition: another holderIdentity,
//     including none, or another leaseTransitions (ErrLeaseTaken).
//
// The holder's own renewals change only resourceVersion and renewTime, so
// they end nothing. Events older than the acquiring write (by
// resourceVersion, which Kubernetes 1.35 and later let clients compare as
// integers) are ignored, so a late event about a previous holder or a
// previous incarnation of the Lease never ends a newer acquisition.
// Timestamps in the record are never read: a renewTime in the future
// extends nothing.
//
// The Watcher also feeds the metrics (WithRegisterer). It only reads:
// list and watch on Leases, in every namespace it watches.
//
// What it does not guarantee: a Watcher sees a change only when the event
// reaches it, so it narrows the window in which a superseded holder keeps
// working; it does not close it. While the watch is broken (the API server
// is unreachable, or the process is paused), nothing is seen, and the Held
// ends only at its renew deadline (fail closed) or when a renewal finds
// the loss. Fenced writes, not the Watcher, are what make a superseded
// holder's writes fail. A Watcher that is not running (Start) ends
// nothing.
//
// Every Lease in scope is kept in memory and every event about one is
// processed, including those of Leases no Elector uses (such as node
// heartbeats in kube-node-lease when watching all namespaces); prefer
// WatchNamespaces.
type Watcher struct {
	leases     coordinationv1client.LeasesGetter
	namespaces []string // nil means all namespaces
	clock      clock.Clock
	metrics    *metrics
	started    atomic.Bool

	// mu guards scopes, regs and subs.
	mu     sync.Mutex
	scopes map[string]*scope // by watched namespace, "" for all
	regs   map[string]map[*Held]*coordinationv1.Lease
	// subs are the channels of Subscribe, each signalled (without
	// blocking, capacity 1) after every applied list or event.
	subs map[chan struct{}]bool
}

// scope is what one list-and-watch stream has seen.
type scope struct {
	// listed is set once the first list has been applied; before it,
	// Leases seen are not counted as acquisitions.
	listed bool
	// progress is the resourceVersion up to which the stream has been
	// applied: every change with a resourceVersion at most progress is
	// reflected in leases.
	progress int64
	// leases holds the last seen object of each existing Lease, by
	// "namespace/name".
	leases map[string]seen
}

type seen struct {
	lease *coordinationv1.Lease
	rv    int64
}

// WatcherOption configures a Watcher.
type WatcherOption func(*Watcher) error

// WatchNamespaces restricts the Watcher to the given namespaces, with one
// watch per namespace, which needs list and watch on Leases only there (a
// namespaced Role). Without it the Watcher watches Leases in all
// namespaces with one watch, which needs a ClusterRole. Electors whose
// Lease is in a namespace the Watcher does not watch are refused by
// NewElector.
func WatchNamespaces(namespaces ...string) WatcherOption {
	return func(w *Watcher) error {
		if len(namespaces) == 0 {
			return &ConfigError{Field: "WatchNamespaces", Reason: "must name at least one namespace"}
		}
		for _, ns := range namespaces {
			if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
				return &ConfigError{Field: "WatchNamespaces", Reason: fmt.Sprintf("%q is not a DNS-1123 label", ns)}
			}
			if !slices.Contains(w.namespaces, ns) {
				w.namespaces = append(w.namespaces, ns)
			}
		}
		return nil
	}
}

// WithRegisterer registers the Watcher's metrics (see the Metric
// constants) with reg. Electors configured with the Watcher report their
// renewals and acquisitions through it. A registerer takes one Watcher's
// metrics only.
func WithRegisterer(reg prometheus.Registerer) WatcherOption {
	return func(w *Watcher) error {
		if reg == nil {
			return &ConfigError{Field: "WithRegisterer", Reason: "must not be nil"}
		}
		m, err := newMetrics(reg)
		if err != nil {
			return err
		}
		w.metrics = m
		return nil
	}
}

// WithWatcherClock sets the clock that times the self-fence latency. The
// default is the real clock. It does not time retries: those are client-go's
// reflector backoff, on the real clock.
func WithWatcherClock(c clock.Clock) WatcherOption {
	return func(w *Watcher) error {
		if c == nil {
			return &ConfigError{Field: "WithWatcherClock", Reason: "must not be nil"}
		}
		w.clock = c
		return nil
	}
}

// NewWatcher returns a Watcher that lists and watches Leases through
// leases (for a clientset, clientset.CoordinationV1()) with client-go's
// reflector, using streaming lists unless leases has an
// IsWatchListSemanticsUnSupported method that returns true (which a fake
// that cannot stream initial events must have). It performs no I/O; Start
// runs it. It returns a *ConfigError for a nil leases or an
// invalid option, and the registerer's error when the metrics cannot be
// registered.
func NewWatcher(leases coordinationv1client.LeasesGetter, opts ...WatcherOption) (*Watcher, error) {
	if leases == nil {
		return nil, &ConfigError{Field: "leases", Reason: "must not be nil"}
	}
	w := &Watcher{
		leases: leases,
		clock:  clock.RealClock{},
		scopes: map[string]*scope{},
		regs:   map[string]map[*Held]*coordinationv1.Lease{},
		subs:   map[chan struct{}]bool{},
	}
	for _, o := range opts {
		if err := o(w); err != nil {
			return nil, err
		}
	}
	for _, ns := range w.scopeNames() {
		w.scopes[ns] = &scope{leases: map[string]seen{}}
	}
	return w, nil
}

// Start lists and watches Leases until ctx is done, then returns nil; it
// returns ErrAlreadyStarted when called a second time. It never returns
// because of API errors: a failed list or watch is logged (with the
// logr.Logger of ctx), counted and retried with client-go's reflector
// backoff, and an expired resourceVersion causes a new list. Start makes
// a Watcher a controller-runtime manager.Runnable.
func (w *Watcher) Start(ctx context.Context) error {
	if !w.started.CompareAndSwap(false, true) {
		return ErrAlreadyStarted
	}
	var wg sync.WaitGroup
	for ns := range w.scopes {
		log := logr.FromContextOrDiscard(ctx).WithValues("namespace", ns)
		r := cache.NewReflectorWithOptions(w.listWatch(ns, log), &coordinationv1.Lease{}, &scopeStore{w: w, ns: ns},
			cache.ReflectorOptions{Name: "fencer-leases", Logger: &log})
		wg.Go(func() { r.RunWithContext(ctx) })
	}
	wg.Wait()
	return nil
}

// NeedLeaderElection returns false: a Watcher must run in every replica,
// leader or not.
func (w *Watcher) NeedLeaderElection() bool { return false }

// watches reports whether the Watcher watches Leases in namespace.
func (w *Watcher) watches(namespace string) bool {
	return w.namespaces == nil || slices.Contains(w.namespaces, namespace)
}

func (w *Watcher) scopeNames() []string {
	if w.namespaces == nil {
		return []string{metav1.NamespaceAll}
	}
	return w.namespaces
}

func (w *Watcher) scopeOf(namespace string) *scope {
	if w.namespaces == nil {
		return w.scopes[metav1.NamespaceAll]
	}
	return w.scopes[namespace]
}

// listWatch lists and watches the Leases of namespace ns (all when ns is
// metav1.NamespaceAll) through w.leases, and counts and logs every failed
// call and every error that ends a watch. It uses streaming lists unless
// w.leases says it does not support them, as client-go's fakes do.
func (w *Watcher) listWatch(ns string, log logr.Logger) cache.ListerWatcher {
	failed := func(op string, err error) {
		kind := WatchFailed
		if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
			kind = WatchExpired
		}
		w.metrics.watchError(kind)
		log.Error(err, "lease "+op+" failed", "kind", kind)
	}
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			list, err := w.leases.Leases(ns).List(ctx, opts)
			if err != nil && ctx.Err() == nil {
				failed("list", err)
			}
			return list, err
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			wi, err := w.leases.Leases(ns).Watch(ctx, opts)
			if err != nil {
				if ctx.Err() == nil {
					failed("watch", err)
				}
				return nil, err
			}
			return watcherr.Report(wi, func(err error) { failed("watch", err) }), nil
		},
	}
	return cache.ToListWatcherWithWatchListSemantics(lw, w.leases)
}

// scopeStore is the store of one scope's reflector: it applies what the
// reflector lists and watches to w, in the order the reflector delivers
// it. Keeping the Watcher's own map as the store, rather than reading an
// informer's event handlers, keeps the list's resourceVersion, against
// which a Lease missing from a relist is compared with each acquisition.
type scopeStore struct {
	w  *Watcher
	ns string
}

var (
	_ cache.ReflectorStore         = (*scopeStore)(nil)
	_ cache.ResourceVersionUpdater = (*scopeStore)(nil)
)

// Add applies a watch event that created a Lease.
func (st *scopeStore) Add(obj any) error { return st.event(obj, false) }

// Update applies a watch event that changed a Lease.
func (st *scopeStore) Update(obj any) error { return st.event(obj, false) }

// Delete applies a watch event that deleted a Lease; the event carries the
// deletion's resourceVersion.
func (st *scopeStore) Delete(obj any) error { return st.event(obj, true) }

func (st *scopeStore) event(obj any, deleted bool) error {
	w := st.w
	at := w.clock.Now()
	l, rv, err := leaseAt(obj)
	if err != nil {
		return err
	}
	w.mu.Lock()
	s := w.scopes[st.ns]
	var ends []ending
	if deleted {
		k := leaseKey(l)
		delete(s.leases, k)
		ends = w.check(k, nil, rv)
	} else {
		ends = w.saw(s, l, rv)
	}
	s.progress = max(s.progress, rv)
	w.mu.Unlock()
	w.finish(ends, at)
	return nil
}

// Replace applies a list (or the initial events of a streaming list) at
// resourceVersion listRV: what it no longer shows was deleted at or
// before listRV.
func (st *scopeStore) Replace(objs []any, listRV string) error {
	w := st.w
	at := w.clock.Now()
	rv, err := parseRV(listRV)
	if err != nil {
		w.metrics.watchError(WatchFailed)
		return err
	}
	leases := make([]*coordinationv1.Lease, 0, len(objs))
	rvs := make([]int64, 0, len(objs))
	for _, obj := range objs {
		l, lrv, err := leaseAt(obj)
		if err != nil {
			w.metrics.watchError(WatchFailed)
			return err
		}
		leases, rvs = append(leases, l), append(rvs, lrv)
	}
	w.mu.Lock()
	s := w.scopes[st.ns]
	var ends []ending
	present := map[string]bool{}
	for i, l := range leases {
		present[leaseKey(l)] = true
		ends = append(ends, w.saw(s, l, rvs[i])...)
	}
	for k := range s.leases {
		if !present[k] {
			delete(s.leases, k)
		}
	}
	s.progress = max(s.progress, rv)
	s.listed = true
	for k := range w.regs {
		if _, ok := s.leases[k]; !ok && w.scopeOf(namespaceOf(k)) == s {
			ends = append(ends, w.check(k, nil, rv)...)
		}
	}
	w.mu.Unlock()
	w.finish(ends, at)
	return nil
}

// UpdateResourceVersion records that the stream has been applied up to
// resourceVersion, which the reflector reports after every event; only a
// bookmark moves it past the events already applied, and then the
// subscribers (Subscribe) are signalled as after an event.
func (st *scopeStore) UpdateResourceVersion(resourceVersion string) {
	rv, err := parseRV(resourceVersion)
	if err != nil {
		return
	}
	w := st.w
	at := w.clock.Now()
	w.mu.Lock()
	s := w.scopes[st.ns]
	moved := rv > s.progress
	s.progress = max(s.progress, rv)
	w.mu.Unlock()
	if moved {
		w.finish(nil, at)
	}
}

// Resync does nothing: the reflector runs without a resync period.
func (*scopeStore) Resync() error { return nil }

// leaseAt returns obj as a Lease and its resourceVersion.
func leaseAt(obj any) (*coordinationv1.Lease, int64, error) {
	l, ok := obj.(*coordinationv1.Lease)
	if !ok {
		return nil, 0, fmt.Errorf("kubeadapter: lease watch: unexpected %T", obj)
	}
	rv, err := parseRV(l.ResourceVersion)
	if err != nil {
		return nil, 0, err
	}
	return l, rv, nil
}

// saw records l, seen at resourceVersion rv, counts it when it is an
// acquisition, and returns the registrations it ends. w.mu is held.
func (w *Watcher) saw(s *scope, l *coordinationv1.Lease, rv int64) []ending {
	k := leaseKey(l)
	prev, had := s.leases[k]
	if had && rv <= prev.rv {
		return nil
	}
	l.ManagedFields = nil
	s.leases[k] = seen{lease: l, rv: rv}
	if holder := leaserecord.Holder(&l.Spec); holder != "" && s.listed {
		if !had || lossReason(prev.lease, l) != nil {
			w.metrics.transition(k)
		}
	}
	return w.check(k, l, rv)
}

// ending is a registration that an event ends.
type ending struct {
	h      *Held
	reason error
	holder string
}

// check compares cur (nil when the Lease does not exist), as of
// resourceVersion rv, with every registration of key whose acquiring write
// rv does not precede, and returns those it ends. w.mu is held.
func (w *Watcher) check(key string, cur *coordinationv1.Lease, rv int64) []ending {
	var ends []ending
	for h, acquired := range w.regs[key] {
		if rv < h.tok.Revision {
			continue
		}
		if reason := lossReason(acquired, cur); reason != nil {
			e := ending{h: h, reason: reason}
			if cur != nil {
				e.holder = leaserecord.Holder(&cur.Spec)
			}
			ends = append(ends, e)
		}
	}
	return ends
}

// finish ends the Helds of ends, outside w.mu, and times each end it
// caused from at, when the cause was an event received at at.
func (w *Watcher) finish(ends []ending, at time.Time) {
	for _, e := range ends {
		if e.h.end(e.reason, e.holder) && !at.IsZero() {
			w.metrics.fenced(w.clock.Since(at))
		}
	}
	if at.IsZero() {
		return
	}
	w.mu.Lock()
	for c := range w.subs {
		select {
		case c <- struct{}{}:
		default:
		}
	}
	w.mu.Unlock()
}

// Subscribe returns a channel that is signalled after every list or
// event the Watcher applies, and after a bookmark that moves its
// progress, and a function that stops the signals. The channel has a
// capacity of one and is signalled without blocking, so a burst of
// changes may come as one signal: read the Leases again (Labelled) on
// each, rather than counting signals. It is how a component that keeps
// its own records in Leases, such as a shard.Sharder, learns of a change
// at once rather than at its next poll.
//
// What it does not guarantee: a signal for every change, or any signal
// while the Watcher is not running or its watch is broken.
func (w *Watcher) Subscribe() (<-chan struct{}, func()) {
	c := make(chan struct{}, 1)
	w.mu.Lock()
	w.subs[c] = true
	w.mu.Unlock()
	return c, func() {
		w.mu.Lock()
		delete(w.subs, c)
		w.mu.Unlock()
	}
}

// Labelled returns the Leases of namespace that carry the label
// key=value, as the Watcher last saw them; progress, the resourceVersion
// up to which the Watcher has applied the stream of namespace (every
// change at or below it is reflected); and synced, whether the first
// list of namespace has been applied. Before that, or for a namespace
// the Watcher does not watch, synced is false and the Leases are not
// to be trusted as the whole set. The returned objects are shared with
// the Watcher and must not be modified; their order is unspecified.
//
// What it does not guarantee: that the Leases are current. They are as
// recent as the last event that reached the Watcher; a write of the
// caller's own is seen only once its event arrives (compare its
// resourceVersion with progress).
func (w *Watcher) Labelled(namespace, key, value string) (leases []*coordinationv1.Lease, progress int64, synced bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.scopeOf(namespace)
	if s == nil {
		return nil, 0, false
	}
	var out []*coordinationv1.Lease
	for _, seen := range s.leases {
		if seen.lease.Namespace == namespace && seen.lease.Labels[key] == value {
			out = append(out, seen.lease)
		}
	}
	return out, s.progress, s.listed
}

// RecordLeaseWrite counts one Lease write of kind (WriteRenew, WriteAssign
// or WriteTombstone) that the API server accepted, in MetricLeaseWrites,
// for a component that writes Leases of its own through this process's
// Watcher, such as a shard.Sharder's shard Lease writes and tombstones,
// so that the metric stays the process's whole Lease write load. Electors
// configured with the Watcher count their writes themselves. It records
// nothing when the Watcher has no metrics (WithRegisterer).
func (w *Watcher) RecordLeaseWrite(kind string) {
	w.metrics.wrote(kind)
}

// register makes the Watcher watch over h, acquired by the write that
// returned acquired. What the Watcher has already seen of the Lease is
// checked at once: a change it applied before h registered ends h too.
func (w *Watcher) register(h *Held, acquired *coordinationv1.Lease) {
	k := leaseKey(acquired)
	w.mu.Lock()
	if w.regs[k] == nil {
		w.regs[k] = map[*Held]*coordinationv1.Lease{}
	}
	w.regs[k][h] = acquired
	var ends []ending
	s := w.scopeOf(acquired.Namespace)
	if cur, ok := s.leases[k]; ok {
		ends = w.check(k, cur.lease, cur.rv)
	} else {
		ends = w.check(k, nil, s.progress)
	}
	w.mu.Unlock()
	w.finish(ends, time.Time{})
}

// unregister stops watching over h.
func (w *Watcher) unregister(h *Held) {
	k := h.tok.Lease
	w.mu.Lock()
	delete(w.regs[k], h)
	if len(w.regs[k]) == 0 {
		delete(w.regs, k)
	}
	w.mu.Unlock()
}

func leaseKey(l *coordinationv1.Lease) string { return l.Namespace + "/" + l.Name }

func namespaceOf(key string) string {
	ns, _, _ := strings.Cut(key, "/")
	return ns
}

// parseRV parses a resourceVersion as the integer Kubernetes 1.35 and
// later let clients compare.
func parseRV(rv string) (int64, error) {
	n, err := token.ParseRevision(rv)
	if err != nil {
		return 0, fmt.Errorf("kubeadapter: resourceVersion %q: %w", rv, err)
	}
	return n, nil
}
