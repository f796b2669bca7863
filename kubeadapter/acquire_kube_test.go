package kubeadapter_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/kubernetes"

	"github.com/fencer-dev/fencer/kubeadapter"
	"github.com/fencer-dev/fencer/kubeadapter/kubefencertest"
	"github.com/fencer-dev/fencer/kubeadapter/leader"
)

// TestAcquireTellsWhyItCannotLead runs electors that can never lead on the
// real API server (an identity without fencer's Role, a Lease namespace
// that does not exist) and checks that Acquire, and a Leader, return an
// *AcquireError at once, keeping the API error, and count it, instead of
// retrying silently. Granting the Role then lets the same identity lead.
func TestAcquireTellsWhyItCannotLead(t *testing.T) {
	t.Parallel()
	k := newKube(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	nobody, err := kubernetes.NewForConfig(k.Env.Impersonate("nobody"))
	require.NoError(t, err)

	reg := prometheus.NewRegistry()
	w, err := kubeadapter.NewWatcher(k.CS.CoordinationV1(), kubeadapter.WatchNamespaces(k.NS), kubeadapter.WithRegisterer(reg))
	require.NoError(t, err)
	count := func(reason string) float64 {
		return counterValue(t, reg, kubeadapter.MetricAcquireErrors, map[string]string{"lease": k.NS + "/fence", "reason": reason})
	}

	e, err := kubeadapter.NewElector(nobody.CoordinationV1(), slow(k, "nobody", w))
	require.NoError(t, err)
	_, err = e.Acquire(ctx)
	var ae *kubeadapter.AcquireError
	require.ErrorAs(t, err, &ae, "Acquire must give up, not wait for ctx")
	require.True(t, apierrors.IsForbidden(err), "%v", err)
	require.Equal(t, kubeadapter.AcquireForbidden, ae.Reason)
	require.Equal(t, 1.0, count(kubeadapter.AcquireForbidden))

	ldr, err := leader.New(e, leader.RunnableFunc(func(ctx context.Context, _ *kubeadapter.Held) error {
		t.Error("a runnable ran without the lease")
		return nil
	}))
	require.NoError(t, err)
	require.ErrorIs(t, ldr.Start(ctx), kubeadapter.ErrCannotAcquire, "a Leader that can never lead stops its manager")

	cfg := slow(k, "admin", nil)
	cfg.Namespace = k.NS + "-absent"
	e, err = kubeadapter.NewElector(k.CS.CoordinationV1(), cfg)
	require.NoError(t, err)
	_, err = e.Acquire(ctx)
	require.ErrorAs(t, err, &ae)
	require.Equal(t, kubeadapter.AcquireNotFound, ae.Reason)
	require.True(t, apierrors.IsNotFound(err), "%v", err)

	require.NoError(t, kubefencertest.InstallRole(ctx, k.Env.Admin(), k.NS, rbacv1.Subject{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "nobody"}))
	e, err = kubeadapter.NewElector(nobody.CoordinationV1(), slow(k, "nobody", w))
	require.NoError(t, err)
	require.Eventually(t, func() bool { // until the RoleBinding is in effect
		h, err := e.Acquire(ctx)
		if err == nil {
			require.NoError(t, h.Release(ctx))
		}
		return err == nil
	}, 30*time.Second, 50*time.Millisecond)
}

// counterValue returns the value of the counter name with exactly labels
// in g, or 0 when there is none.
func counterValue(t *testing.T, g prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			if len(m.GetLabel()) != len(labels) {
				continue
			}
			for _, l := range m.GetLabel() {
				if labels[l.GetName()] != l.GetValue() {
					continue metrics
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}
