package kubeadapter

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/fencer-dev/fencer/kubeadapter/internal/leaserecord"
	"github.com/fencer-dev/fencer/token"
)

// watchedLeases is a fakeLeases whose list reports a resourceVersion and
// whose watch the test drives: every Watch call gets a new fake watch,
// and nothing reaches the Watcher unless the test sends it.
type watchedLeases struct {
	*fakeLeases
	wmu     sync.Mutex
	watches []*watch.RaceFreeFakeWatcher
	down    bool
}

func newWatchedLeases(t *testing.T, objs ...runtime.Object) *watchedLeases {
	t.Helper()
	wl := &watchedLeases{fakeLeases: newFakeLeases(t, objs...)}
	f := wl.fakeLeases
	wl.PrependReactor("list", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if wl.isDown() {
			return true, nil, apierrors.NewServiceUnavailable("injected")
		}
		f.Mu.Lock()
		defer f.Mu.Unlock()
		objs, err := f.Tracker().List(leasesGVR, coordinationv1.SchemeGroupVersion.WithKind("Lease"), a.GetNamespace())
		if err != nil {
			return true, nil, err
		}
		list := objs.(*coordinationv1.LeaseList)
		list.ResourceVersion = strconv.FormatInt(f.RV, 10)
		return true, list, nil
	})
	wl.PrependWatchReactor("leases", func(k8stesting.Action) (bool, watch.Interface, error) {
		wl.wmu.Lock()
		defer wl.wmu.Unlock()
		if wl.down {
			return true, nil, apierrors.NewServiceUnavailable("injected")
		}
		fw := watch.NewRaceFreeFake()
		wl.watches = append(wl.watches, fw)
		return true, fw, nil
	})
	return wl
}

func (wl *watchedLeases) isDown() bool {
	wl.wmu.Lock()
	defer wl.wmu.Unlock()
	return wl.down
}

// setDown makes every Lease call fail, as when the API server is
// unreachable, and breaks the current watch.
func (wl *watchedLeases) setDown(t *testing.T) {
	t.Helper()
	fw := wl.current(t)
	wl.wmu.Lock()
	wl.down = true
	wl.wmu.Unlock()
	wl.SetFailing(true)
	fw.Stop()
}

// current waits for the Watcher's open watch and returns it.
func (wl *watchedLeases) current(t *testing.T) *watch.RaceFreeFakeWatcher {
	t.Helper()
	var fw *watch.RaceFreeFakeWatcher
	require.Eventually(t, func() bool {
		wl.wmu.Lock()
		defer wl.wmu.Unlock()
		if n := len(wl.watches); n > 0 && !wl.watches[n-1].IsStopped() {
			fw = wl.watches[n-1]
			return true
		}
		return false
	}, 5*time.Second, time.Millisecond, "the watcher did not open a watch")
	return fw
}

// modify changes the stored Lease as another writer would and sends the
// event.
func (wl *watchedLeases) modify(t *testing.T, change func(*coordinationv1.Lease)) {
	t.Helper()
	fw := wl.current(t)
	wl.edit(t, change)
	fw.Modify(wl.get(t))
}

// remove deletes the Lease and sends the event, which carries the
// deletion's resourceVersion as the API server's does.
func (wl *watchedLeases) remove(t *testing.T) {
	t.Helper()
	fw := wl.current(t)
	l := wl.get(t)
	wl.Mu.Lock()
	err := wl.Tracker().Delete(leasesGVR, "ns", "fence")
	wl.RV++
	l.ResourceVersion = strconv.FormatInt(wl.RV, 10)
	wl.Mu.Unlock()
	require.NoError(t, err)
	fw.Delete(l)
}

// recreate creates the Lease, with a new UID, naming holder, and sends
// the event. A Lease that still exists is deleted first, without an event,
// as if the watch had missed the delete.
func (wl *watchedLeases) recreate(t *testing.T, holder string) {
	t.Helper()
	fw := wl.current(t)
	l := heldLease(holder, 0, time.Now())
	wl.Mu.Lock()
	err := wl.Tracker().Delete(leasesGVR, "ns", "fence")
	if apierrors.IsNotFound(err) {
		err = nil
	}
	wl.RV++
	l.ResourceVersion = strconv.FormatInt(wl.RV, 10)
	l.UID = types.UID("uid-" + l.ResourceVersion)
	if err == nil {
		err = wl.Tracker().Create(leasesGVR, l, "ns")
	}
	wl.Mu.Unlock()
	require.NoError(t, err)
	fw.Add(l.DeepCopy())
}

