package kubefencertest_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fencer-dev/fencer/kubeadapter"
	"github.com/fencer-dev/fencer/kubeadapter/fenced"
	"github.com/fencer-dev/fencer/kubeadapter/kubefencertest"
	"github.com/fencer-dev/fencer/token"
)

// ns is the namespace the tests work in.
const ns = "kit"

// TestKit runs the kit against one real kube-apiserver: each subtest
// checks that what it installs or does was not so before.
func TestKit(t *testing.T) {
	env := kubefencertest.APIServerForTest(t)
	cfg := env.Admin()
	cs, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	_, err = cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	require.NoError(t, err)

	t.Run("InstallPolicy", func(t *testing.T) {
		cms := cs.CoreV1().ConfigMaps(ns)
		cm, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
			Name:        "stamped",
			Annotations: map[string]string{"fencer.dev/lease": ns + "/other", "fencer.dev/token": "5"},
		}}, metav1.CreateOptions{})
		require.NoError(t, err)
		cm.Annotations["fencer.dev/token"] = "4"
		dryRun := metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}}
		_, err = cms.Update(ctx, cm, dryRun)
		require.NoError(t, err, "without the policy the API server takes a stale stamp")

		require.NoError(t, kubefencertest.InstallPolicy(ctx, cfg))
		_, err = cms.Update(ctx, cm, dryRun)
		require.True(t, apierrors.IsForbidden(err), "want a stale stamp denied, got %v", err)
		require.ErrorContains(t, err, "stale fencing token")
		_, err = cs.CoreV1().ConfigMaps(kubefencertest.ProbeNamespace).Get(ctx, "fencer-policy-probe", metav1.GetOptions{})
		require.True(t, apierrors.IsNotFound(err), "the probe must be deleted, got %v", err)
		require.Error(t, kubefencertest.InstallPolicy(ctx, cfg), "a second install must fail, not pass unchecked")
	})

	// WaitEnforced runs after InstallPolicy, whose policy it waits for.
	t.Run("WaitEnforced", func(t *testing.T) {
		cms := cs.CoreV1().ConfigMaps(ns)
		fresh, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
			Name:        "waited",
			Annotations: map[string]string{"fencer.dev/lease": ns + "/waited", "fencer.dev/token": "5"},
		}}, metav1.CreateOptions{})
		require.NoError(t, err)
		stale := fresh.DeepCopy()
		stale.Annotations["fencer.dev/token"] = "4"
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		require.NoError(t, kubefencertest.WaitEnforced(wctx, cfg, stale, "stale fencing token", fresh))

		short, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		require.Error(t, kubefencertest.WaitEnforced(short, cfg, fresh, ""), "an update the policy admits is not a sign of enforcement")
		short, cancel = context.WithTimeout(ctx, time.Second)
		defer cancel()
		require.Error(t, kubefencertest.WaitEnforced(short, cfg, stale, "stale fencing token", stale), "an admitted object that is denied must fail the wait")
		short, cancel = context.WithTimeout(ctx, time.Second)
		defer cancel()
		require.Error(t, kubefencertest.WaitEnforced(short, cfg, stale, "another policy's message"))
	})

	t.Run("InstallRole", func(t *testing.T) {
		alice := env.Impersonate("alice")
		aliceCS, err := kubernetes.NewForConfig(alice)
		require.NoError(t, err)
		lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "alice"}}
		_, err = aliceCS.CoordinationV1().Leases(ns).Create(ctx, lease, metav1.CreateOptions{})
		require.True(t, apierrors.IsForbidden(err), "before InstallRole alice has no rights, got %v", err)

		require.NoError(t, kubefencertest.InstallRole(ctx, cfg, ns,
			rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "alice"},
			rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: "controller"},
		))
		_, err = aliceCS.CoordinationV1().Leases(ns).Create(ctx, lease, metav1.CreateOptions{})
		require.NoError(t, err)
		_, err = aliceCS.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{})
		require.True(t, apierrors.IsForbidden(err), "the Role grants Leases only, got %v", err)
		sa, err := kubernetes.NewForConfig(env.Impersonate("system:serviceaccount:" + ns + ":controller"))
		require.NoError(t, err)
		_, err = sa.CoordinationV1().Leases(ns).Get(ctx, "alice", metav1.GetOptions{})
		require.NoError(t, err)
	})

	t.Run("Supersede", func(t *testing.T) {
		// A fake clock, and no Watcher, keep the Held from noticing the
		// takeover until the test steps the clock.
		clk := clocktesting.NewFakeClock(time.Now())
		kcfg := kubeadapter.DefaultConfig(ns, "fence", "replica-a")
		kcfg.Clock = clk
		e, err := kubeadapter.NewElector(cs.CoordinationV1(), kcfg)
		require.NoError(t, err)
		held, err := e.TryAcquire(ctx)
		require.NoError(t, err)
		t.Cleanup(func() { _ = held.Release(context.Background()) })

		crc, err := client.New(cfg, client.Options{Scheme: clientgoscheme.Scheme})
		require.NoError(t, err)
		mine, err := fenced.NewClient(crc, held)
		require.NoError(t, err)
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "orders"}, Data: map[string]string{"total": "100"}}
		require.NoError(t, mine.Create(ctx, cm))

		taken := kubefencertest.Supersede(t, cfg, held)
		l, err := cs.CoordinationV1().Leases(ns).Get(ctx, "fence", metav1.GetOptions{})
		require.NoError(t, err)
		require.Equal(t, taken.Identity(), *l.Spec.HolderIdentity)
		require.EqualValues(t, held.Token().Epoch+1, *l.Spec.LeaseTransitions)
		cmp, err := taken.Token().Compare(held.Token())
		require.NoError(t, err)
		require.Equal(t, 1, cmp)

		theirs, err := fenced.NewClient(crc, taken)
		require.NoError(t, err)
		cm.Data["total"] = "250"
		require.NoError(t, theirs.Update(ctx, cm))
		require.NoError(t, held.Err(), "the Held has not noticed yet")
		cm.ResourceVersion = ""
		cm.Data["total"] = "999"
		require.ErrorIs(t, mine.Update(ctx, cm), token.ErrStale)

		require.Eventually(t, func() bool { return clk.Waiters() == 2 }, 30*time.Second, time.Millisecond, "renewal loop armed")
		clk.Step(kcfg.RetryPeriod)
		select {
		case <-held.Done():
		case <-ctx.Done():
			t.Fatal("the renewal never ended the superseded Held")
		}
		require.ErrorIs(t, held.Err(), kubeadapter.ErrLeaseTaken)
		require.ErrorIs(t, mine.Update(ctx, cm), token.ErrNotHeld)
		got := &corev1.ConfigMap{}
		require.NoError(t, crc.Get(ctx, client.ObjectKeyFromObject(cm), got))
		require.Equal(t, "250", got.Data["total"])
	})

	t.Run("SupersedeRefusesNotCurrent", func(t *testing.T) {
		// Each case leaves a Held whose acquisition is no longer current:
		// Supersede must fail the test and leave the Lease as it was.
		for _, tc := range []struct {
			name string
			end  func(t *testing.T, held *kubeadapter.Held, name string) kubeadapter.Holder
		}{
			{"released", func(t *testing.T, held *kubeadapter.Held, name string) kubeadapter.Holder {
				require.NoError(t, held.Release(ctx))
				return held
			}},
			{"released behind its back", func(t *testing.T, held *kubeadapter.Held, name string) kubeadapter.Holder {
				// Another client frees the Lease as client-go's release
				// does; the Held, on a fake clock with no Watcher, has not
				// noticed, so only the Lease says it is no longer current.
				l, err := cs.CoordinationV1().Leases(ns).Get(ctx, name, metav1.GetOptions{})
				require.NoError(t, err)
				empty := ""
				l.Spec.HolderIdentity = &empty
				_, err = cs.CoordinationV1().Leases(ns).Update(ctx, l, metav1.UpdateOptions{})
				require.NoError(t, err)
				require.NoError(t, held.Err())
				return held
			}},
			{"ended at its renew deadline", func(t *testing.T, held *kubeadapter.Held, name string) kubeadapter.Holder {
				// The Lease still names the acquisition; only the holder
				// knows that it gave up.
				return expired{held}
			}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				name := "refused-" + strings.ReplaceAll(tc.name, " ", "-")
				h := tc.end(t, acquire(ctx, t, cs, name), name)
				before, err := cs.CoordinationV1().Leases(ns).Get(ctx, name, metav1.GetOptions{})
				require.NoError(t, err)

				require.Contains(t, refusal(t, cfg, h), "not its lease's current token")
				after, err := cs.CoordinationV1().Leases(ns).Get(ctx, name, metav1.GetOptions{})
				require.NoError(t, err)
				require.Equal(t, before.ResourceVersion, after.ResourceVersion, "a refused Supersede must not write the Lease")
			})
		}
	})

	t.Run("ClosesItsConnections", func(t *testing.T) {
		// A Proxy function keeps client-go from sharing a cached
		// transport, so Supersede dials connections of its own; the API
		// server outlives the call, as a suite's does.
		held := acquire(ctx, t, cs, "connections")
		own := rest.CopyConfig(cfg)
		own.Proxy = func(*http.Request) (*url.URL, error) { return nil, nil }
		before := goleak.IgnoreCurrent()

		kubefencertest.Supersede(t, own, held)
		require.NoError(t, goleak.Find(before),
			"Supersede must close the connections it opened")
	})

	t.Run("SupersedeWithWatcher", func(t *testing.T) {
		// The clock never moves, so the Held never renews: only the
		// Watcher can end it.
		w, err := kubeadapter.NewWatcher(cs.CoordinationV1(), kubeadapter.WatchNamespaces(ns))
		require.NoError(t, err)
		wctx, stop := context.WithCancel(ctx)
		watched := make(chan error, 1)
		go func() { watched <- w.Start(wctx) }()
		t.Cleanup(func() { stop(); require.NoError(t, <-watched) })
		kcfg := kubeadapter.DefaultConfig(ns, "watched", "replica-a")
		kcfg.Clock, kcfg.Watcher = clocktesting.NewFakeClock(time.Now()), w
		e, err := kubeadapter.NewElector(cs.CoordinationV1(), kcfg)
		require.NoError(t, err)
		held, err := e.TryAcquire(ctx)
		require.NoError(t, err)
		t.Cleanup(func() { _ = held.Release(context.Background()) })

		kubefencertest.Supersede(t, cfg, held)
		select {
		case <-held.Done():
		case <-ctx.Done():
			t.Fatal("the Watcher never ended the superseded Held")
		}
		require.ErrorIs(t, held.Err(), kubeadapter.ErrLeaseTaken)
	})
}

