package fenced_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fencer-dev/fencer/kubeadapter/fenced"
	"github.com/fencer-dev/fencer/token"
)

// TestPatchKeepsFieldsTheTypeDoesNotKnow patches a Widget through a Go
// type that lacks spec.extra: a fenced patch, like a plain one, must keep
// the field.
func TestPatchKeepsFieldsTheTypeDoesNotKnow(t *testing.T) {
	t.Parallel()
	k := newKube(t)
	ctx := t.Context()
	tok := k.Tokens(t, 1)[0]
	wc := widgets(t, k)
	c, err := fenced.NewClient(wc, staticHolder{Tok: tok})
	require.NoError(t, err)

	for _, tc := range []struct {
		name  string
		patch func(w *widget) client.Patch
	}{
		{"merge patch", func(w *widget) client.Patch {
			base := w.DeepCopyObject().(*widget)
			w.Spec.Known = "merge patch"
			return client.MergeFrom(base)
		}},
		{"json patch", func(*widget) client.Patch {
			return client.RawPatch(types.JSONPatchType, []byte(`[{"op":"replace","path":"/spec/known","value":"json patch"}]`))
		}},
		{"apply patch", func(*widget) client.Patch {
			return client.RawPatch(types.ApplyPatchType, []byte(`{"apiVersion":"test.fencer.dev/v1","kind":"Widget","spec":{"known":"apply patch"}}`))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := sanitize(tc.name)
			newWidget(t, k, name)
			w := &widget{}
			require.NoError(t, wc.Get(ctx, client.ObjectKey{Namespace: k.NS, Name: name}, w))
			patch := tc.patch(w)
			opts := []client.PatchOption{client.FieldOwner("controller")}
			if patch.Type() == types.ApplyPatchType {
				// The creator owns spec.known: take it over, as an
				// apply by a new controller must.
				opts = append(opts, client.ForceOwnership)
			}
			require.NoError(t, c.Patch(ctx, w, patch, opts...))
			require.Equal(t, tc.name, w.Spec.Known)

			got := storedWidget(t, k, name)
			extra, _, _ := unstructured.NestedString(got.Object, "spec", "extra")
			require.Equal(t, "keep me", extra, "a field the Go type lacks was erased")
			known, _, _ := unstructured.NestedString(got.Object, "spec", "known")
			require.Equal(t, tc.name, known)
			requireStamped(t, got.GetAnnotations(), tok)
			require.Equal(t, got.GetResourceVersion(), w.ResourceVersion)
		})
	}
}

// notFoundReader is a cache, or an API reader, that has not seen the
// object yet.
type notFoundReader struct{}

func (notFoundReader) Get(_ context.Context, key client.ObjectKey, _ client.Object, _ ...client.GetOption) error {
	return apierrors.NewNotFound(schema.GroupResource{Resource: "configmaps"}, key.Name)
}

func (notFoundReader) List(context.Context, client.ObjectList, ...client.ListOption) error {
	panic("not used")
}