// selfFenceRig is an Elector with a running Watcher on a watchedLeases and
// a fake clock that the test never steps unless it says so.
type selfFenceRig struct {
	clk *clocktesting.FakeClock
	wl  *watchedLeases
	w   *Watcher
	e   *Elector
	reg *prometheus.Registry
}

func newSelfFenceRig(t *testing.T, objs ...runtime.Object) *selfFenceRig {
	t.Helper()
	r := &selfFenceRig{
		clk: clocktesting.NewFakeClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)),
		wl:  newWatchedLeases(t, objs...),
		reg: prometheus.NewPedanticRegistry(),
	}
	var err error
	r.w, err = NewWatcher(r.wl.CoordinationV1(), WatchNamespaces("ns"), WithWatcherClock(r.clk), WithRegisterer(r.reg))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { assert.NoError(t, r.w.Start(ctx)) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	cfg := testConfig(r.clk)
	cfg.Watcher = r.w
	r.e, err = NewElector(r.wl.CoordinationV1(), cfg)
	require.NoError(t, err)
	r.wl.current(t) // listed and watching
	return r
}

// acquire acquires the Lease and starts the active callback on the
// Held's context; the returned channel yields the cause the callback saw.
func (r *selfFenceRig) acquire(t *testing.T) (*Held, <-chan error) {
	t.Helper()
	h, err := r.e.TryAcquire(context.Background())
	require.NoError(t, err)
	t.Cleanup(func() { _ = h.Release(context.Background()) })
	seen := make(chan error, 1)
	go func() {
		<-h.Context().Done()
		seen <- context.Cause(h.Context())
	}()
	return h, seen
}

// requireCancelled asserts that the active callback was cancelled for
// want without the fake clock moving: by the watch event, not by a
// renewal or the renew deadline.
func (r *selfFenceRig) requireCancelled(t *testing.T, seen <-chan error, want error) {
	t.Helper()
	start := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	select {
	case err := <-seen:
		require.ErrorIs(t, err, want)
		require.ErrorIs(t, err, token.ErrNotHeld)
	case <-time.After(5 * time.Second):
		t.Fatalf("the active callback was not cancelled by the watch event (want %v)", want)
	}
	require.Equal(t, start, r.clk.Now(), "the clock moved")
}

// applied waits until the Watcher has applied every event sent so far.
func (r *selfFenceRig) applied(t *testing.T) {
	t.Helper()
	r.wl.Mu.Lock()
	want := r.wl.RV
	r.wl.Mu.Unlock()
	require.Eventually(t, func() bool {
		r.w.mu.Lock()
		defer r.w.mu.Unlock()
		return r.w.scopes["ns"].progress >= want
	}, 5*time.Second, time.Millisecond, "the watcher did not apply the events")
}

func histogramCount(t *testing.T, g prometheus.Gatherer, name string) uint64 {
	t.Helper()
	mfs, err := g.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetHistogram().GetSampleCount()
		}
	}
	return 0
}

func otherHolder(holder string) func(*coordinationv1.Lease) {
	return func(l *coordinationv1.Lease) {
		n := *l.Spec.LeaseTransitions + 1
		l.Spec.HolderIdentity, l.Spec.LeaseTransitions = &holder, &n
	}
}