// acquire acquires the Lease name in ns as "replica-a", on a fake clock
// that never moves and without a Watcher, so that the Held notices
// nothing by itself, and releases it when t ends.
// TestInstallLiveLeasePolicy installs the opt-in live-Lease policy on an
// API server of its own (it would change what TestKit's writes see): it
// returns once the policy is enforced, leaves no probe behind, and a
// second install fails.
func TestInstallLiveLeasePolicy(t *testing.T) {
	env := kubefencertest.APIServerForTest(t)
	cfg := env.Admin()
	cs, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	require.NoError(t, kubefencertest.InstallLiveLeasePolicy(ctx, cfg))
	_, err = cs.CoreV1().ConfigMaps(kubefencertest.ProbeNamespace).Get(ctx, "fencer-live-lease-probe", metav1.GetOptions{})
	require.True(t, apierrors.IsNotFound(err), "the probe ConfigMap must be deleted, got %v", err)
	_, err = cs.CoordinationV1().Leases(kubefencertest.ProbeNamespace).Get(ctx, "fencer-live-lease-probe", metav1.GetOptions{})
	require.True(t, apierrors.IsNotFound(err), "the probe Lease must be deleted, got %v", err)
	require.Error(t, kubefencertest.InstallLiveLeasePolicy(ctx, cfg), "a second install must fail, not pass unchecked")
}

