package kubetest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/fencer-dev/fencer/kubeadapter/kubefencertest"
)

// rawAttack is a hostile raw writer's attempt to store a token of lease
// fence lower than the 100 that the object named name carries, or to
// erase it. It returns the write's error.
type rawAttack struct {
	name string
	// kind is "configmap" or "pod": the object attacked.
	kind  string
	write func(ctx context.Context, cs *kubernetes.Clientset, name string) error
	// lowers is the annotation the attack lowers or removes, and its value
	// after a successful attack ("" when removed).
	key, after string
}

// TestRawWriterAttacks runs every raw write that can lower a stamp, through
// every write method of the API: first without the admission policy, where
// each must land (so the attack is real and the test bites), then with it,
// where each must be refused and change nothing.
func TestRawWriterAttacks(t *testing.T) {
	env := kubefencertest.APIServerForTest(t)
	ctx := t.Context()
	// The admin writes: admission policies bind every user, including
	// system:masters.
	admin := clientset(t, env.Admin())
	cs := admin
	attacks := rawAttacks()

	run := func(t *testing.T, phase string, check func(t *testing.T, a rawAttack, err error, stored map[string]string)) {
		for _, a := range attacks {
			t.Run(a.name, func(t *testing.T) {
				name := fmt.Sprintf("%s-%s", phase, sanitize(a.name))
				createStamped(t, admin, a.kind, name)
				err := a.write(ctx, cs, name)
				check(t, a, err, storedAnnotations(t, admin, a.kind, name))
			})
		}
	}
	t.Run("without policy", func(t *testing.T) {
		run(t, "off", func(t *testing.T, a rawAttack, err error, stored map[string]string) {
			require.NoError(t, err, "without the policy the raw write lands")
			require.Equal(t, a.after, stored[a.key], "the attack changed %s", a.key)
		})
	})
	installPolicy(t, env)
	t.Run("with policy", func(t *testing.T) {
		run(t, "on", func(t *testing.T, a rawAttack, err error, stored map[string]string) {
			require.Error(t, err, "the policy refuses the raw write")
			require.True(t, apierrors.IsForbidden(err) || apierrors.IsInvalid(err), "want Forbidden or Invalid, got %v", err)
			require.Equal(t, fence, stored[leaseKey])
			require.Equal(t, "100", stored[tokenKey])
		})
	})
}

