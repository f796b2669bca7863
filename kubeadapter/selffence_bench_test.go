package kubeadapter_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/util/retry"

	"github.com/fencer-dev/fencer/kubeadapter"
)

// Self-fence benchmark parameters: trials per kind of loss, fencer trials
// run at once, and how long a stock client-go leader is watched after a
// plain delete (from which it never stops).
const (
	selfFenceTrials      = 50
	selfFenceConcurrency = 8
	clientGoDeleteWatch  = 15 * time.Second
)

// lossKind is one way a holder loses its Lease.
type lossKind string

const (
	lossDelete  lossKind = "delete"  // the Lease is deleted
	lossReplace lossKind = "replace" // deleted, then recreated by another holder
	lossHolder  lossKind = "holder"  // an update names another holder
)

var lossKinds = []lossKind{lossDelete, lossReplace, lossHolder}

// trial is the outcome of one loss. Durations are measured from the
// return of the API write that made the loss (for replace, the delete).
type trial struct {
	// stopped: the old holder's context was cancelled (fencer) or
	// OnStoppedLeading was called (client-go), within the watch.
	stopped bool
	// latency until the old holder stopped; negative when it stopped
	// before the write returned to its writer.
	latency time.Duration
	// overlap is how long the old holder still led after the new holder
	// started (replace and holder; zero or negative is no overlap).
	overlap time.Duration
}

// BenchmarkSelfFence measures, on the real API server, how fast a holder
// stops after losing its Lease, for fencer (an Elector with a Watcher) and
// for stock client-go leader election (LeaseLock, 15s/10s/2s) in the same
// run. Each kind of loss is tried selfFenceTrials times per side, each
// trial on a Lease of its own: fencer trials selfFenceConcurrency at a
// time, the client-go trials all at once, since each takes about
// RenewDeadline. It reports p50 and p99 (with 50 trials, p99 is the
// maximum) in milliseconds from the write's return to the old holder's
// stop, and the overlap with the replacement holder (how long both
// considered themselves leader; the new holder starts when its acquiring
// write returns).
func BenchmarkSelfFence(b *testing.B) {
	k := newKube(b)
	w, reg := startWatcher(k, b, false)
	for b.Loop() {
		var (
			mu       sync.Mutex
			fencer   = map[lossKind][]trial{}
			clientGo = map[lossKind][]trial{}
			wg       sync.WaitGroup
		)
		record := func(m map[lossKind][]trial, kind lossKind, tr trial, err error) {
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				b.Error(err)
				return
			}
			m[kind] = append(m[kind], tr)
		}
		// fencer trials, selfFenceConcurrency at a time.
		start := time.Now()
		sem := make(chan struct{}, selfFenceConcurrency)
		for _, kind := range lossKinds {
			for i := range selfFenceTrials {
				sem <- struct{}{}
				wg.Go(func() {
					defer func() { <-sem }()
					tr, err := fencerTrial(k, w, kind, fmt.Sprintf("f-%s-%d", kind, i))
					record(fencer, kind, tr, err)
				})
			}
		}
		wg.Wait()
		fencerTook := time.Since(start)
		// client-go trials, all at once.
		start = time.Now()
		for _, kind := range lossKinds {
			for i := range selfFenceTrials {
				wg.Go(func() {
					tr, err := clientGoTrial(k, kind, fmt.Sprintf("cg-%s-%d", kind, i))
					record(clientGo, kind, tr, err)
				})
			}
		}
		wg.Wait()
		b.Logf("fencer trials took %v, client-go trials %v", fencerTook.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
		report(b, "fencer", fencer)
		mfs, err := reg.Gather()
		if err != nil {
			b.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == kubeadapter.MetricSelfFenceLatency {
				hist := mf.GetMetric()[0].GetHistogram()
				mean := hist.GetSampleSum() / float64(hist.GetSampleCount()) * 1e6
				b.ReportMetric(mean, "fencer-event-to-cancel-mean-us")
				b.Logf("fencer: %d self-fences timed by %s, mean %.0f µs from the event's arrival to the cancel", hist.GetSampleCount(), kubeadapter.MetricSelfFenceLatency, mean)
			}
		}
		report(b, "clientgo", clientGo)
	}
}

