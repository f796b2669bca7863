package kubefencertest_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/fencer-dev/fencer/kubeadapter"
	"github.com/fencer-dev/fencer/kubeadapter/kubefencertest"
)

// TestEnvtest runs the kit on controller-runtime's envtest, as a user's
// suite would: envtest starts the repository's kube-apiserver and etcd
// binaries (BinaryForTest, EtcdForTest). On that
// envtest Config it installs the policy and the Role, supersedes a Held,
// and checks that the API server itself denies the old holder's stamped
// write.
func TestEnvtest(t *testing.T) {
	apiserver := kubefencertest.BinaryForTest(t)
	etcd := kubefencertest.EtcdForTest(t)

	env := &envtest.Environment{ControlPlaneStartTimeout: time.Minute, ControlPlaneStopTimeout: 20 * time.Second}
	env.ControlPlane.APIServer = &envtest.APIServer{Path: apiserver}
	env.ControlPlane.Etcd = &envtest.Etcd{Path: etcd}
	cfg, err := env.Start()
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, env.Stop()) })

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	cs, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)
	require.NoError(t, kubefencertest.InstallPolicy(ctx, cfg))
	const sa = "controller"
	require.NoError(t, kubefencertest.InstallRole(ctx, cfg, metav1.NamespaceDefault,
		rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Namespace: metav1.NamespaceDefault, Name: sa}))

	e, err := kubeadapter.NewElector(cs.CoordinationV1(), kubeadapter.DefaultConfig(metav1.NamespaceDefault, "envtest", "replica-a"))
	require.NoError(t, err)
	held, err := e.TryAcquire(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = held.Release(context.Background()) })
	cms := cs.CoreV1().ConfigMaps(metav1.NamespaceDefault)
	cm, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
		Name:        "orders",
		Annotations: held.Token().Stamp(nil),
	}}, metav1.CreateOptions{})
	require.NoError(t, err)

	taken := kubefencertest.Supersede(t, cfg, held)
	cm.Annotations = taken.Token().Stamp(nil)
	cm, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
	require.NoError(t, err, "the new holder's stamp is admitted")
	cm.Annotations = held.Token().Stamp(nil)
	_, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
	require.True(t, apierrors.IsForbidden(err), "the old holder's stamp must be denied by the API server, got %v", err)
	require.ErrorContains(t, err, "stale fencing token")
}
