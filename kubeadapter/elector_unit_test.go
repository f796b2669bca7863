package kubeadapter

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/fencer-dev/fencer/kubeadapter/internal/leasefake"
	"github.com/fencer-dev/fencer/token"
)

// These tests use client-go's fake clientset and a fake clock. They pin
// down exact timing decisions only; behaviour against a store is tested on
// a real kube-apiserver in kube_test.go.

var leasesGVR = leasefake.GVR

// fakeLeases is leasefake's clientset, whose Lease writes check and
// assign resourceVersions like the API server, with this package's
// helpers.
type fakeLeases struct{ *leasefake.Clientset }

func newFakeLeases(t *testing.T, objs ...runtime.Object) *fakeLeases {
	t.Helper()
	return &fakeLeases{leasefake.New(t, objs...)}
}

// edit changes the stored Lease as another writer would.
func (f *fakeLeases) edit(t *testing.T, change func(*coordinationv1.Lease)) {
	t.Helper()
	f.Mu.Lock()
	defer f.Mu.Unlock()
	cur, err := f.Tracker().Get(leasesGVR, "ns", "fence")
	require.NoError(t, err)
	l := cur.(*coordinationv1.Lease).DeepCopy()
	change(l)
	f.RV++
	l.ResourceVersion = strconv.FormatInt(f.RV, 10)
	require.NoError(t, f.Tracker().Update(leasesGVR, l, "ns"))
}

func (f *fakeLeases) get(t *testing.T) *coordinationv1.Lease {
	t.Helper()
	l, err := f.CoordinationV1().Leases("ns").Get(context.Background(), "fence", metav1.GetOptions{})
	require.NoError(t, err)
	return l
}

func testConfig(clk *clocktesting.FakeClock) Config {
	return Config{
		Namespace: "ns", Name: "fence", Identity: "me",
		LeaseDuration: 10 * time.Second, RenewDeadline: 6 * time.Second, RetryPeriod: 2 * time.Second,
		Clock: clk,
	}
}

func heldLease(holder string, transitions int32, renew time.Time) *coordinationv1.Lease {
	d := int32(10)
	t := metav1.NewMicroTime(renew)
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "fence", ResourceVersion: "50", UID: "uid-50"},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity: &holder, LeaseDurationSeconds: &d, LeaseTransitions: &transitions,
			AcquireTime: &t, RenewTime: &t,
		},
	}
}

func TestConfigValidate(t *testing.T) {
	ok := DefaultConfig("ns", "fence", "me")
	require.NoError(t, ok.Validate())
	for _, tc := range []struct {
		name   string
		change func(*Config)
		field  string
	}{
		{"bad namespace", func(c *Config) { c.Namespace = "Not_A_Label" }, "Namespace"},
		{"empty name", func(c *Config) { c.Name = "" }, "Name"},
		{"empty identity", func(c *Config) { c.Identity = "" }, "Identity"},
		{"sub-second lease", func(c *Config) { c.LeaseDuration = 500 * time.Millisecond }, "LeaseDuration"},
		{"fractional lease", func(c *Config) { c.LeaseDuration = 15500 * time.Millisecond }, "LeaseDuration"},
		{"zero renew deadline", func(c *Config) { c.RenewDeadline = 0 }, "RenewDeadline"},
		{"zero retry period", func(c *Config) { c.RetryPeriod = 0 }, "RetryPeriod"},
		{"renew deadline equals lease", func(c *Config) { c.RenewDeadline = c.LeaseDuration }, "RenewDeadline"},
		{"retry period too long", func(c *Config) { c.RetryPeriod = c.RenewDeadline }, "RetryPeriod"},
		{"jittered retry period too long", func(c *Config) { c.RenewDeadline = 12 * time.Second; c.RetryPeriod = 10 * time.Second }, "RetryPeriod"},
		{"bad label key", func(c *Config) { c.Labels = map[string]string{"not a key": "v"} }, "Labels"},
		{"bad label value", func(c *Config) { c.Labels = map[string]string{"k": "not a value"} }, "Labels"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := ok
			tc.change(&c)
			_, err := NewElector(fake.NewClientset().CoordinationV1(), c)
			var ce *ConfigError
			require.ErrorAs(t, err, &ce)
			require.ErrorIs(t, err, ErrInvalidConfig)
			require.Equal(t, tc.field, ce.Field)
		})
	}
	_, err := NewElector(nil, ok)
	require.ErrorIs(t, err, ErrInvalidConfig)
}

