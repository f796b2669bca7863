package kubeadapter_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fencer-dev/fencer/kubeadapter"
	"github.com/fencer-dev/fencer/kubeadapter/internal/kubetest"
	"github.com/fencer-dev/fencer/kubeadapter/kubefencertest"
)

// TestElectorLabelsLease checks that the Lease an Elector acquires carries
// the fence label, whether the Elector creates it or acquires an existing
// Lease without the label, whose other labels are kept.
func TestElectorLabelsLease(t *testing.T) {
	t.Parallel()
	k := newKube(t)
	ctx := t.Context()
	leases := k.CS.CoordinationV1().Leases(k.NS)

	acquire(t, k.Elector(t, "creator"))
	created, err := leases.Get(ctx, "fence", metav1.GetOptions{})
	require.NoError(t, err)
	require.Equal(t, kubeadapter.FenceLabelValue, created.Labels[kubeadapter.FenceLabel])

	_, err = leases.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{
		Name: "unlabelled", Labels: map[string]string{"team": "a"},
	}}, metav1.CreateOptions{})
	require.NoError(t, err)
	cfg := k.Fast("acquirer")
	cfg.Name = "unlabelled"
	e, err := kubeadapter.NewElector(k.CS.CoordinationV1(), cfg)
	require.NoError(t, err)
	acquire(t, e)
	got, err := leases.Get(ctx, "unlabelled", metav1.GetOptions{})
	require.NoError(t, err)
	require.Equal(t, map[string]string{"team": "a", kubeadapter.FenceLabel: kubeadapter.FenceLabelValue}, got.Labels)
}

// TestLiveLeaseTakeover is the case the live-Lease policy exists for:
// holder A stamps object O, B takes the Lease over and never touches O,
// and A, which has not noticed, writes O again. The per-object check lets
// A through, since O carries A's own token; without the policy the write
// lands, and with it the API server refuses it, and A's creates too,
// including an apply that would create again an object B deleted.
func TestLiveLeaseTakeover(t *testing.T) {
	k := kubetest.LiveKube(t)
	ctx := t.Context()
	ea, stallA := stallableElector(k, t, "replica-a")
	ha := acquire(t, ea)
	a := k.Client(t, staticHolder{Tok: ha.Token()}) // A, not noticing its loss
	require.NoError(t, a.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: k.NS, Name: "o"}, Data: map[string]string{"by": "a"}}))

	stallA.Stalled.Store(true)
	hb := acquire(t, k.Elector(t, "replica-b"))
	requireGreater(t, hb.Token(), ha.Token())
	require.Greater(t, hb.Token().Epoch, ha.Token().Epoch)

	write := func(by string) error {
		o := k.ConfigMap(t, "o")
		o.Data["by"] = by
		return a.Update(ctx, o)
	}
	create := func(name string) error {
		return a.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: k.NS, Name: name}})
	}
	// An apply whose reads find no object creates it: the one stale write
	// of an apply that fencer's own preconditions cannot refuse.
	applyNew := func(name string) error {
		return a.Apply(ctx, corev1ac.ConfigMap(name, k.NS).WithData(map[string]string{"by": "a"}), client.FieldOwner("a"))
	}
	// Without the policy the harness bites: A's late writes land.
	require.NoError(t, write("a-late"))
	require.NoError(t, create("a-new"))
	require.NoError(t, applyNew("a-applied"))
	require.Equal(t, "a-late", k.ConfigMap(t, "o").Data["by"])

	k.InstallLiveLease(t)
	before := k.ConfigMap(t, "o").ResourceVersion
	err := write("a-later")
	require.True(t, apierrors.IsForbidden(err), "stale update through the fenced client: %v", err)
	require.ErrorContains(t, err, kubefencertest.LiveLeasePolicy)
	err = create("a-resurrected")
	require.True(t, apierrors.IsForbidden(err), "stale create through the fenced client: %v", err)
	require.ErrorContains(t, err, kubefencertest.LiveLeasePolicy)
	// B deletes the object A applied; A's reads then find nothing, and
	// its apply would create the object again with A's superseded stamp.
	require.NoError(t, k.Client(t, hb).Delete(ctx, k.ConfigMap(t, "a-applied")))
	err = applyNew("a-applied")
	require.True(t, apierrors.IsForbidden(err), "stale create by apply after a delete: %v", err)
	require.ErrorContains(t, err, kubefencertest.LiveLeasePolicy)
	require.True(t, apierrors.IsNotFound(k.CRC.Get(ctx, client.ObjectKey{Namespace: k.NS, Name: "a-applied"}, &corev1.ConfigMap{})), "the deleted object was recreated")
	raw := k.ConfigMap(t, "o")
	raw.Data["by"] = "a-raw"
	_, err = k.CS.CoreV1().ConfigMaps(k.NS).Update(ctx, raw, metav1.UpdateOptions{})
	require.True(t, apierrors.IsForbidden(err), "raw stale update: %v", err)
	require.ErrorContains(t, err, kubefencertest.LiveLeasePolicy)
	require.Equal(t, before, k.ConfigMap(t, "o").ResourceVersion)

	// B, the current holder, writes O and creates objects.
	b := k.Client(t, hb)
	o := k.ConfigMap(t, "o")
	o.Data["by"] = "b"
	require.NoError(t, b.Update(ctx, o))
	require.NoError(t, b.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: k.NS, Name: "b-new"}}))
	require.Equal(t, "b", k.ConfigMap(t, "o").Data["by"])

	stallA.Stalled.Store(false)
}