func rawAttacks() []rawAttack {
	cmPatch := func(pt types.PatchType, body string) func(context.Context, *kubernetes.Clientset, string) error {
		return func(ctx context.Context, cs *kubernetes.Clientset, name string) error {
			opts := metav1.PatchOptions{}
			if pt == types.ApplyPatchType {
				opts.FieldManager, opts.Force = "attacker", ptr(true)
			}
			_, err := cs.CoreV1().ConfigMaps(kubefencertest.LimitedNamespace).Patch(ctx, name, pt, []byte(body), opts)
			return err
		}
	}
	lowerAnn := fmt.Sprintf(`{"metadata":{"annotations":{%q:"1"}}}`, tokenKey)
	removeAnn := fmt.Sprintf(`{"metadata":{"annotations":{%q:null}}}`, tokenKey)
	hopped := withKey(fenced(kubefencertest.LimitedNamespace+"/hop", "1"), epochKey, "1")
	return []rawAttack{
		{name: "update with a lower token", kind: "configmap", key: tokenKey, after: "1",
			write: func(ctx context.Context, cs *kubernetes.Clientset, name string) error {
				cms := cs.CoreV1().ConfigMaps(kubefencertest.LimitedNamespace)
				cm, err := cms.Get(ctx, name, metav1.GetOptions{})
				if err != nil {
					return err
				}
				cm.Annotations[tokenKey] = "1"
				_, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
				return err
			}},
		{name: "json patch replace", kind: "configmap", key: tokenKey, after: "1",
			write: cmPatch(types.JSONPatchType, `[{"op":"replace","path":"/metadata/annotations/fencer.dev~1token","value":"1"}]`)},
		{name: "json patch remove", kind: "configmap", key: tokenKey, after: "",
			write: cmPatch(types.JSONPatchType, `[{"op":"remove","path":"/metadata/annotations/fencer.dev~1token"}]`)},
		{name: "merge patch", kind: "configmap", key: tokenKey, after: "1", write: cmPatch(types.MergePatchType, lowerAnn)},
		{name: "merge patch removing", kind: "configmap", key: tokenKey, after: "", write: cmPatch(types.MergePatchType, removeAnn)},
		{name: "strategic merge patch", kind: "configmap", key: tokenKey, after: "1", write: cmPatch(types.StrategicMergePatchType, lowerAnn)},
		{name: "server-side apply", kind: "configmap", key: tokenKey, after: "1",
			write: func(ctx context.Context, cs *kubernetes.Clientset, name string) error {
				body := fmt.Sprintf(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":%q,"annotations":{%q:"1"}}}`, name, tokenKey)
				return cmPatch(types.ApplyPatchType, body)(ctx, cs, name)
			}},
		{name: "lease hop back", kind: "configmap", key: tokenKey, after: "1",
			write: func(ctx context.Context, cs *kubernetes.Clientset, name string) error {
				// Two writes: to another lease, then back to fence with token 1.
				body, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": hopped}})
				if err := cmPatch(types.MergePatchType, string(body))(ctx, cs, name); err != nil {
					return err
				}
				return cmPatch(types.MergePatchType, fmt.Sprintf(`{"metadata":{"annotations":{%q:%q,%q:"1"}}}`, leaseKey, fence, tokenKey))(ctx, cs, name)
			}},
		{name: "pod status update", kind: "pod", key: tokenKey, after: "1",
			write: func(ctx context.Context, cs *kubernetes.Clientset, name string) error {
				pods := cs.CoreV1().Pods(kubefencertest.LimitedNamespace)
				pod, err := pods.Get(ctx, name, metav1.GetOptions{})
				if err != nil {
					return err
				}
				pod.Annotations[tokenKey] = "1"
				pod.Status.Message = "stale"
				_, err = pods.UpdateStatus(ctx, pod, metav1.UpdateOptions{})
				return err
			}},
		{name: "pod status merge patch", kind: "pod", key: tokenKey, after: "1",
			write: func(ctx context.Context, cs *kubernetes.Clientset, name string) error {
				_, err := cs.CoreV1().Pods(kubefencertest.LimitedNamespace).Patch(ctx, name, types.MergePatchType, []byte(lowerAnn), metav1.PatchOptions{}, "status")
				return err
			}},
		{name: "pod binding create", kind: "pod", key: tokenKey, after: "1",
			write: func(ctx context.Context, cs *kubernetes.Clientset, name string) error {
				return cs.CoreV1().Pods(kubefencertest.LimitedNamespace).Bind(ctx, &corev1.Binding{
					ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{tokenKey: "1"}},
					Target:     corev1.ObjectReference{Kind: "Node", Name: "node-a"},
				}, metav1.CreateOptions{})
			}},
		{name: "bindings create", kind: "pod", key: tokenKey, after: "1",
			write: func(ctx context.Context, cs *kubernetes.Clientset, name string) error {
				// The legacy top-level resource: a CREATE with no
				// subresource that copies its annotations onto the Pod.
				return cs.CoreV1().RESTClient().Post().Namespace(kubefencertest.LimitedNamespace).Resource("bindings").Body(&corev1.Binding{
					ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: fenced(fence, "1")},
					Target:     corev1.ObjectReference{Kind: "Node", Name: "node-a"},
				}).Do(ctx).Error()
			}},
	}
}

// createStamped creates, as the admin, an object of kind stamped with
// token 100 of lease fence.
func createStamped(t *testing.T, admin *kubernetes.Clientset, kind, name string) {
	t.Helper()
	ann := withKey(fenced(fence, "100"), epochKey, "4")
	var err error
	switch kind {
	case "configmap":
		_, err = admin.CoreV1().ConfigMaps(kubefencertest.LimitedNamespace).Create(t.Context(), configMap(name, ann), metav1.CreateOptions{})
	case "pod":
		_, err = admin.CoreV1().Pods(kubefencertest.LimitedNamespace).Create(t.Context(), &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: ann},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "example.invalid/none"}}},
		}, metav1.CreateOptions{})
	default:
		t.Fatalf("unknown kind %q", kind)
	}
	require.NoError(t, err)
}

func storedAnnotations(t *testing.T, admin *kubernetes.Clientset, kind, name string) map[string]string {
	t.Helper()
	var obj metav1.Object
	var err error
	switch kind {
	case "configmap":
		obj, err = admin.CoreV1().ConfigMaps(kubefencertest.LimitedNamespace).Get(t.Context(), name, metav1.GetOptions{})
	case "pod":
		obj, err = admin.CoreV1().Pods(kubefencertest.LimitedNamespace).Get(t.Context(), name, metav1.GetOptions{})
	}
	require.NoError(t, err)
	return obj.GetAnnotations()
}

// sanitize turns a test case name into a DNS label.
func sanitize(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			b[i] = '-'
		}
	}
	return string(b)
}
