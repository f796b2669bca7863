package kubeadapter

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"
)

// failingLeases makes the first len(errs) reads of the Lease fail with
// errs, in order, and counts the reads.
func failingLeases(t *testing.T, errs ...error) (*fakeLeases, func() int) {
	f := newFakeLeases(t)
	var mu sync.Mutex
	reads := 0
	f.PrependReactor("get", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		reads++
		if reads <= len(errs) {
			return true, nil, errs[reads-1]
		}
		return false, nil, nil
	})
	return f, func() int { mu.Lock(); defer mu.Unlock(); return reads }
}

// electorWithMetrics returns an Elector on leases whose metrics go to a
// fresh registry, through an unstarted Watcher.
func electorWithMetrics(t *testing.T, leases *fakeLeases, clk *clocktesting.FakeClock) (*Elector, *metrics) {
	w, err := NewWatcher(leases.CoordinationV1(), WithRegisterer(prometheus.NewRegistry()))
	require.NoError(t, err)
	cfg := testConfig(clk)
	cfg.Watcher = w
	e, err := NewElector(leases.CoordinationV1(), cfg)
	require.NoError(t, err)
	return e, w.metrics
}

// TestAcquireReturnsWhatWaitingCannotFix checks that Acquire gives up at
// once, with an *AcquireError that keeps the API error, when the server
// refuses for a reason that waiting will not change, and counts it.
func TestAcquireReturnsWhatWaitingCannotFix(t *testing.T) {
	gr := schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}
	for _, c := range []struct {
		name   string
		create bool // the error comes from the create of an absent Lease
		err    error
		reason string
		is     func(error) bool
	}{
		{"forbidden", false, apierrors.NewForbidden(gr, "fence", errors.New(`User "nobody" cannot get resource "leases"`)), AcquireForbidden, apierrors.IsForbidden},
		{"namespace missing", true, apierrors.NewNotFound(schema.GroupResource{Resource: "namespaces"}, "ns"), AcquireNotFound, apierrors.IsNotFound},
		{"invalid", true, apierrors.NewInvalid(schema.GroupKind{Group: "coordination.k8s.io", Kind: "Lease"}, "fence", nil), AcquireInvalid, apierrors.IsInvalid},
	} {
		t.Run(c.name, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(time.Now())
			f, reads := failingLeases(t)
			if c.create {
				f.PrependReactor("create", "leases", func(k8stesting.Action) (bool, runtime.Object, error) { return true, nil, c.err })
			} else {
				f, reads = failingLeases(t, c.err)
			}
			e, m := electorWithMetrics(t, f, clk)
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			_, err := e.Acquire(ctx)
			var ae *AcquireError
			require.ErrorAs(t, err, &ae)
			require.ErrorIs(t, err, ErrCannotAcquire)
			require.True(t, c.is(err), "the API error is kept: %v", err)
			require.Equal(t, c.reason, ae.Reason)
			require.Equal(t, "ns/fence", ae.Lease)
			require.Equal(t, 1, reads(), "one attempt, no retry")
			require.Equal(t, 1.0, testutil.ToFloat64(m.acquireErrors.WithLabelValues("ns/fence", c.reason)))
		})
	}
}

// TestAcquireRetriesTransientErrorsWithBackoff fails the first attempts
// with errors that may pass and checks that Acquire retries them with a
// doubling delay, counts each, logs the first of each reason at once and
// the repeats at most once per AcquireLogInterval, and then acquires.
func TestAcquireRetriesTransientErrorsWithBackoff(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	unavailable := apierrors.NewServiceUnavailable("etcd leader changed")
	f, reads := failingLeases(t, unavailable, unavailable, unavailable, apierrors.NewTooManyRequests("slow down", 1))
	e, m := electorWithMetrics(t, f, clk)
	var mu sync.Mutex
	var lines []string
	log := funcr.New(func(prefix, args string) { mu.Lock(); lines = append(lines, args); mu.Unlock() }, funcr.Options{})

	type result struct {
		h   *Held
		err error
	}
	done := make(chan result, 1)
	go func() {
		h, err := e.Acquire(logr.NewContext(t.Context(), log))
		done <- result{h, err}
	}()
	cfg := testConfig(clk)
	retry := cfg.RetryPeriod
	// Attempt n+1 comes after the n-th delay: RetryPeriod·2^(n-1), capped
	// at LeaseDuration, within +JitterFactor. Stepping to just under the delay must not start it;
	// stepping past its jittered bound must.
	for n, delay := range []time.Duration{retry, 2 * retry, 4 * retry, cfg.LeaseDuration} {
		waitForTimer(t, clk)
		require.Equal(t, n+1, reads())
		clk.Step(delay - time.Millisecond)
		require.Never(t, func() bool { return reads() > n+1 }, 20*time.Millisecond, time.Millisecond, "attempt %d came before its backoff", n+2)
		clk.Step(time.Duration(float64(delay)*JitterFactor) + time.Millisecond)
		require.Eventually(t, func() bool { return reads() > n+1 }, 5*time.Second, time.Millisecond, "attempt %d", n+2)
	}
	r := <-done
	require.NoError(t, r.err)
	t.Cleanup(func() { _ = r.h.Release(context.Background()) })

	require.Equal(t, 3.0, testutil.ToFloat64(m.acquireErrors.WithLabelValues("ns/fence", AcquireUnavailable)))
	require.Equal(t, 1.0, testutil.ToFloat64(m.acquireErrors.WithLabelValues("ns/fence", AcquireThrottled)))
	mu.Lock()
	defer mu.Unlock()
	// Three unavailable failures within 2+4 RetryPeriods of the first:
	// one line; the throttled failure is a new reason: one more line.
	require.Len(t, lines, 2, "%q", lines)
	require.Contains(t, lines[0], `"reason"="unavailable"`)
	require.Contains(t, lines[0], "etcd leader changed")
	require.Contains(t, lines[1], `"reason"="throttled"`)
}

