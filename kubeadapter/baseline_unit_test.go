package kubeadapter

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// TestClientGoBaseline documents the behaviour that the Watcher fixes: stock
// client-go leader election, given the events of TestWatcherSelfFences on
// the same fake API, keeps leading until about RenewDeadline after a
// holder change or replacement, and after a plain delete never stops (it
// recreates the Lease as itself). client-go's elector has no injectable
// clock, so this runs on the real clock with RenewDeadline 1s and
// RetryPeriod 100ms, and asserts only what scheduling delays cannot
// break: still leading at half the renew deadline after the event.
func TestClientGoBaseline(t *testing.T) {
	const (
		renewDeadline = time.Second
		retryPeriod   = 100 * time.Millisecond
	)
	deleteLease := func(t *testing.T, f *fakeLeases) {
		f.Mu.Lock()
		err := f.Tracker().Delete(leasesGVR, "ns", "fence")
		f.RV++
		f.Mu.Unlock()
		require.NoError(t, err)
	}
	for _, tc := range []struct {
		name  string
		event func(*testing.T, *fakeLeases)
		stops bool
	}{
		{"another holder", func(t *testing.T, f *fakeLeases) { f.edit(t, otherHolder("other")) }, true},
		{"another holder, renewTime in the future", func(t *testing.T, f *fakeLeases) {
			f.edit(t, func(l *coordinationv1.Lease) {
				otherHolder("other")(l)
				future := metav1.NewMicroTime(time.Now().Add(time.Hour))
				l.Spec.RenewTime = &future
			})
		}, true},
		{"replaced for another holder", func(t *testing.T, f *fakeLeases) {
			deleteLease(t, f)
			l := heldLease("other", 0, time.Now())
			f.Mu.Lock()
			f.RV++
			l.ResourceVersion = strconv.FormatInt(f.RV, 10)
			l.UID = types.UID("uid-" + l.ResourceVersion)
			err := f.Tracker().Create(leasesGVR, l, "ns")
			f.Mu.Unlock()
			require.NoError(t, err)
		}, true},
		{"deleted", deleteLease, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFakeLeases(t)
			leading := make(chan context.Context, 1)
			stopped := make(chan struct{})
			le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
				Lock: &resourcelock.LeaseLock{
					LeaseMeta:  metav1.ObjectMeta{Namespace: "ns", Name: "fence"},
					Client:     f.CoordinationV1(),
					LockConfig: resourcelock.ResourceLockConfig{Identity: "stock"},
				},
				LeaseDuration: 2 * time.Second, RenewDeadline: renewDeadline, RetryPeriod: retryPeriod,
				Callbacks: leaderelection.LeaderCallbacks{
					OnStartedLeading: func(ctx context.Context) { leading <- ctx },
					OnStoppedLeading: func() { close(stopped) },
				},
			})
			require.NoError(t, err)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { defer close(done); le.Run(ctx) }()
			t.Cleanup(func() { cancel(); <-done })
			var lctx context.Context
			select {
			case lctx = <-leading:
			case <-time.After(5 * time.Second):
				t.Fatal("client-go did not start leading")
			}

			tc.event(t, f)
			at := time.Now()
			time.Sleep(renewDeadline / 2)
			require.NoError(t, lctx.Err(), "client-go stopped leading within half its renew deadline")
			if !tc.stops {
				time.Sleep(2 * renewDeadline)
				require.NoError(t, lctx.Err(), "client-go stopped leading after a delete")
				require.Equal(t, "stock", *f.get(t).Spec.HolderIdentity, "client-go did not recreate the Lease as itself")
				t.Logf("still leading %v after the delete, on a Lease it recreated", time.Since(at).Round(time.Millisecond))
				return
			}
			select {
			case <-stopped:
			case <-time.After(5 * renewDeadline):
				t.Fatal("client-go never stopped leading")
			}
			t.Logf("client-go stopped leading %v after the event (RenewDeadline %v)", time.Since(at).Round(time.Millisecond), renewDeadline)
		})
	}
}