// TestWatcherSelfFences reproduces each loss while the active callback runs
// and checks that the watch event alone cancels it, with the reason, and
// counts and times the self-fence. No case steps the clock, so neither a
// renewal nor the renew deadline can be what ended the Held: an Elector
// that detects loss only by renewing fails every case.
func TestWatcherSelfFences(t *testing.T) {
	const self = "<self>"
	for _, tc := range []struct {
		name   string
		event  func(*testing.T, *selfFenceRig, *Held)
		want   error
		reason string
		holder string
	}{
		{"deleted", func(t *testing.T, r *selfFenceRig, _ *Held) { r.wl.remove(t) }, ErrLeaseDeleted, ReasonDeleted, ""},
		{"replaced for another holder", func(t *testing.T, r *selfFenceRig, _ *Held) {
			r.wl.remove(t)
			r.wl.recreate(t, "other")
		}, ErrLeaseDeleted, ReasonDeleted, ""},
		{"replaced, delete not seen", func(t *testing.T, r *selfFenceRig, _ *Held) {
			// A watch that skipped the delete shows the new UID only.
			r.wl.recreate(t, "other")
		}, ErrLeaseReplaced, ReasonReplaced, "other"},
		{"recreated naming this holder", func(t *testing.T, r *selfFenceRig, _ *Held) {
			r.wl.recreate(t, r.e.Identity())
		}, ErrLeaseReplaced, ReasonReplaced, self},
		{"another holder", func(t *testing.T, r *selfFenceRig, _ *Held) { r.wl.modify(t, otherHolder("other")) }, ErrLeaseTaken, ReasonTaken, "other"},
		{"another holder, renewTime in the future", func(t *testing.T, r *selfFenceRig, _ *Held) {
			r.wl.modify(t, func(l *coordinationv1.Lease) {
				otherHolder("other")(l)
				future := metav1.NewMicroTime(r.clk.Now().Add(time.Hour))
				l.Spec.RenewTime, l.Spec.AcquireTime = &future, &future
			})
		}, ErrLeaseTaken, ReasonTaken, "other"},
		{"released by another writer", func(t *testing.T, r *selfFenceRig, _ *Held) {
			r.wl.modify(t, func(l *coordinationv1.Lease) { none := ""; l.Spec.HolderIdentity = &none })
		}, ErrLeaseTaken, ReasonTaken, ""},
		{"re-acquired under this identity", func(t *testing.T, r *selfFenceRig, _ *Held) {
			// Same holder, leaseTransitions moved on: another acquisition.
			r.wl.modify(t, func(l *coordinationv1.Lease) { n := *l.Spec.LeaseTransitions + 1; l.Spec.LeaseTransitions = &n })
		}, ErrLeaseTaken, ReasonTaken, self},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newSelfFenceRig(t)
			h, seen := r.acquire(t)
			require.Equal(t, 1.0, testutil.ToFloat64(r.w.metrics.leader.WithLabelValues("ns/fence")))
			tc.event(t, r, h)
			r.requireCancelled(t, seen, tc.want)
			var le *LostError
			require.ErrorAs(t, h.Err(), &le)
			require.Equal(t, h.Token(), le.Token)
			if tc.holder == self {
				tc.holder = r.e.Identity()
			}
			require.Equal(t, tc.holder, le.Holder)

			require.Equal(t, 0.0, testutil.ToFloat64(r.w.metrics.leader.WithLabelValues("ns/fence")))
			require.Equal(t, 1.0, testutil.ToFloat64(r.w.metrics.selfFence.WithLabelValues(tc.reason)))
			require.Eventually(t, func() bool {
				r.w.mu.Lock()
				defer r.w.mu.Unlock()
				return len(r.w.regs) == 0 && histogramCount(t, r.reg, MetricSelfFenceLatency) == 1
			}, 5*time.Second, time.Millisecond, "the ended Held did not unregister, or its self-fence was not timed")
		})
	}
}