// TestAcquireLogRepeatsAfterTheInterval checks the rate limit of the
// failure log: the same reason is logged again once AcquireLogInterval has
// passed, with the number of failures left unlogged.
func TestAcquireLogRepeatsAfterTheInterval(t *testing.T) {
	l := failureLog{last: map[string]time.Time{}, suppressed: map[string]int{}}
	now := time.Now()
	n, ok := l.due(AcquireTimeout, now)
	require.True(t, ok)
	require.Zero(t, n)
	for range 3 {
		_, ok = l.due(AcquireTimeout, now.Add(time.Second))
		require.False(t, ok)
	}
	_, ok = l.due(AcquireForbidden, now.Add(time.Second))
	require.True(t, ok, "another reason is logged at once")
	n, ok = l.due(AcquireTimeout, now.Add(AcquireLogInterval))
	require.True(t, ok)
	require.Equal(t, 3, n)
}

// TestAcquireReasons pins the classification of API errors.
func TestAcquireReasons(t *testing.T) {
	gr := schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}
	for _, c := range []struct {
		err       error
		reason    string
		permanent bool
	}{
		{apierrors.NewForbidden(gr, "fence", errors.New("no")), AcquireForbidden, true},
		{apierrors.NewNotFound(schema.GroupResource{Resource: "namespaces"}, "ns"), AcquireNotFound, true},
		{apierrors.NewNotFound(gr, "fence"), AcquireNotFound, false},
		{apierrors.NewBadRequest("bad"), AcquireInvalid, true},
		{apierrors.NewConflict(gr, "fence", errors.New("moved")), AcquireConflict, false},
		{apierrors.NewAlreadyExists(gr, "fence"), AcquireConflict, false},
		{apierrors.NewUnauthorized("expired"), AcquireUnauthorized, false},
		{apierrors.NewTooManyRequests("slow", 1), AcquireThrottled, false},
		{apierrors.NewTimeoutError("slow", 1), AcquireTimeout, false},
		{context.DeadlineExceeded, AcquireTimeout, false},
		{apierrors.NewInternalError(errors.New("boom")), AcquireUnavailable, false},
		{errors.New("dial tcp: lookup kube: no such host"), AcquireOther, false},
	} {
		reason, permanent := acquireReason(c.err)
		require.Equal(t, c.reason, reason, "%v", c.err)
		require.Equal(t, c.permanent, permanent, "%v", c.err)
	}
}

// waitForTimer waits until Acquire sleeps on the fake clock.
func waitForTimer(t *testing.T, clk *clocktesting.FakeClock) {
	t.Helper()
	require.Eventually(t, clk.HasWaiters, 5*time.Second, time.Millisecond)
}

// TestAcquireErrorsCountedWithoutAWatcher checks that Electors without a
// Watcher count MetricAcquireErrors in Config.Registerer, two of them and
// then a Watcher's metrics sharing one registry, and that a Registerer
// beside a Watcher is refused.
func TestAcquireErrorsCountedWithoutAWatcher(t *testing.T) {
	gr := schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}
	forbidden := apierrors.NewForbidden(gr, "fence", errors.New(`User "nobody" cannot get resource "leases"`))
	reg := prometheus.NewRegistry()
	clk := clocktesting.NewFakeClock(time.Now())
	for range 2 {
		f, _ := failingLeases(t, forbidden)
		cfg := testConfig(clk)
		cfg.Registerer = reg
		e, err := NewElector(f.CoordinationV1(), cfg)
		require.NoError(t, err)
		_, err = e.Acquire(t.Context())
		require.ErrorIs(t, err, ErrCannotAcquire)
	}
	w, err := NewWatcher(newFakeLeases(t).CoordinationV1(), WithRegisterer(reg))
	require.NoError(t, err)
	require.Equal(t, 2.0, testutil.ToFloat64(w.metrics.acquireErrors.WithLabelValues("ns/fence", AcquireForbidden)),
		"both Electors counted in the registry the Watcher shares")

	cfg := testConfig(clk)
	cfg.Registerer, cfg.Watcher = reg, w
	_, err = NewElector(newFakeLeases(t).CoordinationV1(), cfg)
	var ce *ConfigError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, "Registerer", ce.Field)
}