// TestExpiryByObservedTime checks that a candidate judges another
// holder's lease by how long it has observed the record unchanged on its
// own clock: a renewTime far in the future does not extend the lease, a
// renewTime far in the past does not shorten it, and any change to the
// record restarts the wait.
func TestExpiryByObservedTime(t *testing.T) {
	for _, tc := range []struct {
		name  string
		renew time.Duration // holder's renewTime relative to the candidate's clock
	}{
		{"renewTime in the future", time.Hour},
		{"renewTime in the past", -time.Hour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
			f := newFakeLeases(t, heldLease("other", 4, clk.Now().Add(tc.renew)))
			e, err := NewElector(f.CoordinationV1(), testConfig(clk))
			require.NoError(t, err)
			ctx := context.Background()

			requireHeldByOther := func() {
				t.Helper()
				_, err := e.TryAcquire(ctx)
				var he *token.HeldError
				require.ErrorAs(t, err, &he)
				require.ErrorIs(t, err, token.ErrHeldByAnother)
				require.Equal(t, "other", he.Holder)
				require.Equal(t, "ns/fence", he.Lease)
			}
			requireHeldByOther() // first observation at t0
			clk.Step(10*time.Second - time.Millisecond)
			requireHeldByOther()

			// The holder renews at t0+9.999s: the wait starts again.
			f.edit(t, func(l *coordinationv1.Lease) {
				r := metav1.NewMicroTime(clk.Now().Add(tc.renew))
				l.Spec.RenewTime = &r
			})
			requireHeldByOther()
			clk.Step(10*time.Second - time.Millisecond)
			requireHeldByOther()
			clk.Step(time.Millisecond) // LeaseDuration after the change was observed

			h, err := e.TryAcquire(ctx)
			require.NoError(t, err)
			defer h.Release(ctx)
			l := f.get(t)
			require.Equal(t, e.Identity(), *l.Spec.HolderIdentity)
			require.Equal(t, int32(5), *l.Spec.LeaseTransitions)
			require.Equal(t, token.Token{Lease: "ns/fence", Epoch: 5, Revision: mustRev(t, l.ResourceVersion)}, h.Token())
		})
	}
}

// waitForRenewLoop waits until the renewal loop has armed its timer, next
// to the renew deadline's, so that stepping the clock triggers a renewal.
func waitForRenewLoop(t *testing.T, clk *clocktesting.FakeClock) {
	t.Helper()
	require.Eventually(t, func() bool { return clk.Waiters() == 2 }, 5*time.Second, time.Millisecond)
}

func mustRev(t *testing.T, rv string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(rv, 10, 64)
	require.NoError(t, err)
	return n
}

// TestRenewDeadlineFailsClosed checks that a holder whose renewals fail
// stops holding exactly RenewDeadline after the start of its last
// successful write, on its own clock, and not before.
func TestRenewDeadlineFailsClosed(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	f := newFakeLeases(t)
	cfg := testConfig(clk)
	e, err := NewElector(f.CoordinationV1(), cfg)
	require.NoError(t, err)
	ctx := context.Background()
	h, err := e.TryAcquire(ctx)
	require.NoError(t, err)
	defer h.Release(ctx)
	require.Equal(t, uint64(0), h.Token().Epoch, "a created Lease starts at leaseTransitions 0")

	f.SetFailing(true)
	for range 2 { // renewals at +2s and +4s fail
		clk.Step(cfg.RetryPeriod)
		require.NoError(t, h.Err())
	}
	clk.Step(cfg.RenewDeadline - 2*cfg.RetryPeriod - time.Millisecond)
	require.NoError(t, h.Err(), "ended before the renew deadline")
	clk.Step(time.Millisecond)
	err = h.Err()
	require.ErrorIs(t, err, ErrRenewDeadline)
	require.ErrorIs(t, err, token.ErrNotHeld)
	require.ErrorIs(t, context.Cause(h.Context()), ErrRenewDeadline)
	select {
	case <-h.Done():
	default:
		t.Fatal("Done not closed")
	}
	// The deadline ended the Held before any other candidate could take
	// over: the record is still this acquisition's.
	require.Equal(t, e.Identity(), *f.get(t).Spec.HolderIdentity)

	// Another acquisition by the same Elector is a new, greater token.
	f.SetFailing(false)
	h2, err := e.TryAcquire(ctx)
	require.NoError(t, err)
	defer h2.Release(ctx)
	require.Equal(t, uint64(1), h2.Token().Epoch)
	require.Greater(t, h2.Token().Revision, h.Token().Revision)
	_, err = e.TryAcquire(ctx)
	require.ErrorIs(t, err, ErrAlreadyHeld)
}

