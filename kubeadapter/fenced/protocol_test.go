package fenced_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fencer-dev/fencer/kubeadapter/fenced"
	"github.com/fencer-dev/fencer/token"
)

func requireStamped(t *testing.T, annotations map[string]string, want token.Token) {
	t.Helper()
	got, ok, err := token.FromAnnotations(annotations)
	require.NoError(t, err)
	require.True(t, ok, "not stamped")
	require.Equal(t, want, got)
}

// TestPatch checks the patch types the fenced client supports: each is
// applied to a fresh read, stamped and written conditionally; a stale
// holder's patch and unsupported types write nothing.
func TestPatch(t *testing.T) {
	t.Parallel()
	k := newKube(t)
	ctx := t.Context()
	toks := k.Tokens(t, 2)
	old, cur := toks[0], toks[1]
	c := k.Client(t, staticHolder{Tok: cur})
	require.NoError(t, c.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: k.NS, Name: "p"}, Data: map[string]string{"a": "0"}}))

	for _, tc := range []struct {
		name  string
		patch func(obj *corev1.ConfigMap) client.Patch
		value string
	}{
		{"merge patch", func(obj *corev1.ConfigMap) client.Patch {
			base := obj.DeepCopy()
			obj.Data["a"] = "merge"
			return client.MergeFrom(base)
		}, "merge"},
		{"json patch", func(*corev1.ConfigMap) client.Patch {
			return client.RawPatch(types.JSONPatchType, []byte(`[{"op":"replace","path":"/data/a","value":"json"}]`))
		}, "json"},
		{"strategic merge patch", func(obj *corev1.ConfigMap) client.Patch {
			base := obj.DeepCopy()
			obj.Data["a"] = "strategic"
			return client.StrategicMergeFrom(base)
		}, "strategic"},
		{"merge patch from an outdated object", func(obj *corev1.ConfigMap) client.Patch {
			base := obj.DeepCopy()
			obj.Data["a"] = "outdated"
			// Another write lands after the caller's read; a patch
			// without a resourceVersion applies to the newer version.
			other := k.ConfigMap(t, "p")
			other.Data["b"] = "other"
			require.NoError(t, c.Update(ctx, other))
			return client.MergeFrom(base)
		}, "outdated"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			obj := k.ConfigMap(t, "p")
			before := obj.ResourceVersion
			require.NoError(t, c.Patch(ctx, obj, tc.patch(obj)))
			require.Equal(t, tc.value, obj.Data["a"])
			got := k.ConfigMap(t, "p")
			require.Equal(t, tc.value, got.Data["a"])
			require.Equal(t, got.ResourceVersion, obj.ResourceVersion)
			require.NotEqual(t, before, got.ResourceVersion)
			requireStamped(t, got.Annotations, cur)
		})
	}

	rv := func() string { return k.ConfigMap(t, "p").ResourceVersion }
	t.Run("optimistic lock on an outdated object", func(t *testing.T) {
		obj := k.ConfigMap(t, "p")
		base := obj.DeepCopy()
		other := k.ConfigMap(t, "p")
		other.Data["b"] = "moved"
		require.NoError(t, c.Update(ctx, other))
		obj.Data["a"] = "locked"
		before := rv()
		err := c.Patch(ctx, obj, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{}))
		require.True(t, apierrors.IsConflict(err), "%v", err)
		require.Equal(t, before, rv())
	})
	t.Run("stale holder", func(t *testing.T) {
		obj := k.ConfigMap(t, "p")
		base := obj.DeepCopy()
		obj.Data["a"] = "stale"
		before := rv()
		require.ErrorIs(t, k.Client(t, staticHolder{Tok: old}).Patch(ctx, obj, client.MergeFrom(base)), token.ErrStale)
		require.Equal(t, before, rv())
	})
	t.Run("unsupported", func(t *testing.T) {
		before := rv()
		obj := k.ConfigMap(t, "p")
		unknown := client.RawPatch(types.PatchType("application/x-unknown"), []byte(`{}`))
		require.ErrorIs(t, c.Patch(ctx, obj, unknown), fenced.ErrUnsupported)
		require.ErrorIs(t, c.DeleteAllOf(ctx, &corev1.ConfigMap{}, client.InNamespace(k.NS)), fenced.ErrUnsupported)
		require.Equal(t, before, rv())
	})
	for _, pt := range []types.PatchType{types.MergePatchType, types.StrategicMergePatchType} {
		t.Run("unstructured "+string(pt), func(t *testing.T) {
			u := &unstructured.Unstructured{}
			u.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("ConfigMap"))
			u.SetNamespace(k.NS)
			u.SetName("p")
			require.NoError(t, c.Patch(ctx, u, client.RawPatch(pt, []byte(`{"data":{"a":"`+string(pt)+`"}}`))))
			got := k.ConfigMap(t, "p")
			require.Equal(t, string(pt), got.Data["a"])
			requireStamped(t, got.Annotations, cur)
		})
	}
	t.Run("metadata-only object", func(t *testing.T) {
		m := &metav1.PartialObjectMetadata{}
		m.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("ConfigMap"))
		m.SetNamespace(k.NS)
		m.SetName("p")
		require.NoError(t, c.Patch(ctx, m, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"labels":{"meta":"only"}}}`))))
		got := k.ConfigMap(t, "p")
		require.Equal(t, "only", got.Labels["meta"])
		requireStamped(t, got.Annotations, cur)
	})
}

// TestDelete checks that deletes check the stamp and carry UID and
// resourceVersion preconditions.
func TestDelete(t *testing.T) {
	t.Parallel()
	k := newKube(t)
	ctx := t.Context()
	toks := k.Tokens(t, 2)
	c := k.Client(t, staticHolder{Tok: toks[1]})
	stale := k.Client(t, staticHolder{Tok: toks[0]})
	create := func(name string) *corev1.ConfigMap {
		obj := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: k.NS, Name: name}, Data: map[string]string{"v": "0"}}
		require.NoError(t, c.Create(ctx, obj))
		return obj
	}
	exists := func(name string) bool {
		var cm corev1.ConfigMap
		err := k.CRC.Get(ctx, client.ObjectKey{Namespace: k.NS, Name: name}, &cm)
		if apierrors.IsNotFound(err) {
			return false
		}
		require.NoError(t, err)
		return true
	}

	obj := create("a")
	require.ErrorIs(t, stale.Delete(ctx, obj.DeepCopy()), token.ErrStale)
	require.ErrorIs(t, stale.Delete(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: k.NS, Name: "a"}}), token.ErrStale)
	require.True(t, exists("a"))

	// An outdated object is retried with a fresh read.
	outdated := obj.DeepCopy()
	obj.Data["v"] = "1"
	require.NoError(t, c.Update(ctx, obj))
	require.NoError(t, c.Delete(ctx, outdated))
	require.False(t, exists("a"))

	// Preconditions of the caller's own are kept, and not retried.
	obj = create("b")
	pinned := obj.ResourceVersion
	obj.Data["v"] = "1"
	require.NoError(t, c.Update(ctx, obj))
	err := c.Delete(ctx, obj.DeepCopy(), client.Preconditions{ResourceVersion: &pinned})
	require.True(t, apierrors.IsConflict(err), "%v", err)
	require.True(t, exists("b"))

	// A replaced object (same name, new UID) is not deleted on the strength
	// of a check of the old one.
	old := obj.DeepCopy()
	require.NoError(t, k.CRC.Delete(ctx, obj))
	create("b")
	uid := old.UID
	err = c.Delete(ctx, old, client.Preconditions{UID: &uid})
	require.True(t, apierrors.IsConflict(err), "%v", err)
	require.True(t, exists("b"))
}

// TestStatusWrites checks that status writes, which cannot carry a stamp,
// are conditional on a version stamped with the writer's token: a newer
// holder's status write stamps the object first, and then an older
// holder's status writes fail.
// deployment returns a minimal valid Deployment to create.
func deployment(namespace, name string) *appsv1.Deployment {
	labels := map[string]string{"app": "x"}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "example.invalid/c"}}},
			},
		},
	}
}

func TestStatusWrites(t *testing.T) {
	t.Parallel()
	k := newKube(t)
	ctx := t.Context()
	toks := k.Tokens(t, 2)
	cOld, cCur := k.Client(t, staticHolder{Tok: toks[0]}), k.Client(t, staticHolder{Tok: toks[1]})
	dep := deployment(k.NS, "d")
	require.NoError(t, cOld.Create(ctx, dep))
	get := func() *appsv1.Deployment {
		var d appsv1.Deployment
		require.NoError(t, k.CRC.Get(ctx, client.ObjectKeyFromObject(dep), &d))
		return &d
	}

	// The old holder writes status on an object it stamped: one write.
	d := get()
	d.Status.ObservedGeneration = 7
	before := d.ResourceVersion
	require.NoError(t, cOld.Status().Update(ctx, d))
	require.Equal(t, int64(7), get().Status.ObservedGeneration)
	require.NotEqual(t, before, d.ResourceVersion)
	oldView := d.DeepCopy()

	// The new holder's status patch stamps the object first.
	d = get()
	base := d.DeepCopy()
	d.Status.ObservedGeneration = 8
	require.NoError(t, cCur.Status().Patch(ctx, d, client.MergeFrom(base)))
	got := get()
	require.Equal(t, int64(8), got.Status.ObservedGeneration)
	requireStamped(t, got.Annotations, toks[1])
	afterNew := got.ResourceVersion

	// The old holder's status writes now fail, from its old view or a
	// fresh one.
	oldView.Status.ObservedGeneration = 9
	require.ErrorIs(t, cOld.Status().Update(ctx, oldView), token.ErrStale)
	fresh := get()
	fresh.Status.ObservedGeneration = 9
	require.ErrorIs(t, cOld.Status().Update(ctx, fresh), token.ErrStale)
	fresh = get()
	base = fresh.DeepCopy()
	fresh.Status.ObservedGeneration = 9
	require.ErrorIs(t, cOld.Status().Patch(ctx, fresh, client.MergeFrom(base)), token.ErrStale)
	require.Equal(t, afterNew, get().ResourceVersion)

	// Other subresources and status creates are refused.
	require.ErrorIs(t, cCur.SubResource("scale").Update(ctx, get()), fenced.ErrUnsupported)
	require.ErrorIs(t, cCur.Status().Create(ctx, get(), &appsv1.Deployment{}), fenced.ErrUnsupported)
	require.Equal(t, afterNew, get().ResourceVersion)
}

// TestClientGo checks UpdateFenced and DeleteFenced with a typed clientset
// and a dynamic client.
func TestClientGo(t *testing.T) {
	t.Parallel()
	k := newKube(t)
	ctx := t.Context()
	toks := k.Tokens(t, 2)
	old, cur := staticHolder{Tok: toks[0]}, staticHolder{Tok: toks[1]}
	cms := k.CS.CoreV1().ConfigMaps(k.NS)
	_, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "g", Annotations: toks[0].Stamp(nil)}}, metav1.CreateOptions{})
	require.NoError(t, err)
	get := func(ctx context.Context) (*corev1.ConfigMap, error) { return cms.Get(ctx, "g", metav1.GetOptions{}) }
	update := func(ctx context.Context, cm *corev1.ConfigMap) (*corev1.ConfigMap, error) {
		return cms.Update(ctx, cm, metav1.UpdateOptions{})
	}
	set := func(v string) func(*corev1.ConfigMap) error {
		return func(cm *corev1.ConfigMap) error { cm.Data = map[string]string{"v": v}; return nil }
	}

	// A concurrent write during the first attempt makes it conflict; the
	// retry reads again and runs mutate again.
	var calls int
	out, err := fenced.UpdateFenced(ctx, cur, get, func(cm *corev1.ConfigMap) error {
		calls++
		if calls == 1 {
			other := cm.DeepCopy()
			other.Labels = map[string]string{"concurrent": "yes"}
			_, err := cms.Update(ctx, other, metav1.UpdateOptions{})
			require.NoError(t, err)
		}
		return set("typed")(cm)
	}, update)
	require.NoError(t, err)
	require.Equal(t, 2, calls)
	require.Equal(t, "typed", out.Data["v"])
	require.Equal(t, "yes", out.Labels["concurrent"])
	requireStamped(t, out.Annotations, toks[1])

	_, err = fenced.UpdateFenced(ctx, old, get, set("stale"), update)
	require.ErrorIs(t, err, token.ErrStale)
	now, err := get(ctx)
	require.NoError(t, err)
	require.Equal(t, out.ResourceVersion, now.ResourceVersion)

	dyn, err := dynamic.NewForConfig(k.Env.Admin())
	require.NoError(t, err)
	res := dyn.Resource(corev1.SchemeGroupVersion.WithResource("configmaps")).Namespace(k.NS)
	uget := func(ctx context.Context) (*unstructured.Unstructured, error) {
		return res.Get(ctx, "g", metav1.GetOptions{})
	}
	uout, err := fenced.UpdateFenced(ctx, cur, uget, func(u *unstructured.Unstructured) error {
		return unstructured.SetNestedField(u.Object, "dynamic", "data", "v")
	}, func(ctx context.Context, u *unstructured.Unstructured) (*unstructured.Unstructured, error) {
		return res.Update(ctx, u, metav1.UpdateOptions{})
	})
	require.NoError(t, err)
	requireStamped(t, uout.GetAnnotations(), toks[1])

	del := func(ctx context.Context, p metav1.Preconditions) error {
		return cms.Delete(ctx, "g", metav1.DeleteOptions{Preconditions: &p})
	}
	require.ErrorIs(t, fenced.DeleteFenced(ctx, old, get, del), token.ErrStale)
	require.NoError(t, fenced.DeleteFenced(ctx, cur, uget, func(ctx context.Context, p metav1.Preconditions) error {
		return res.Delete(ctx, "g", metav1.DeleteOptions{Preconditions: &p})
	}))
	_, err = get(ctx)
	require.True(t, apierrors.IsNotFound(err), "%v", err)
}