func acquire(ctx context.Context, t *testing.T, cs kubernetes.Interface, name string) *kubeadapter.Held {
	kcfg := kubeadapter.DefaultConfig(ns, name, "replica-a")
	kcfg.Clock = clocktesting.NewFakeClock(time.Now())
	e, err := kubeadapter.NewElector(cs.CoordinationV1(), kcfg)
	require.NoError(t, err)
	held, err := e.TryAcquire(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = held.Release(context.Background()) })
	return held
}

// expired is a Held as it is once its renew deadline has passed: the
// Lease still names it, but it reports the loss.
type expired struct{ *kubeadapter.Held }

func (expired) Err() error {
	return &kubeadapter.LostError{Reason: kubeadapter.ErrRenewDeadline}
}

// recorder is a TB whose Fatalf records the message and ends the calling
// goroutine, as testing.T's does, without failing the test.
type recorder struct {
	*testing.T
	msg string
}

func (r *recorder) Fatalf(format string, args ...any) {
	r.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// refusal runs Supersede of h on a goroutine of its own with a recorder,
// and returns what its Fatalf said, or "" if it returned.
func refusal(t *testing.T, cfg *rest.Config, h kubeadapter.Holder) string {
	r := &recorder{T: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		kubefencertest.Supersede(r, cfg, h)
	}()
	<-done
	return r.msg
}