// TestRenewDetectsLoss checks that the renewal after a change ends the Held
// with the reason of the change.
func TestRenewDetectsLoss(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(t *testing.T, f *fakeLeases)
		want   error
	}{
		{"taken", func(t *testing.T, f *fakeLeases) {
			f.edit(t, func(l *coordinationv1.Lease) {
				other := "other"
				n := *l.Spec.LeaseTransitions + 1
				l.Spec.HolderIdentity, l.Spec.LeaseTransitions = &other, &n
			})
		}, ErrLeaseTaken},
		{"released by someone else", func(t *testing.T, f *fakeLeases) {
			f.edit(t, func(l *coordinationv1.Lease) { none := ""; l.Spec.HolderIdentity = &none })
		}, ErrLeaseTaken},
		{"deleted", func(t *testing.T, f *fakeLeases) {
			require.NoError(t, f.Tracker().Delete(leasesGVR, "ns", "fence"))
		}, ErrLeaseDeleted},
		{"replaced", func(t *testing.T, f *fakeLeases) {
			f.edit(t, func(l *coordinationv1.Lease) { l.UID = "another-uid" })
		}, ErrLeaseReplaced},
		{"label added", func(t *testing.T, f *fakeLeases) {
			f.edit(t, func(l *coordinationv1.Lease) { l.Labels = map[string]string{"a": "b"} })
		}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk, f, cfg, h := heldOnFake(t)

			tc.change(t, f)
			waitForRenewLoop(t, clk)
			clk.Step(cfg.RetryPeriod)
			if tc.want == nil {
				require.Eventually(t, func() bool {
					l := f.get(t)
					return l.Labels["a"] == "b" && l.Spec.RenewTime.Time.Equal(clk.Now())
				}, 5*time.Second, time.Millisecond, "renewal did not adopt the edited record")
				require.NoError(t, h.Err())
				return
			}
			select {
			case <-h.Done():
			case <-time.After(5 * time.Second):
				t.Fatal("Held did not end")
			}
			require.ErrorIs(t, h.Err(), tc.want)
			require.ErrorIs(t, h.Err(), token.ErrNotHeld)
			var le *LostError
			require.ErrorAs(t, h.Err(), &le)
			require.Equal(t, h.Token(), le.Token)
		})
	}
}

// TestReleaseNeverClobbers checks that Release leaves alone a Lease that
// another acquisition has taken.
func TestReleaseNeverClobbers(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	f := newFakeLeases(t)
	e, err := NewElector(f.CoordinationV1(), testConfig(clk))
	require.NoError(t, err)
	ctx := context.Background()
	h, err := e.TryAcquire(ctx)
	require.NoError(t, err)
	f.edit(t, func(l *coordinationv1.Lease) {
		other := "other"
		n := *l.Spec.LeaseTransitions + 1
		l.Spec.HolderIdentity, l.Spec.LeaseTransitions = &other, &n
	})
	require.NoError(t, h.Release(ctx))
	require.ErrorIs(t, h.Err(), ErrReleased)
	require.Equal(t, "other", *f.get(t).Spec.HolderIdentity)
	require.NoError(t, h.Release(ctx), "second Release")
}

// TestLostErrorMatchesSharedEndings checks that a Held's end matches the
// token package's ending it is a case of, as an etcdstore.Lease's and a
// client.Lease's do, and no other.
func TestLostErrorMatchesSharedEndings(t *testing.T) {
	shared := []error{token.ErrReleased, token.ErrLeaseLost, token.ErrSessionExpired, token.ErrSessionClosed}
	for _, tc := range []struct {
		reason, want error
	}{
		{ErrReleased, token.ErrReleased},
		{ErrLeaseTaken, token.ErrLeaseLost},
		{ErrLeaseDeleted, token.ErrLeaseLost},
		{ErrLeaseReplaced, token.ErrLeaseLost},
		{ErrRenewDeadline, token.ErrSessionExpired},
	} {
		t.Run(tc.reason.Error(), func(t *testing.T) {
			err := error(&LostError{Token: token.Token{Lease: "ns/fence", Revision: 1}, Reason: tc.reason})
			require.ErrorIs(t, err, token.ErrNotHeld)
			require.ErrorIs(t, err, tc.reason)
			for _, s := range shared {
				require.Equal(t, s == tc.want, errors.Is(err, s), "errors.Is(%v, %v)", err, s)
			}
		})
	}
}