// TestPatchCannotWriteTheStamp sends, as the current holder, patches of
// every type that try to lower, drop or forge fencer's annotations: the
// patch's other changes land, and the stamp is the holder's, with no mark
// the patch made up.
func TestPatchCannotWriteTheStamp(t *testing.T) {
	t.Parallel()
	k := newKube(t)
	ctx := t.Context()
	toks := k.Tokens(t, 2)
	old, cur := toks[0], toks[1]
	c := k.Client(t, staticHolder{Tok: cur})
	forged := token.MarkKey("forged")
	for _, tc := range []struct {
		name, patch string
		pt          types.PatchType
	}{
		{"merge patch lowering the token and forging a mark", `{"metadata":{"annotations":{"fencer.dev/token":"1","` + forged + `":"99"}},"data":{"v":"x"}}`, types.MergePatchType},
		{"merge patch with null annotations", `{"metadata":{"annotations":null},"data":{"v":"x"}}`, types.MergePatchType},
		{"strategic merge patch replacing the annotations", `{"metadata":{"annotations":{"$patch":"replace","team":"t"}},"data":{"v":"x"}}`, types.StrategicMergePatchType},
		{"json patch removing the stamp", `[{"op":"remove","path":"/metadata/annotations/fencer.dev~1lease"},{"op":"remove","path":"/metadata/annotations/fencer.dev~1token"},{"op":"replace","path":"/data/v","value":"x"}]`, types.JSONPatchType},
		{"json patch removing every annotation", `[{"op":"remove","path":"/metadata/annotations"},{"op":"replace","path":"/data/v","value":"x"}]`, types.JSONPatchType},
		{"json patch replacing the annotations", `[{"op":"replace","path":"/metadata/annotations","value":{"fencer.dev/token":"1","team":"t"}},{"op":"replace","path":"/data/v","value":"x"}]`, types.JSONPatchType},
		{"json patch forging a mark", `[{"op":"add","path":"/metadata/annotations/` + strings.ReplaceAll(forged, "/", "~1") + `","value":"99"},{"op":"replace","path":"/data/v","value":"x"}]`, types.JSONPatchType},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := sanitize(tc.name)
			obj := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: k.NS, Name: name, Annotations: map[string]string{"team": "t"}}, Data: map[string]string{"v": "0"}}
			require.NoError(t, k.Client(t, staticHolder{Tok: old}).Create(ctx, obj))
			require.NoError(t, c.Patch(ctx, obj, client.RawPatch(tc.pt, []byte(tc.patch))))
			got := k.ConfigMap(t, name)
			require.Equal(t, "x", got.Data["v"], "the patch's own change landed")
			requireStamped(t, got.Annotations, cur)
			require.NotContains(t, got.Annotations, forged)
		})
	}
}

// TestPatchBadInput sends patches the fenced client must refuse with a
// typed error, and checks that nothing was written.
func TestPatchBadInput(t *testing.T) {
	t.Parallel()
	k := newKube(t)
	ctx := t.Context()
	c := k.Client(t, staticHolder{Tok: k.Tokens(t, 1)[0]})
	obj := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: k.NS, Name: "bad"}, Data: map[string]string{"v": "0"}}
	require.NoError(t, c.Create(ctx, obj))
	before := obj.ResourceVersion
	for _, tc := range []struct {
		name, patch string
		pt          types.PatchType
		want        error
	}{
		{"json patch that is not json", `[{"op":`, types.JSONPatchType, fenced.ErrInvalidPatch},
		{"json patch replacing metadata", `[{"op":"replace","path":"/metadata","value":{}}]`, types.JSONPatchType, fenced.ErrInvalidPatch},
		{"json patch replacing the object", `[{"op":"replace","path":"","value":{}}]`, types.JSONPatchType, fenced.ErrInvalidPatch},
		{"json patch moving the stamp", `[{"op":"move","from":"/metadata/annotations/fencer.dev~1token","path":"/data/v"}]`, types.JSONPatchType, fenced.ErrInvalidPatch},
		{"json patch with no path", `[{"op":"remove"}]`, types.JSONPatchType, fenced.ErrInvalidPatch},
		{"merge patch that is an array", `[]`, types.MergePatchType, fenced.ErrInvalidPatch},
		{"merge patch with metadata a string", `{"metadata":"x"}`, types.MergePatchType, fenced.ErrInvalidPatch},
		{"merge patch with annotations a list", `{"metadata":{"annotations":["x"]}}`, types.MergePatchType, fenced.ErrInvalidPatch},
		{"merge patch with resourceVersion a number", `{"metadata":{"resourceVersion":7}}`, types.MergePatchType, fenced.ErrInvalidPatch},
		{"strategic merge patch deleting the object", `{"$patch":"delete"}`, types.StrategicMergePatchType, fenced.ErrInvalidPatch},
		{"strategic merge patch retaining no metadata fields", `{"metadata":{"$retainKeys":["name"]}}`, types.StrategicMergePatchType, fenced.ErrInvalidPatch},
		{"strategic merge patch deleting the annotations", `{"metadata":{"annotations":{"$patch":"delete"}}}`, types.StrategicMergePatchType, fenced.ErrInvalidPatch},
		{"apply that is not yaml", "a: [", types.ApplyPatchType, fenced.ErrInvalidPatch},
		{"unknown patch type", `{}`, types.PatchType("application/x-unknown"), fenced.ErrUnsupported},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := c.Patch(ctx, obj.DeepCopy(), client.RawPatch(tc.pt, []byte(tc.patch)), client.FieldOwner("bad"))
			require.ErrorIs(t, err, tc.want)
			require.Equal(t, before, k.ConfigMap(t, "bad").ResourceVersion, "nothing written")
		})
	}
}

