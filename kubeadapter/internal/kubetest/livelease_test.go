package kubetest_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/fencer-dev/fencer/kubeadapter/kubefencertest"
)

// liveDenial is the start of the message of a write the live-Lease policy
// denies.
const liveDenial = "superseded fencing epoch"

// TestLiveLeasePolicy checks what deploy/admission/live-lease.yaml lets
// through. The Lease kubefencertest.LimitedNamespace/fence moves from leaseTransitions 1
// to 2, as an acquisition does, and every case then writes, with dry-run,
// objects that no newer holder has touched. Each case runs first without
// the policy, where every write passes (so a denial below is the policy's
// doing), and then with it.
func TestLiveLeasePolicy(t *testing.T) {
	env := kubefencertest.APIServerForTest(t)
	ctx := t.Context()
	admin := clientset(t, env.Admin())
	const ns, other, nsObj = kubefencertest.LimitedNamespace, "live-other", "live-stamped-ns"
	fence := ns + "/fence"

	for _, name := range []string{other, nsObj} {
		_, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	createLiveLease(t, admin, ns, "fence", true, ptr(int32(1)))
	createLiveLease(t, admin, ns, "unlabelled", false, ptr(int32(5)))
	createLiveLease(t, admin, ns, "no-transitions", true, nil)
	createLiveLease(t, admin, other, "fence", true, ptr(int32(7)))
	createLiveLease(t, admin, nsObj, "fence", true, ptr(int32(3)))

	cms := admin.CoreV1().ConfigMaps(ns)
	_, err := cms.Create(ctx, configMap("o", liveStamp(fence, "1")), metav1.CreateOptions{})
	require.NoError(t, err)
	deploys := admin.AppsV1().Deployments(ns)
	_, err = deploys.Create(ctx, liveDeployment("d", liveStamp(fence, "1")), metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = admin.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "live-stamped"}}, metav1.CreateOptions{})
	require.NoError(t, err)

	// An acquisition: the Lease's transitions move, and the objects above
	// carry a superseded epoch.
	l, err := admin.CoordinationV1().Leases(ns).Get(ctx, "fence", metav1.GetOptions{})
	require.NoError(t, err)
	l.Spec.LeaseTransitions = ptr(int32(2))
	_, err = admin.CoordinationV1().Leases(ns).Update(ctx, l, metav1.UpdateOptions{})
	require.NoError(t, err)

	dry := []string{metav1.DryRunAll}
	restamp := func(annotations map[string]string) func(context.Context) error {
		return func(ctx context.Context) error {
			cm, err := cms.Get(ctx, "o", metav1.GetOptions{})
			if err != nil {
				return err
			}
			cm.Annotations = annotations
			cm.Data = map[string]string{"by": "update"}
			_, err = cms.Update(ctx, cm, metav1.UpdateOptions{DryRun: dry})
			return err
		}
	}
	create := func(namespace string, annotations map[string]string) func(context.Context) error {
		return func(ctx context.Context) error {
			_, err := admin.CoreV1().ConfigMaps(namespace).Create(ctx, configMap("new", annotations), metav1.CreateOptions{DryRun: dry})
			return err
		}
	}
	cases := []struct {
		name   string
		write  func(context.Context) error
		denied bool
	}{
		{name: "stale update", write: restamp(liveStamp(fence, "1")), denied: true},
		{name: "stale create (resurrection)", write: create(ns, liveStamp(fence, "1")), denied: true},
		{name: "epoch missing", write: create(ns, map[string]string{"fencer.dev/lease": fence, "fencer.dev/token": "9"}), denied: true},
		{name: "epoch not canonical", write: create(ns, liveStamp(fence, "02")), denied: true},
		{name: "epoch ahead of the Lease", write: create(ns, liveStamp(fence, "3")), denied: true},
		{name: "current update", write: restamp(liveStamp(fence, "2"))},
		{name: "current create", write: create(ns, liveStamp(fence, "2"))},
		{name: "unstamped update", write: restamp(map[string]string{"team": "a"})},
		{name: "unstamped create", write: create(ns, nil)},
		{name: "Lease in another namespace not consulted", write: create(ns, liveStamp(other+"/fence", "1"))},
		{name: "that Lease consulted in its own namespace", write: create(other, liveStamp(other+"/fence", "1")), denied: true},
		{name: "Lease without the label not consulted", write: create(ns, liveStamp(ns+"/unlabelled", "1"))},
		{name: "absent Lease", write: create(ns, liveStamp(ns+"/absent", "1"))},
		{name: "no leaseTransitions counts as 0", write: create(ns, liveStamp(ns+"/no-transitions", "0"))},
		{name: "no leaseTransitions, epoch 1", write: create(ns, liveStamp(ns+"/no-transitions", "1")), denied: true},
		{name: "stale status update", denied: true, write: func(ctx context.Context) error {
			d, err := deploys.Get(ctx, "d", metav1.GetOptions{})
			if err != nil {
				return err
			}
			d.Status.ObservedGeneration = d.Generation
			_, err = deploys.UpdateStatus(ctx, d, metav1.UpdateOptions{DryRun: dry})
			return err
		}},
		{name: "scale not checked: no annotations", write: func(ctx context.Context) error {
			_, err := deploys.UpdateScale(ctx, "d", &autoscalingv1.Scale{
				ObjectMeta: metav1.ObjectMeta{Name: "d", Namespace: ns},
				Spec:       autoscalingv1.ScaleSpec{Replicas: 3},
			}, metav1.UpdateOptions{DryRun: dry})
			return err
		}},
		{name: "cluster-scoped create", write: func(ctx context.Context) error {
			_, err := admin.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
				ObjectMeta: metav1.ObjectMeta{Name: "live-new", Annotations: liveStamp(fence, "1")},
			}, metav1.CreateOptions{DryRun: dry})
			return err
		}},
		{name: "cluster-scoped update", write: func(ctx context.Context) error {
			cr, err := admin.RbacV1().ClusterRoles().Get(ctx, "live-stamped", metav1.GetOptions{})
			if err != nil {
				return err
			}
			cr.Annotations = liveStamp(fence, "1")
			_, err = admin.RbacV1().ClusterRoles().Update(ctx, cr, metav1.UpdateOptions{DryRun: dry})
			return err
		}},
		{name: "namespace stamped with its own Lease", write: func(ctx context.Context) error {
			n, err := admin.CoreV1().Namespaces().Get(ctx, nsObj, metav1.GetOptions{})
			if err != nil {
				return err
			}
			n.Annotations = liveStamp(nsObj+"/fence", "1")
			_, err = admin.CoreV1().Namespaces().Update(ctx, n, metav1.UpdateOptions{DryRun: dry})
			return err
		}},
		{name: "object in that namespace", write: create(nsObj, liveStamp(nsObj+"/fence", "1")), denied: true},
		{name: "delete not checked", write: func(ctx context.Context) error {
			return cms.Delete(ctx, "o", metav1.DeleteOptions{DryRun: dry})
		}},
	}
	for _, tc := range cases {
		t.Run("without policy/"+tc.name, func(t *testing.T) {
			require.NoError(t, tc.write(ctx))
		})
	}
	installLiveLeasePolicy(t, env)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.write(ctx)
			if !tc.denied {
				require.NoError(t, err)
				return
			}
			require.True(t, apierrors.IsForbidden(err), "want 403 Forbidden, got %v", err)
			require.ErrorContains(t, err, liveDenial)
		})
	}
}

