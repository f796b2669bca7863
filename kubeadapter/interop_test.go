package kubeadapter_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/fencer-dev/fencer/kubeadapter"
)

// TestInteropWithClientGo runs a stock client-go elector (LeaseLock) and a
// fencer Elector against the same Lease for about 12 seconds, handing the
// Lease back and forth, and samples every few milliseconds that they never
// both lead.
func TestInteropWithClientGo(t *testing.T) {
	t.Parallel()
	k := newKube(t)
	ctx, cancel := context.WithTimeout(t.Context(), 12*time.Second)
	defer cancel()
	cfg := k.Fast("fencer")
	e, err := kubeadapter.NewElector(k.CS.CoordinationV1(), cfg)
	require.NoError(t, err)

	var stock atomic.Pointer[context.Context] // the stock elector's leading context
	var held atomic.Pointer[kubeadapter.Held]
	var stockTerms, fencerTerms atomic.Int32
	pause := func(d time.Duration) {
		select {
		case <-ctx.Done():
		case <-time.After(d):
		}
	}
	var wg sync.WaitGroup
	wg.Go(func() { // stock client-go: lead for 1.5s, then stop without releasing
		for ctx.Err() == nil {
			runCtx, stop := context.WithCancel(ctx)
			le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
				Lock: &resourcelock.LeaseLock{
					LeaseMeta:  metav1.ObjectMeta{Namespace: cfg.Namespace, Name: cfg.Name},
					Client:     k.CS.CoordinationV1(),
					LockConfig: resourcelock.ResourceLockConfig{Identity: "stock"},
				},
				LeaseDuration: cfg.LeaseDuration, RenewDeadline: cfg.RenewDeadline, RetryPeriod: cfg.RetryPeriod,
				Callbacks: leaderelection.LeaderCallbacks{
					OnStartedLeading: func(lctx context.Context) {
						stock.Store(&lctx)
						stockTerms.Add(1)
						select {
						case <-lctx.Done():
						case <-time.After(1500 * time.Millisecond):
							stop()
						}
					},
					OnStoppedLeading: func() {},
				},
			})
			if err != nil {
				stop()
				t.Error(err)
				return
			}
			le.Run(runCtx)
			stop()
			// client-go re-acquires a record naming its own identity at
			// once; wait past the lease so the fencer elector gets a turn.
			pause(2500 * time.Millisecond)
		}
	})
	wg.Go(func() { // fencer: hold for 1.5s, then release
		for ctx.Err() == nil {
			h, err := e.Acquire(ctx)
			if err != nil {
				return
			}
			held.Store(h)
			fencerTerms.Add(1)
			select {
			case <-h.Done():
			case <-time.After(1500 * time.Millisecond):
			}
			_ = h.Release(context.Background())
			pause(500 * time.Millisecond)
		}
	})

	var samples, both int
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for ctx.Err() == nil {
		<-tick.C
		s := stock.Load()
		stockLeads := s != nil && (*s).Err() == nil
		h := held.Load()
		fencerLeads := h != nil && h.Err() == nil
		samples++
		if stockLeads && fencerLeads {
			both++
		}
	}
	wg.Wait()
	t.Logf("%d samples; terms: stock %d, fencer %d", samples, stockTerms.Load(), fencerTerms.Load())
	require.Zero(t, both, "both electors led at once")
	// Both led, and the Lease changed hands at least twice. How many terms
	// each wins depends on scheduling on a loaded machine.
	require.Positive(t, stockTerms.Load())
	require.Positive(t, fencerTerms.Load())
	require.GreaterOrEqual(t, stockTerms.Load()+fencerTerms.Load(), int32(3))
}