// report logs a table row per kind and reports the figures as metrics.
func report(b *testing.B, side string, trials map[lossKind][]trial) {
	for _, kind := range lossKinds {
		ts := trials[kind]
		var lat, over []float64
		early := 0
		for _, t := range ts {
			if !t.stopped {
				continue
			}
			if t.latency < 0 {
				early++
			}
			lat = append(lat, ms(max(t.latency, 0)))
			if kind != lossDelete {
				over = append(over, ms(max(t.overlap, 0)))
			}
		}
		name := side + "-" + string(kind)
		b.ReportMetric(float64(len(lat)), name+"-stopped")
		if len(lat) == 0 {
			b.Logf("%-16s %d/%d stopped (watched %v)", name, 0, len(ts), clientGoDeleteWatch)
			continue
		}
		b.ReportMetric(percentile(lat, 50), name+"-p50-ms")
		b.ReportMetric(percentile(lat, 99), name+"-p99-ms")
		line := fmt.Sprintf("%-16s %d/%d stopped; stop after write p50 %.1f ms p99 %.1f ms (%d before the write returned)",
			name, len(lat), len(ts), percentile(lat, 50), percentile(lat, 99), early)
		if len(over) > 0 {
			b.ReportMetric(percentile(over, 50), name+"-overlap-p50-ms")
			b.ReportMetric(slices.Max(over), name+"-overlap-max-ms")
			line += fmt.Sprintf("; overlap with new holder p50 %.1f ms max %.1f ms", percentile(over, 50), slices.Max(over))
		}
		b.Log(line)
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// percentile returns the nearest-rank p-th percentile of xs.
func percentile(xs []float64, p int) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	i := (p*len(s)+99)/100 - 1
	return s[max(i, 0)]
}

// makeLoss makes the loss of kind on Lease name, holding the Lease
// as held, and returns when the loss's write returned and when the new
// holder started (zero for a delete).
func makeLoss(ctx context.Context, k *kube, kind lossKind, name string, newHolder func() (time.Time, error)) (wrote, started time.Time, err error) {
	leases := k.CS.CoordinationV1().Leases(k.NS)
	switch kind {
	case lossDelete:
		err = leases.Delete(ctx, name, metav1.DeleteOptions{})
		return time.Now(), time.Time{}, err
	case lossReplace:
		if err = leases.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			return
		}
		wrote = time.Now()
		started, err = newHolder()
		return wrote, started, err
	}
	// The holder may renew in between: retry on conflict.
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := leases.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		other, n := "other", int32(1)
		if cur.Spec.LeaseTransitions != nil {
			n = *cur.Spec.LeaseTransitions + 1
		}
		cur.Spec.HolderIdentity, cur.Spec.LeaseTransitions = &other, &n
		_, err = leases.Update(ctx, cur, metav1.UpdateOptions{})
		return err
	})
	wrote = time.Now()
	return wrote, wrote, err
}

// createFor creates Lease name naming holder, as a replacement holder
// would, and returns when the write returned.
func createFor(ctx context.Context, k *kube, name, holder string) (time.Time, error) {
	d, n := int32(15), int32(0)
	_, err := k.CS.CoordinationV1().Leases(k.NS).Create(ctx, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &d, LeaseTransitions: &n},
	}, metav1.CreateOptions{})
	return time.Now(), err
}

// fencerTrial acquires Lease name with an Elector using w, makes the loss
// and times the cancellation of the Held's context. The replacement
// holder is another fencer Elector.
func fencerTrial(k *kube, w *kubeadapter.Watcher, kind lossKind, name string) (trial, error) {
	ctx := context.Background()
	elector := func(identity string) (*kubeadapter.Held, error) {
		cfg := slow(k, identity, w)
		cfg.Name = name
		e, err := kubeadapter.NewElector(k.CS.CoordinationV1(), cfg)
		if err != nil {
			return nil, err
		}
		return e.TryAcquire(ctx)
	}
	h, err := elector("old")
	if err != nil {
		return trial{}, err
	}
	defer h.Release(ctx)
	stoppedAt := make(chan time.Time, 1)
	context.AfterFunc(h.Context(), func() { stoppedAt <- time.Now() })

	wrote, started, err := makeLoss(ctx, k, kind, name, func() (time.Time, error) {
		hn, err := elector("new")
		if err != nil {
			return time.Time{}, err
		}
		started := time.Now()
		return started, hn.Release(ctx)
	})
	if err != nil {
		return trial{}, err
	}
	if tr, ok := awaitStop(stoppedAt, wrote, started, 10*time.Second); ok {
		return tr, nil
	}
	return trial{}, fmt.Errorf("fencer %s: not cancelled within 10s", kind)
}

// awaitStop waits up to timeout for the old holder to stop and measures
// the trial from the loss's write (wrote) and the new holder's start
// (started, zero when there is none). ok is false if it did not stop.
func awaitStop(stoppedAt <-chan time.Time, wrote, started time.Time, timeout time.Duration) (tr trial, ok bool) {
	select {
	case at := <-stoppedAt:
		tr = trial{stopped: true, latency: at.Sub(wrote)}
		if !started.IsZero() {
			tr.overlap = at.Sub(started)
		}
		return tr, true
	case <-time.After(timeout):
		return trial{}, false
	}
}

// clientGoTrial runs a stock client-go elector on Lease name with
// client-go's default timing, makes the loss at a random point of its
// first renewal period, and times
// OnStoppedLeading; after a plain delete it watches for
// clientGoDeleteWatch. The replacement holder is a plain create naming
// another identity.
func clientGoTrial(k *kube, kind lossKind, name string) (trial, error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	leading := make(chan struct{})
	stoppedAt := make(chan time.Time, 1)
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: &resourcelock.LeaseLock{
			LeaseMeta:  metav1.ObjectMeta{Namespace: k.NS, Name: name},
			Client:     k.CS.CoordinationV1(),
			LockConfig: resourcelock.ResourceLockConfig{Identity: "stock"},
		},
		LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: 2 * time.Second,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(context.Context) { close(leading) },
			OnStoppedLeading: func() { stoppedAt <- time.Now() },
		},
	})
	if err != nil {
		return trial{}, err
	}
	done := make(chan struct{})
	go func() { defer close(done); le.Run(ctx) }()
	defer func() { cancel(); <-done }()
	select {
	case <-leading:
	case <-time.After(30 * time.Second):
		return trial{}, fmt.Errorf("client-go %s: did not lead", kind)
	}
	// Trials start together; spread the losses over the renewal period so
	// that they do not all fall at the same point of client-go's cycle.
	time.Sleep(rand.N(2 * time.Second))
	wrote, started, err := makeLoss(ctx, k, kind, name, func() (time.Time, error) {
		return createFor(ctx, k, name, "other")
	})
	if err != nil {
		return trial{}, err
	}
	tr, _ := awaitStop(stoppedAt, wrote, started, clientGoDeleteWatch)
	return tr, nil
}