// TestWatcherIgnores checks events that must not end the Held: the
// holder's own renewal, an edit of another field, and events older than
// the acquisition. Each is followed by a loss that ends the Held, whose
// reason shows that the first event did not.
func TestWatcherIgnores(t *testing.T) {
	stale := func(typ watch.EventType, holder string) func(*testing.T, *selfFenceRig, *Held) {
		return func(t *testing.T, r *selfFenceRig, h *Held) {
			l := heldLease(holder, 3, r.clk.Now())
			l.UID = "uid-old"
			l.ResourceVersion = strconv.FormatInt(h.Token().Revision-1, 10)
			r.wl.current(t).Action(typ, l)
		}
	}
	for _, tc := range []struct {
		name  string
		first func(*testing.T, *selfFenceRig, *Held)
		then  func(*testing.T, *selfFenceRig)
		want  error
	}{
		{"own renewal", func(t *testing.T, r *selfFenceRig, _ *Held) {
			r.wl.modify(t, func(l *coordinationv1.Lease) {
				now := metav1.NewMicroTime(r.clk.Now())
				l.Spec.RenewTime = &now
			})
		}, func(t *testing.T, r *selfFenceRig) { r.wl.remove(t) }, ErrLeaseDeleted},
		{"label added", func(t *testing.T, r *selfFenceRig, _ *Held) {
			r.wl.modify(t, func(l *coordinationv1.Lease) { l.Labels = map[string]string{"a": "b"} })
		}, func(t *testing.T, r *selfFenceRig) { r.wl.remove(t) }, ErrLeaseDeleted},
		{"earlier holder's record", stale(watch.Modified, "earlier"),
			func(t *testing.T, r *selfFenceRig) { r.wl.remove(t) }, ErrLeaseDeleted},
		{"delete of an earlier incarnation", stale(watch.Deleted, "earlier"),
			func(t *testing.T, r *selfFenceRig) { r.wl.modify(t, otherHolder("other")) }, ErrLeaseTaken},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newSelfFenceRig(t)
			h, seen := r.acquire(t)
			tc.first(t, r, h)
			tc.then(t, r)
			r.requireCancelled(t, seen, tc.want)
		})
	}
}

// TestWatcherRelist checks that a watch that expired (410 Gone) is
// followed by a list, and that what the list shows or no longer shows ends
// the Held: a Lease deleted, or deleted and recreated, while the watch was
// down.
func TestWatcherRelist(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(*testing.T, *watchedLeases)
		want   error
	}{
		{"deleted", func(t *testing.T, wl *watchedLeases) {
			wl.Mu.Lock()
			err := wl.Tracker().Delete(leasesGVR, "ns", "fence")
			wl.RV++
			wl.Mu.Unlock()
			require.NoError(t, err)
		}, ErrLeaseDeleted},
		{"replaced", func(t *testing.T, wl *watchedLeases) {
			wl.Mu.Lock()
			err := wl.Tracker().Delete(leasesGVR, "ns", "fence")
			wl.RV++
			l := heldLease("other", 0, time.Now())
			l.ResourceVersion, l.UID = strconv.FormatInt(wl.RV, 10), "uid-new"
			if err == nil {
				err = wl.Tracker().Create(leasesGVR, l, "ns")
			}
			wl.Mu.Unlock()
			require.NoError(t, err)
		}, ErrLeaseReplaced},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newSelfFenceRig(t)
			_, seen := r.acquire(t)
			tc.change(t, r.wl)
			r.wl.current(t).Error(&apierrors.NewResourceExpired("too old").ErrStatus)
			r.requireCancelled(t, seen, tc.want)
			require.Equal(t, 1.0, testutil.ToFloat64(r.w.metrics.watchErrors.WithLabelValues(WatchExpired)))
			require.Zero(t, testutil.ToFloat64(r.w.metrics.watchErrors.WithLabelValues(WatchFailed)))
		})
	}
}

// TestWatcherStaleRelist checks that a relist served at a resourceVersion
// older than the acquisition, which does not show the Lease yet, ends
// nothing: a Lease missing from a list is compared with the acquisition
// at the list's resourceVersion, not treated as deleted now. The loss
// that follows ends the Held, and its reason shows that the list did not.
func TestWatcherStaleRelist(t *testing.T) {
	r := newSelfFenceRig(t)
	h, seen := r.acquire(t)
	var once sync.Once
	r.wl.PrependReactor("list", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
		handled := false
		once.Do(func() { handled = true })
		if !handled {
			return false, nil, nil
		}
		list := &coordinationv1.LeaseList{}
		list.ResourceVersion = strconv.FormatInt(h.Token().Revision-1, 10)
		return true, list, nil
	})
	fw := r.wl.current(t)
	fw.Error(&apierrors.NewResourceExpired("too old").ErrStatus)
	require.Eventually(t, func() bool {
		return r.wl.current(t) != fw
	}, 5*time.Second, time.Millisecond, "the watcher did not relist and watch again")
	require.NoError(t, h.Err(), "the stale list ended the Held")
	r.wl.modify(t, otherHolder("other"))
	r.requireCancelled(t, seen, ErrLeaseTaken)
}