// TestApply checks fenced server-side apply on the real API server with
// the admission policy installed: it creates and updates objects stamped,
// keeps fields the configuration does not name, takes over the stamp from
// another field manager but returns conflicts over other fields, and
// refuses a stale holder.
func TestApply(t *testing.T) {
	t.Parallel()
	k := newKube(t)
	shared.InstallPolicy(t)
	ctx := t.Context()
	toks := k.Tokens(t, 2)
	old, cur := k.Client(t, staticHolder{Tok: toks[0]}), k.Client(t, staticHolder{Tok: toks[1]})

	require.NoError(t, old.Apply(ctx, corev1ac.ConfigMap("ssa", k.NS).WithData(map[string]string{"a": "1"}), client.FieldOwner("one")))
	requireStamped(t, k.ConfigMap(t, "ssa").Annotations, toks[0])

	// Another manager with a newer token: the stamp's conflict is taken
	// over, the manager's own field lands, the other's stays.
	applied := corev1ac.ConfigMap("ssa", k.NS).WithData(map[string]string{"b": "2"})
	require.NoError(t, cur.Apply(ctx, applied, client.FieldOwner("two")))
	got := k.ConfigMap(t, "ssa")
	require.Equal(t, map[string]string{"a": "1", "b": "2"}, got.Data)
	requireStamped(t, got.Annotations, toks[1])
	require.Equal(t, got.ResourceVersion, *applied.ResourceVersion, "the config holds the applied object")

	// A conflict over another manager's field is returned, not forced.
	before := got.ResourceVersion
	err := cur.Apply(ctx, corev1ac.ConfigMap("ssa", k.NS).WithData(map[string]string{"a": "changed", "b": "2"}), client.FieldOwner("two"))
	require.True(t, apierrors.IsConflict(err), "%v", err)
	require.Equal(t, before, k.ConfigMap(t, "ssa").ResourceVersion)
	require.NoError(t, cur.Apply(ctx, corev1ac.ConfigMap("ssa", k.NS).WithData(map[string]string{"a": "forced", "b": "2"}), client.FieldOwner("two"), client.ForceOwnership))
	require.Equal(t, "forced", k.ConfigMap(t, "ssa").Data["a"])

	// The superseded holder's apply is refused, from a fresh read or a
	// lagging cache.
	before = k.ConfigMap(t, "ssa").ResourceVersion
	require.ErrorIs(t, old.Apply(ctx, corev1ac.ConfigMap("ssa", k.NS).WithData(map[string]string{"a": "late"}), client.FieldOwner("one"), client.ForceOwnership), token.ErrStale)
	lagging := k.Client(t, staticHolder{Tok: toks[0]}, fenced.WithReader(laggingReader{got}))
	require.ErrorIs(t, lagging.Apply(ctx, corev1ac.ConfigMap("ssa", k.NS).WithData(map[string]string{"a": "late"}), client.FieldOwner("one"), client.ForceOwnership), token.ErrStale)
	require.Equal(t, before, k.ConfigMap(t, "ssa").ResourceVersion)
}

