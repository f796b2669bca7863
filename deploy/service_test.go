package deploy_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"github.com/fencer-dev/fencer/kubeadapter/kubefencertest"
)

// render builds the kustomization in dir with kustomize's own library.
func render(t *testing.T, dir string) []*unstructured.Unstructured {
	t.Helper()
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	require.NoError(t, err)
	var objs []*unstructured.Unstructured
	for _, r := range m.Resources() {
		fields, err := r.Map()
		require.NoError(t, err)
		objs = append(objs, &unstructured.Unstructured{Object: fields})
	}
	return objs
}

// TestServiceManifests renders deploy/service with kustomize, applies every
// object with server-side apply to a real kube-apiserver, which admits
// them, and checks what was stored: the Service, PodDisruptionBudget and
// NetworkPolicy select the Deployment's pods, the pods run as non-root on a
// read-only root filesystem, and the probes use the metrics port's /healthz
// and /readyz.
func TestServiceManifests(t *testing.T) {
	objs := render(t, "service")
	kinds := map[string]bool{}
	for _, o := range objs {
		kinds[o.GetKind()] = true
	}
	for _, k := range []string{"Namespace", "ServiceAccount", "Deployment", "Service", "PodDisruptionBudget", "NetworkPolicy"} {
		require.True(t, kinds[k], "the kustomization renders no %s", k)
	}

	env := kubefencertest.APIServerForTest(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dc, err := discovery.NewDiscoveryClientForConfig(env.Admin())
	require.NoError(t, err)
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	dyn, err := dynamic.NewForConfig(env.Admin())
	require.NoError(t, err)
	for _, o := range objs {
		gvk := o.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		require.NoError(t, err, gvk)
		var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if o.GetNamespace() != "" {
			ri = dyn.Resource(m.Resource).Namespace(o.GetNamespace())
		}
		_, err = ri.Apply(ctx, o.GetName(), o, metav1.ApplyOptions{FieldManager: "fencer-deploy-test"})
		require.NoError(t, err, "%s %s was refused", gvk.Kind, o.GetName())
	}

	cs, err := kubernetes.NewForConfig(env.Admin())
	require.NoError(t, err)
	const ns, name = "fencer", "fencer"
	dep, err := cs.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{})
	require.NoError(t, err)
	podLabels := labels.Set(dep.Spec.Template.Labels)
	selects := func(what string, sel *metav1.LabelSelector) {
		t.Helper()
		require.NotNil(t, sel, what)
		require.NotEmpty(t, sel.MatchLabels, "%s selects every pod of the namespace", what)
		s, err := metav1.LabelSelectorAsSelector(sel)
		require.NoError(t, err)
		require.True(t, s.Matches(podLabels), "%s does not select the pods", what)
	}
	selects("the Deployment", dep.Spec.Selector)
	svc, err := cs.CoreV1().Services(ns).Get(ctx, name, metav1.GetOptions{})
	require.NoError(t, err)
	require.NotEmpty(t, svc.Spec.Selector)
	require.True(t, labels.SelectorFromSet(svc.Spec.Selector).Matches(podLabels), "the Service does not select the pods")
	pdb, err := cs.PolicyV1().PodDisruptionBudgets(ns).Get(ctx, name, metav1.GetOptions{})
	require.NoError(t, err)
	selects("the PodDisruptionBudget", pdb.Spec.Selector)
	np, err := cs.NetworkingV1().NetworkPolicies(ns).Get(ctx, name, metav1.GetOptions{})
	require.NoError(t, err)
	selects("the NetworkPolicy", &np.Spec.PodSelector)
	checkPodSpec(t, dep)
	checkPolicies(t, pdb, np)
	sa, err := cs.CoreV1().ServiceAccounts(ns).Get(ctx, dep.Spec.Template.Spec.ServiceAccountName, metav1.GetOptions{})
	require.NoError(t, err)
	require.False(t, *sa.AutomountServiceAccountToken)
}

func checkPodSpec(t *testing.T, dep *appsv1.Deployment) {
	t.Helper()
	pod := dep.Spec.Template.Spec
	require.True(t, *pod.SecurityContext.RunAsNonRoot)
	require.NotZero(t, *pod.SecurityContext.RunAsUser)
	require.False(t, *pod.AutomountServiceAccountToken)
	require.Len(t, pod.Containers, 1)
	c := pod.Containers[0]
	require.True(t, *c.SecurityContext.ReadOnlyRootFilesystem)
	require.False(t, *c.SecurityContext.AllowPrivilegeEscalation)
	require.Equal(t, []corev1.Capability{"ALL"}, c.SecurityContext.Capabilities.Drop)
	require.NotNil(t, c.Resources.Requests.Cpu())
	require.False(t, c.Resources.Limits.Memory().IsZero(), "no memory limit")
	for probe, path := range map[*corev1.Probe]string{c.LivenessProbe: "/healthz", c.StartupProbe: "/healthz", c.ReadinessProbe: "/readyz"} {
		require.NotNil(t, probe)
		require.Equal(t, path, probe.HTTPGet.Path)
		require.Equal(t, "metrics", probe.HTTPGet.Port.String())
	}
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	require.Contains(t, c.Args, "--metrics-listen=0.0.0.0:7891")
	require.Equal(t, int32(7891), ports["metrics"])
	require.Contains(t, c.Args, "--listen=0.0.0.0:7890")
	require.Equal(t, int32(7890), ports["grpc"])
}

func checkPolicies(t *testing.T, pdb *policyv1.PodDisruptionBudget, np *networkingv1.NetworkPolicy) {
	t.Helper()
	require.Equal(t, 1, pdb.Spec.MinAvailable.IntValue())
	require.ElementsMatch(t, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}, np.Spec.PolicyTypes)
}