// TestWatcherSeenBeforeRegistration checks that a loss the Watcher applied
// between the acquiring write and the Held's registration still ends the
// Held: the registration is checked against what the Watcher has seen.
func TestWatcherSeenBeforeRegistration(t *testing.T) {
	r := newSelfFenceRig(t)
	fw := r.wl.current(t)
	// Right after the create is stored and before TryAcquire registers,
	// the Lease is deleted and the Watcher applies the event.
	r.wl.PrependReactor("create", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		f := r.wl.fakeLeases
		f.Mu.Lock()
		l := a.(k8stesting.CreateAction).GetObject().(*coordinationv1.Lease).DeepCopy()
		f.RV++
		l.ResourceVersion = strconv.FormatInt(f.RV, 10)
		l.UID = types.UID("uid-" + l.ResourceVersion)
		deleted := l.DeepCopy()
		f.RV++
		deleted.ResourceVersion = strconv.FormatInt(f.RV, 10)
		f.Mu.Unlock()
		fw.Delete(deleted)
		require.Eventually(t, func() bool {
			r.w.mu.Lock()
			defer r.w.mu.Unlock()
			return r.w.scopes["ns"].progress == f.RV
		}, 5*time.Second, time.Millisecond)
		return true, l, nil
	})
	_, seen := r.acquire(t)
	r.requireCancelled(t, seen, ErrLeaseDeleted)
}

// TestWatcherUnreachableFailsClosed checks that when the API server cannot
// be reached, renewals and the watch failing, the Held ends exactly at the
// renew deadline (fail closed, before any other candidate may take over)
// and not earlier: a broken watch is not a loss.
func TestWatcherUnreachableFailsClosed(t *testing.T) {
	r := newSelfFenceRig(t)
	cfg := testConfig(r.clk)
	h, seen := r.acquire(t)
	waitForRenewLoop(t, r.clk)
	r.wl.setDown(t)
	require.Eventually(t, func() bool {
		return testutil.ToFloat64(r.w.metrics.watchErrors.WithLabelValues(WatchFailed)) >= 1
	}, 5*time.Second, time.Millisecond, "the broken watch is not counted")
	r.clk.Step(cfg.RetryPeriod) // the renewal at +2s fails
	require.Eventually(t, func() bool {
		return testutil.ToFloat64(r.w.metrics.renewalFailures.WithLabelValues("ns/fence")) == 1
	}, 5*time.Second, time.Millisecond, "no renewal attempt")
	r.clk.Step(cfg.RenewDeadline - cfg.RetryPeriod - time.Millisecond)
	require.NoError(t, h.Err(), "ended before the renew deadline")
	r.clk.Step(time.Millisecond)
	select {
	case err := <-seen:
		require.ErrorIs(t, err, ErrRenewDeadline)
	case <-time.After(5 * time.Second):
		t.Fatal("not cancelled at the renew deadline")
	}
	require.Equal(t, 1.0, testutil.ToFloat64(r.w.metrics.selfFence.WithLabelValues(ReasonRenewDeadline)))
	require.Equal(t, uint64(0), histogramCount(t, r.reg, MetricSelfFenceLatency), "a deadline is not a watch event")
}

// TestWatcherFutureRenewTimeExtendsNothing checks that a record that still
// names this acquisition but carries a renewTime an hour in the future (a
// writer with a skewed clock) neither ends the Held nor extends it: with
// renewals failing it still ends exactly at the renew deadline.
func TestWatcherFutureRenewTimeExtendsNothing(t *testing.T) {
	r := newSelfFenceRig(t)
	cfg := testConfig(r.clk)
	h, seen := r.acquire(t)
	waitForRenewLoop(t, r.clk)
	r.wl.modify(t, func(l *coordinationv1.Lease) {
		future := metav1.NewMicroTime(r.clk.Now().Add(time.Hour))
		l.Spec.RenewTime = &future
	})
	r.applied(t)
	r.wl.SetFailing(true)
	r.clk.Step(cfg.RenewDeadline - time.Millisecond)
	require.NoError(t, h.Err())
	r.clk.Step(time.Millisecond)
	select {
	case err := <-seen:
		require.ErrorIs(t, err, ErrRenewDeadline)
	case <-time.After(5 * time.Second):
		t.Fatal("the future renewTime extended the Held past its renew deadline")
	}
}