// TestApplyOverAnObjectTheReadsMissed checks, with the admission policy
// installed, that an apply whose reads say the object does not exist
// neither writes over the object a newer holder created nor trips the
// policy: fencer's own create-only precondition refuses it first, and the
// retry finds the newer stamp. TestSupersededHolderAttacks runs the same
// without the policy.
func TestApplyOverAnObjectTheReadsMissed(t *testing.T) {
	t.Parallel()
	k := newKube(t)
	shared.InstallPolicy(t)
	ctx := t.Context()
	toks := k.Tokens(t, 2)
	newer := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: k.NS, Name: "missed"}, Data: map[string]string{"by": "newer"}}
	require.NoError(t, k.Client(t, staticHolder{Tok: toks[1]}).Create(ctx, newer))

	late := k.Client(t, staticHolder{Tok: toks[0]}, fenced.WithReader(notFoundReader{}), fenced.WithAPIReader(&missOnce{Reader: k.CRC}))
	err := late.Apply(ctx, corev1ac.ConfigMap("missed", k.NS).WithData(map[string]string{"by": "older"}), client.FieldOwner("older"), client.ForceOwnership)
	require.ErrorIs(t, err, token.ErrStale)
	got := k.ConfigMap(t, "missed")
	require.Equal(t, "newer", got.Data["by"])
	requireStamped(t, got.Annotations, toks[1])

	// An apply of an object that does not exist creates it, stamped.
	require.NoError(t, late.Apply(ctx, corev1ac.ConfigMap("fresh", k.NS).WithData(map[string]string{"by": "older"}), client.FieldOwner("older")))
	requireStamped(t, k.ConfigMap(t, "fresh").Annotations, toks[0])
}

// missOnce is a Reader whose first Get finds nothing, as a read made just
// before another writer creates the object.
type missOnce struct {
	client.Reader
	missed atomic.Bool
}

func (m *missOnce) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if m.missed.CompareAndSwap(false, true) {
		return notFoundReader{}.Get(ctx, key, obj, opts...)
	}
	return m.Reader.Get(ctx, key, obj, opts...)
}

// TestApplyKeepsFieldsTheTypeDoesNotKnow applies a Widget, with the
// admission policy installed, through a client
// whose scheme knows a Go type that lacks spec.extra: the stored field,
// owned by another manager, survives, and the configuration holds the
// object as the API server returned it, with that field.
func TestApplyKeepsFieldsTheTypeDoesNotKnow(t *testing.T) {
	t.Parallel()
	k := newKube(t)
	shared.InstallPolicy(t)
	ctx := t.Context()
	tok := k.Tokens(t, 1)[0]
	c, err := fenced.NewClient(widgets(t, k), staticHolder{Tok: tok})
	require.NoError(t, err)
	newWidget(t, k, "applied")

	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": widgetGV.String(), "kind": "Widget",
		"metadata": map[string]any{"namespace": k.NS, "name": "applied"},
		"spec":     map[string]any{"known": "applied"},
	}}
	config := client.ApplyConfigurationFromUnstructured(u)
	require.NoError(t, c.Apply(ctx, config, client.FieldOwner("controller"), client.ForceOwnership))

	got := storedWidget(t, k, "applied")
	extra, _, _ := unstructured.NestedString(got.Object, "spec", "extra")
	require.Equal(t, "keep me", extra, "a field the Go type lacks was erased")
	known, _, _ := unstructured.NestedString(got.Object, "spec", "known")
	require.Equal(t, "applied", known)
	requireStamped(t, got.GetAnnotations(), tok)
	returned, _, _ := unstructured.NestedString(u.Object, "spec", "extra")
	require.Equal(t, "keep me", returned, "the configuration does not hold the object the API server returned")
}

