package kubetest_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/fencer-dev/fencer/kubeadapter/deploy"
	"github.com/fencer-dev/fencer/kubeadapter/kubefencertest"
)

func TestEnv(t *testing.T) {
	env := kubefencertest.APIServerForTest(t)
	ctx := t.Context()
	admin := clientset(t, env.Admin())
	limited := clientset(t, env.Limited())

	_, err := admin.CoordinationV1().Leases(metav1.NamespaceDefault).Create(ctx, lease("by-admin"), metav1.CreateOptions{})
	require.NoError(t, err, "admin creates a Lease anywhere")

	for _, tc := range []struct {
		name    string
		do      func() error
		allowed bool
	}{
		{"create lease in namespace", func() error {
			_, err := limited.CoordinationV1().Leases(kubefencertest.LimitedNamespace).Create(ctx, lease("by-limited"), metav1.CreateOptions{})
			return err
		}, true},
		{"create configmap in namespace", func() error {
			_, err := limited.CoreV1().ConfigMaps(kubefencertest.LimitedNamespace).Create(ctx, configMap("by-limited", nil), metav1.CreateOptions{})
			return err
		}, true},
		{"list secrets in namespace", func() error {
			_, err := limited.CoreV1().Secrets(kubefencertest.LimitedNamespace).List(ctx, metav1.ListOptions{})
			return err
		}, false},
		{"create lease in another namespace", func() error {
			_, err := limited.CoordinationV1().Leases(metav1.NamespaceDefault).Create(ctx, lease("by-limited"), metav1.CreateOptions{})
			return err
		}, false},
		{"list namespaces", func() error {
			_, err := limited.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
			return err
		}, false},
	} {
		t.Run("limited/"+tc.name, func(t *testing.T) {
			err := tc.do()
			if tc.allowed {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			require.True(t, apierrors.IsForbidden(err), "want 403 Forbidden, got %v", err)
		})
	}
}

// TestDeployRole checks that deploy/rbac/role.yaml gives a controller's
// identity the Lease rights fencer needs and nothing more.
func TestDeployRole(t *testing.T) {
	env := kubefencertest.APIServerForTest(t)
	ctx := t.Context()
	admin := clientset(t, env.Admin())

	data, err := deploy.FS.ReadFile(deploy.Role)
	require.NoError(t, err)
	var role rbacv1.Role
	require.NoError(t, yaml.UnmarshalStrict(data, &role))
	role.Namespace = kubefencertest.LimitedNamespace
	_, err = admin.RbacV1().Roles(kubefencertest.LimitedNamespace).Create(ctx, &role, metav1.CreateOptions{})
	require.NoError(t, err)
	const user = "controller"
	_, err = admin.RbacV1().RoleBindings(kubefencertest.LimitedNamespace).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "fencer-controller"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)

	controller := clientset(t, env.Impersonate(user))
	leases := controller.CoordinationV1().Leases(kubefencertest.LimitedNamespace)
	// RBAC sees the new binding through a watch: wait until it does.
	var created *coordinationv1.Lease
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		var err error
		created, err = leases.Create(ctx, lease("fence"), metav1.CreateOptions{})
		assert.NoError(c, err, "create a Lease with the deploy Role")
	}, time.Minute, 50*time.Millisecond)

	_, err = leases.Get(ctx, created.Name, metav1.GetOptions{})
	require.NoError(t, err)
	_, err = leases.List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	w, err := leases.Watch(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	w.Stop()
	created.Spec.HolderIdentity = new("controller-0")
	_, err = leases.Update(ctx, created, metav1.UpdateOptions{})
	require.NoError(t, err)
	require.NoError(t, leases.Delete(ctx, created.Name, metav1.DeleteOptions{}))

	_, err = controller.CoreV1().ConfigMaps(kubefencertest.LimitedNamespace).Create(ctx, configMap("not-granted", nil), metav1.CreateOptions{})
	require.True(t, apierrors.IsForbidden(err), "want 403 Forbidden, got %v", err)
}

func clientset(t *testing.T, cfg *rest.Config) *kubernetes.Clientset {
	t.Helper()
	c, err := kubernetes.NewForConfig(cfg)
	require.NoError(t, err)
	return c
}

func lease(name string) *coordinationv1.Lease {
	return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name}}
}

func configMap(name string, annotations map[string]string) *corev1.ConfigMap {
	return &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: annotations},
		Data:       map[string]string{"owner": "fencer-test"},
	}
}