// TestWatcherMetrics checks the handover counter, which counts every
// acquisition the Watcher observes, by any holder, and the renewal
// counters and leader gauge fed by the Elector.
func TestWatcherMetrics(t *testing.T) {
	r := newSelfFenceRig(t, heldLease("a", 3, time.Now())) // listed: not a handover
	wl := r.wl
	wl.modify(t, func(l *coordinationv1.Lease) { now := metav1.NowMicro(); l.Spec.RenewTime = &now }) // a renews
	wl.modify(t, otherHolder("b"))                                                                    // 1
	wl.modify(t, func(l *coordinationv1.Lease) { none := ""; l.Spec.HolderIdentity = &none })         // released
	wl.modify(t, otherHolder("c"))                                                                    // 2
	wl.remove(t)
	wl.recreate(t, "d") // 3
	fw := wl.current(t)
	other := heldLease("x", 0, time.Now())
	other.Name, other.UID, other.ResourceVersion = "other", "uid-x", "100000"
	fw.Add(other) // 1 for ns/other
	require.Eventually(t, func() bool {
		return testutil.ToFloat64(r.w.metrics.transitions.WithLabelValues("ns/other")) == 1
	}, 5*time.Second, time.Millisecond)
	require.Equal(t, 3.0, testutil.ToFloat64(r.w.metrics.transitions.WithLabelValues("ns/fence")))

	// d releases; this process acquires (4), renews once and releases.
	wl.modify(t, func(l *coordinationv1.Lease) { none := ""; l.Spec.HolderIdentity = &none })
	r.applied(t)
	h, err := r.e.TryAcquire(context.Background())
	require.NoError(t, err)
	fw.Modify(wl.get(t))
	require.Eventually(t, func() bool {
		return testutil.ToFloat64(r.w.metrics.transitions.WithLabelValues("ns/fence")) == 4
	}, 5*time.Second, time.Millisecond)
	waitForRenewLoop(t, r.clk)
	r.clk.Step(2 * time.Second)
	require.Eventually(t, func() bool {
		return testutil.ToFloat64(r.w.metrics.renewals.WithLabelValues("ns/fence")) == 1
	}, 5*time.Second, time.Millisecond)
	require.NoError(t, h.Release(context.Background()))

	const want = `
# HELP fencer_lease_leader Acquisitions of the Lease this process holds now (0 or 1).
# TYPE fencer_lease_leader gauge
fencer_lease_leader{lease="ns/fence"} 0
# HELP fencer_lease_renewals_total Successful Lease renewal writes.
# TYPE fencer_lease_renewals_total counter
fencer_lease_renewals_total{lease="ns/fence"} 1
# HELP fencer_lease_transitions_total Acquisitions of the Lease by any holder observed by the watcher.
# TYPE fencer_lease_transitions_total counter
fencer_lease_transitions_total{lease="ns/fence"} 4
fencer_lease_transitions_total{lease="ns/other"} 1
# HELP fencer_self_fence_total Acquisitions of this process that ended other than by release, by reason.
# TYPE fencer_self_fence_total counter
fencer_self_fence_total{reason="deleted"} 0
fencer_self_fence_total{reason="renew_deadline"} 0
fencer_self_fence_total{reason="replaced"} 0
fencer_self_fence_total{reason="taken"} 0
# HELP fencer_lease_watch_errors_total Failed Lease lists and watches of the watcher, by kind (expired: listed again; failed: retried with backoff).
# TYPE fencer_lease_watch_errors_total counter
fencer_lease_watch_errors_total{kind="expired"} 0
fencer_lease_watch_errors_total{kind="failed"} 0
`
	require.NoError(t, testutil.GatherAndCompare(r.reg, strings.NewReader(want),
		MetricLeader, MetricRenewals, MetricTransitions, MetricSelfFence, MetricWatchErrors))
	problems, err := testutil.GatherAndLint(r.reg)
	require.NoError(t, err)
	require.Empty(t, problems)
}