// TestApplyAfterADelete is the scene where a superseded holder's apply
// would undo a newer holder's delete: holder A wrote the object, holder B
// deleted it, and A's cache still holds A's copy. A's apply must not
// create the object again, with the admission policy installed (it has
// no old object to compare a create against): its reads saw the object,
// so fencer makes the apply conditional on that object's UID, which the
// API server refuses when no object exists. A plain apply in the same
// scene recreates the object: the attack is real.
func TestApplyAfterADelete(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	k := newKube(t)
	shared.InstallPolicy(t)
	toks := k.Tokens(t, 2)
	a, b := toks[0], toks[1]
	apply := func(name string) *corev1ac.ConfigMapApplyConfiguration {
		return corev1ac.ConfigMap(name, k.NS).WithData(map[string]string{"by": "a-late"})
	}
	deleted := func(t *testing.T, name string) *corev1.ConfigMap {
		t.Helper()
		obj := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: k.NS, Name: name}, Data: map[string]string{"by": "a"}}
		require.NoError(t, k.Client(t, staticHolder{Tok: a}).Create(ctx, obj))
		require.NoError(t, k.Client(t, staticHolder{Tok: b}).Delete(ctx, obj.DeepCopy()))
		return obj
	}
	requireGone := func(t *testing.T, name string) {
		t.Helper()
		err := k.CRC.Get(ctx, client.ObjectKey{Namespace: k.NS, Name: name}, &corev1.ConfigMap{})
		require.True(t, apierrors.IsNotFound(err), "the deleted object was recreated: %v", err)
	}

	aView := deleted(t, "plain")
	require.NoError(t, k.CRC.Patch(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: k.NS, Name: "plain"}},
		client.RawPatch(types.ApplyPatchType, []byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"plain","resourceVersion":"`+aView.ResourceVersion+`"},"data":{"by":"a-late"}}`)),
		client.FieldOwner("a")), "a plain apply carrying the read's resourceVersion recreates the object")
	require.Equal(t, "a-late", k.ConfigMap(t, "plain").Data["by"])

	t.Run("lagging cache", func(t *testing.T) {
		aView := deleted(t, "lagging")
		c := k.Client(t, staticHolder{Tok: a}, fenced.WithReader(laggingReader{aView}))
		err := c.Apply(ctx, apply("lagging"), client.FieldOwner("a"), client.ForceOwnership)
		require.ErrorIs(t, err, fenced.ErrDeleted)
		require.True(t, apierrors.IsNotFound(err), "%v", err)
		requireGone(t, "lagging")
	})

	t.Run("deleted between the live read and the apply", func(t *testing.T) {
		obj := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: k.NS, Name: "between"}, Data: map[string]string{"by": "a"}}
		require.NoError(t, k.Client(t, staticHolder{Tok: a}).Create(ctx, obj))
		r := &deleteAfterRead{Reader: k.CRC, del: func(ctx context.Context) error {
			return k.Client(t, staticHolder{Tok: b}).Delete(ctx, obj.DeepCopy())
		}}
		c := k.Client(t, staticHolder{Tok: a}, fenced.WithLiveRead(), fenced.WithAPIReader(r))
		err := c.Apply(ctx, apply("between"), client.FieldOwner("a"), client.ForceOwnership)
		require.ErrorIs(t, err, fenced.ErrDeleted)
		require.NoError(t, r.err)
		requireGone(t, "between")
	})

	t.Run("apply patch of an object the caller read", func(t *testing.T) {
		aView := deleted(t, "caller-read")
		c := k.Client(t, staticHolder{Tok: a}, fenced.WithReader(notFoundReader{}))
		err := c.Patch(ctx, aView, client.RawPatch(types.ApplyPatchType, []byte(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"caller-read"},"data":{"by":"a-late"}}`)), client.FieldOwner("a"))
		require.ErrorIs(t, err, fenced.ErrDeleted)
		requireGone(t, "caller-read")
	})
}