// heldOnFake acquires the Lease of testConfig on a new fake clientset,
// on a fake clock, and releases it when t ends.
func heldOnFake(t *testing.T) (*clocktesting.FakeClock, *fakeLeases, Config, *Held) {
	t.Helper()
	clk := clocktesting.NewFakeClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	f := newFakeLeases(t)
	cfg := testConfig(clk)
	e, err := NewElector(f.CoordinationV1(), cfg)
	require.NoError(t, err)
	h, err := e.TryAcquire(context.Background())
	require.NoError(t, err)
	t.Cleanup(func() { _ = h.Release(context.Background()) })
	return clk, f, cfg, h
}

// TestHeldRenewWithMutation checks Held.Renew's contract: a renewal now
// that carries the mutation, which the Held adopts so that its own later
// renewals keep it; after a conflict with a write that is still this
// acquisition it applies the mutation again over the adopted record; a
// record that is no longer this acquisition ends the Held; an API error
// is returned and ends nothing; and an ended Held is not renewed.
func TestHeldRenewWithMutation(t *testing.T) {
	mark := func(l *coordinationv1.Lease) {
		if l.Annotations == nil {
			l.Annotations = map[string]string{}
		}
		l.Annotations["mark"] = "set"
	}
	for _, tc := range []struct {
		name    string
		before  func(t *testing.T, f *fakeLeases, h *Held)
		wantErr error // nil: the renewal lands
		ended   bool
	}{
		{"lands", func(*testing.T, *fakeLeases, *Held) {}, nil, false},
		{"conflict with our own record", func(t *testing.T, f *fakeLeases, _ *Held) {
			f.edit(t, func(l *coordinationv1.Lease) { l.Labels = map[string]string{"a": "b"} })
		}, nil, false},
		{"taken", func(t *testing.T, f *fakeLeases, _ *Held) {
			f.edit(t, func(l *coordinationv1.Lease) {
				other := "other"
				n := *l.Spec.LeaseTransitions + 1
				l.Spec.HolderIdentity, l.Spec.LeaseTransitions = &other, &n
			})
		}, ErrLeaseTaken, true},
		{"server failing", func(_ *testing.T, f *fakeLeases, _ *Held) { f.SetFailing(true) }, nil, false},
		{"released", func(t *testing.T, _ *fakeLeases, h *Held) {
			require.NoError(t, h.Release(context.Background()))
		}, ErrReleased, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk, f, cfg, h := heldOnFake(t)

			tc.before(t, f, h)
			ctx := context.Background()
			err := h.Renew(ctx, mark)
			switch {
			case tc.name == "server failing":
				require.Error(t, err)
				require.NotErrorIs(t, err, token.ErrNotHeld)
				require.NoError(t, h.Err(), "a failed write ended the Held")
				f.SetFailing(false)
				return
			case tc.wantErr != nil:
				require.ErrorIs(t, err, tc.wantErr)
				require.ErrorIs(t, err, token.ErrNotHeld)
				require.Equal(t, tc.ended, h.Err() != nil)
				return
			}
			require.NoError(t, err)
			require.NoError(t, h.Err())
			stored := f.get(t)
			require.Equal(t, "set", stored.Annotations["mark"], "the renewal did not carry the mutation")
			require.Equal(t, stored.ResourceVersion, h.Lease().ResourceVersion, "the Held did not adopt its renewal")
			if tc.name == "conflict with our own record" {
				require.Equal(t, "b", stored.Labels["a"], "the retry wrote over the other field's change")
			}

			// The Held's own next renewal keeps what the mutation set.
			waitForRenewLoop(t, clk)
			clk.Step(cfg.RetryPeriod)
			require.Eventually(t, func() bool {
				l := f.get(t)
				return l.Spec.RenewTime.Time.Equal(clk.Now()) && l.ResourceVersion != stored.ResourceVersion
			}, 5*time.Second, time.Millisecond, "the loop did not renew")
			require.Equal(t, "set", f.get(t).Annotations["mark"], "the loop's renewal dropped the mutation")
			require.NoError(t, h.Err())
		})
	}
}