// TestWatcherConfig checks the Watcher's options, its coverage check in
// NewElector and that it starts once.
func TestWatcherConfig(t *testing.T) {
	cs := newFakeLeases(t)
	for _, tc := range []struct {
		name  string
		opts  []WatcherOption
		field string
	}{
		{"no namespaces", []WatcherOption{WatchNamespaces()}, "WatchNamespaces"},
		{"bad namespace", []WatcherOption{WatchNamespaces("Bad_NS")}, "WatchNamespaces"},
		{"nil registerer", []WatcherOption{WithRegisterer(nil)}, "WithRegisterer"},
		{"nil clock", []WatcherOption{WithWatcherClock(nil)}, "WithWatcherClock"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewWatcher(cs.CoordinationV1(), tc.opts...)
			var ce *ConfigError
			require.ErrorAs(t, err, &ce)
			require.Equal(t, tc.field, ce.Field)
		})
	}
	_, err := NewWatcher(nil)
	require.ErrorIs(t, err, ErrInvalidConfig)

	reg := prometheus.NewRegistry()
	_, err = NewWatcher(cs.CoordinationV1(), WithRegisterer(reg))
	require.NoError(t, err)
	_, err = NewWatcher(cs.CoordinationV1(), WithRegisterer(reg))
	require.ErrorAs(t, err, new(prometheus.AlreadyRegisteredError), "a second Watcher on one registerer")

	w, err := NewWatcher(cs.CoordinationV1(), WatchNamespaces("other"))
	require.NoError(t, err)
	cfg := DefaultConfig("ns", "fence", "me")
	cfg.Watcher = w
	_, err = NewElector(cs.CoordinationV1(), cfg)
	var ce *ConfigError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, "Watcher", ce.Field)

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.NoError(t, w.Start(ctx))
	require.ErrorIs(t, w.Start(ctx), ErrAlreadyStarted)
}

// TestWatcherRingSource checks the Watcher's ring source, which
// kubeadapter/shard reads: Labelled returns the Leases of a namespace with
// a label as last seen, the progress and whether the first list was
// applied (never for a namespace it does not watch); Subscribe signals
// after an event is applied, until it is stopped; and RecordLeaseWrite
// counts in MetricLeaseWrites.
func TestWatcherRingSource(t *testing.T) {
	r := newSelfFenceRig(t)
	leases, _, synced := r.w.Labelled("ns", "ring", "r")
	require.True(t, synced, "listed, but not synced")
	require.Empty(t, leases)
	_, _, synced = r.w.Labelled("elsewhere", "ring", "r")
	require.False(t, synced, "synced for a namespace the Watcher does not watch")

	notify, stop := r.w.Subscribe()
	cfg := testConfig(r.clk)
	cfg.Watcher, cfg.Labels = r.w, map[string]string{"ring": "r"}
	e, err := NewElector(r.wl.CoordinationV1(), cfg)
	require.NoError(t, err)
	h, err := e.TryAcquire(context.Background())
	require.NoError(t, err)
	t.Cleanup(func() { _ = h.Release(context.Background()) })
	r.wl.current(t).Add(r.wl.get(t)) // the fake sends events by hand
	select {
	case <-notify:
	case <-time.After(5 * time.Second):
		t.Fatal("no signal after the acquisition's event")
	}
	r.applied(t)
	leases, progress, synced := r.w.Labelled("ns", "ring", "r")
	require.True(t, synced)
	require.Len(t, leases, 1)
	require.Equal(t, e.Identity(), leaserecord.Holder(&leases[0].Spec))
	require.GreaterOrEqual(t, progress, h.Token().Revision)
	leases, _, _ = r.w.Labelled("ns", "ring", "other")
	require.Empty(t, leases)

	stop()
	select {
	case <-notify:
	default:
	}
	require.NoError(t, h.Renew(context.Background(), nil))
	r.wl.current(t).Modify(r.wl.get(t))
	r.applied(t)
	select {
	case <-notify:
		t.Fatal("signalled after the subscription was stopped")
	default:
	}

	before := testutil.ToFloat64(r.w.metrics.leaseWrites.WithLabelValues(WriteAssign))
	r.w.RecordLeaseWrite(WriteAssign)
	require.Equal(t, before+1, testutil.ToFloat64(r.w.metrics.leaseWrites.WithLabelValues(WriteAssign)))
}