// deleteAfterRead is a Reader whose first Get reads the object and then
// has another holder delete it, as a delete that lands between a read and
// the write built on it.
type deleteAfterRead struct {
	client.Reader
	del  func(context.Context) error
	done atomic.Bool
	err  error
}

func (r *deleteAfterRead) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if err := r.Reader.Get(ctx, key, obj, opts...); err != nil {
		return err
	}
	if r.done.CompareAndSwap(false, true) {
		r.err = r.del(ctx)
	}
	return nil
}

// TestApplyStampOwnership checks on the real API server, without the
// admission policy, what docs/protocol.md says of who owns the stamp: a
// fenced apply by field manager "ctrl" makes "ctrl" own the protocol
// keys, so a later plain apply by "ctrl" without them strips the stamp,
// while a fenced apply by "ctrl" keeps it. Giving the keys to a "fencer"
// field manager takes a second write (an apply by that manager, which
// changes the object's resourceVersion); after it, the same plain apply
// keeps the stamp.
func TestApplyStampOwnership(t *testing.T) {
	k := clientKube(t)
	ctx := t.Context()
	tok := k.Tokens(t, 1)[0]
	c := k.Client(t, staticHolder{Tok: tok})
	config := func(name, v string) *corev1ac.ConfigMapApplyConfiguration {
		return corev1ac.ConfigMap(name, k.NS).WithData(map[string]string{"v": v})
	}
	plainApply := func(name, v string) {
		t.Helper()
		body := `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"namespace":"` + k.NS + `","name":"` + name + `"},"data":{"v":"` + v + `"}}`
		obj := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: k.NS, Name: name}}
		require.NoError(t, k.CRC.Patch(ctx, obj, client.RawPatch(types.ApplyPatchType, []byte(body)), client.FieldOwner("ctrl")))
	}
	owns := func(obj *corev1.ConfigMap, manager string) bool {
		for _, mf := range obj.ManagedFields {
			if mf.Manager == manager && mf.FieldsV1 != nil && strings.Contains(string(mf.FieldsV1.Raw), `"f:fencer.dev/token"`) {
				return true
			}
		}
		return false
	}

	require.NoError(t, c.Apply(ctx, config("stripped", "1"), client.FieldOwner("ctrl")))
	got := k.ConfigMap(t, "stripped")
	require.True(t, owns(got, "ctrl"), "the applying manager owns the stamp: %v", got.ManagedFields)
	require.False(t, owns(got, "fencer"))
	require.NoError(t, c.Apply(ctx, config("stripped", "2"), client.FieldOwner("ctrl")))
	requireStamped(t, k.ConfigMap(t, "stripped").Annotations, tok)
	plainApply("stripped", "3")
	got = k.ConfigMap(t, "stripped")
	require.NotContains(t, got.Annotations, token.AnnotationToken, "a plain apply by the manager that owns the stamp strips it")
	require.NotContains(t, got.Annotations, token.AnnotationLease)

	require.NoError(t, c.Apply(ctx, config("co-owned", "1"), client.FieldOwner("ctrl")))
	before := k.ConfigMap(t, "co-owned")
	stamp := map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "metadata": map[string]any{
		"namespace": k.NS, "name": "co-owned", "resourceVersion": before.ResourceVersion, "annotations": tok.Stamp(nil),
	}}
	body, err := json.Marshal(stamp)
	require.NoError(t, err)
	require.NoError(t, k.CRC.Patch(ctx, before.DeepCopy(), client.RawPatch(types.ApplyPatchType, body), client.FieldOwner("fencer")))
	got = k.ConfigMap(t, "co-owned")
	require.NotEqual(t, before.ResourceVersion, got.ResourceVersion, "the stamp's own apply is a second write")
	require.True(t, owns(got, "fencer") && owns(got, "ctrl"), "%v", got.ManagedFields)
	plainApply("co-owned", "2")
	got = k.ConfigMap(t, "co-owned")
	require.Equal(t, "2", got.Data["v"])
	requireStamped(t, got.Annotations, tok)
}