// installLiveLeasePolicy installs the shipped live-Lease policy and waits
// until it is enforced.
func installLiveLeasePolicy(t *testing.T, env *kubefencertest.APIServer) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	start := time.Now()
	require.NoError(t, kubefencertest.InstallLiveLeasePolicy(ctx, env.Admin()))
	t.Logf("live-Lease policy enforced after %v", time.Since(start).Round(time.Millisecond))
}

// createLiveLease creates the Lease namespace/name, labelled
// fencer.dev/fence: "true" when fence is set, at the given
// leaseTransitions (nil: unset).
func createLiveLease(t *testing.T, admin *kubernetes.Clientset, namespace, name string, fence bool, transitions *int32) {
	t.Helper()
	l := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       coordinationv1.LeaseSpec{LeaseTransitions: transitions},
	}
	if fence {
		l.Labels = map[string]string{"fencer.dev/fence": "true"}
	}
	_, err := admin.CoordinationV1().Leases(namespace).Create(t.Context(), l, metav1.CreateOptions{})
	require.NoError(t, err)
}

// liveStamp returns a stamp of lease with the given epoch and token 10.
func liveStamp(lease, epoch string) map[string]string {
	return map[string]string{"fencer.dev/lease": lease, "fencer.dev/token": "10", "fencer.dev/epoch": epoch}
}

// liveDeployment returns a Deployment with the given annotations.
func liveDeployment(name string, annotations map[string]string) *appsv1.Deployment {
	labels := map[string]string{"app": name}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: annotations},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "example.invalid/c"}}},
			},
		},
	}
}

func ptr[T any](v T) *T { return &v }
