package fenced_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fencer-dev/fencer/kubeadapter"
	"github.com/fencer-dev/fencer/kubeadapter/fenced"
	"github.com/fencer-dev/fencer/kubeadapter/internal/kubetest"
	"github.com/fencer-dev/fencer/kubeadapter/kubefencertest"
	"github.com/fencer-dev/fencer/token"
)

// laggingReader is a cache that has not seen the latest writes: it
// returns the copy it holds, whatever the API server has.
type laggingReader struct{ obj client.Object }

func (r laggingReader) Get(_ context.Context, _ client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	v, ok := r.obj.DeepCopyObject().(client.Object)
	if !ok {
		panic("not a client.Object")
	}
	return copyObject(obj, v)
}

func (laggingReader) List(context.Context, client.ObjectList, ...client.ListOption) error {
	panic("not used")
}

// copyObject copies src into dst, pointers to the same struct type.
func copyObject(dst, src client.Object) error {
	d, v := reflect.ValueOf(dst).Elem(), reflect.ValueOf(src).Elem()
	if d.Type() != v.Type() {
		panic(fmt.Sprintf("copyObject: %s into %s", v.Type(), d.Type()))
	}
	d.Set(v)
	return nil
}

// superseded is the scene of every attack: holder A (token a) wrote the
// object, then holder B (token b > a) wrote it. aView is the object as A
// read it; current is the object as B left it.
type superseded struct {
	k              *kube
	a, b           token.Token
	aView, current *corev1.ConfigMap
}

func newSuperseded(t *testing.T, k *kube, name string) superseded {
	t.Helper()
	toks := k.Tokens(t, 2)
	s := superseded{k: k, a: toks[0], b: toks[1]}
	ctx := t.Context()
	obj := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: k.NS, Name: name}, Data: map[string]string{"by": "a"}}
	require.NoError(t, k.Client(t, staticHolder{Tok: s.a}).Create(ctx, obj))
	s.aView = obj.DeepCopy()
	obj.Data["by"] = "b"
	require.NoError(t, k.Client(t, staticHolder{Tok: s.b}).Update(ctx, obj))
	s.current = obj.DeepCopy()
	return s
}

// requireIntact checks that the object still carries B's stamp and data.
func (s superseded) requireIntact(t *testing.T) {
	t.Helper()
	cur := s.k.ConfigMap(t, s.current.Name)
	requireStamped(t, cur.Annotations, s.b)
	require.Equal(t, "b", cur.Data["by"])
}

// handBuilt is the object a careless superseded holder writes: built from
// scratch with its own stamp, and the current resourceVersion copied in.
func (s superseded) handBuilt() *corev1.ConfigMap {
	return &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: s.current.Namespace, Name: s.current.Name,
			ResourceVersion: s.current.ResourceVersion, UID: s.current.UID,
			Annotations: s.a.Stamp(nil),
		},
		Data: map[string]string{"by": "a-late"},
	}
}

// TestSupersededHolderAttacks tries, on the real API server without the
// admission policy, every way a careless superseded holder writes through
// the fenced client: a caller-built object with the current
// resourceVersion copied in, a lagging cache, pinned preconditions, a
// patch pinned to a hand-built base, unpinned merge and strategic merge
// patches over a lagging cache (only the metadata.resourceVersion fencer
// adds to the patch refuses them), a status write, and a takeover after
// a newer holder. Each must fail with token.ErrStale and leave the newer
// holder's object intact. The first case also sends the same write
// through a plain client, where it lands: the attack is real.
func TestSupersededHolderAttacks(t *testing.T) {
	env := kubefencertest.APIServerForTest(t)
	k := kubetest.NewKube(t, env)
	ctx := t.Context()

	t.Run("plain client lands the hand-built write", func(t *testing.T) {
		s := newSuperseded(t, k, "plain")
		require.NoError(t, k.CRC.Update(ctx, s.handBuilt()))
		requireStamped(t, k.ConfigMap(t, "plain").Annotations, s.a)
	})

	for _, tc := range []struct {
		name  string
		write func(t *testing.T, s superseded) error
	}{
		{"update of a hand-built object with the current resourceVersion", func(t *testing.T, s superseded) error {
			return k.Client(t, staticHolder{Tok: s.a}).Update(ctx, s.handBuilt())
		}},
		{"update of a hand-built object without annotations", func(t *testing.T, s superseded) error {
			obj := s.handBuilt()
			obj.Annotations = nil
			return k.Client(t, staticHolder{Tok: s.a}).Update(ctx, obj)
		}},
		{"update with a lagging cache and the current resourceVersion", func(t *testing.T, s superseded) error {
			return k.Client(t, staticHolder{Tok: s.a}, fenced.WithReader(laggingReader{s.aView})).Update(ctx, s.handBuilt())
		}},
		{"update with a lagging cache, live read and the current resourceVersion", func(t *testing.T, s superseded) error {
			c := k.Client(t, staticHolder{Tok: s.a}, fenced.WithReader(laggingReader{s.aView}), fenced.WithLiveRead())
			return c.Update(ctx, s.handBuilt())
		}},
		{"unconditional update with a lagging cache", func(t *testing.T, s superseded) error {
			obj := s.handBuilt()
			obj.ResourceVersion = ""
			return k.Client(t, staticHolder{Tok: s.a}, fenced.WithReader(laggingReader{s.aView})).Update(ctx, obj)
		}},
		{"retried update of the object read before the supersede", func(t *testing.T, s superseded) error {
			c := k.Client(t, staticHolder{Tok: s.a})
			obj := s.aView.DeepCopy()
			obj.Data["by"] = "a-late"
			if err := c.Update(ctx, obj); !apierrors.IsConflict(err) && !isStale(err) {
				t.Fatalf("first attempt: %v", err)
			}
			return c.Update(ctx, obj)
		}},
		{"delete with the current UID and resourceVersion as preconditions", func(t *testing.T, s superseded) error {
			return k.Client(t, staticHolder{Tok: s.a}).Delete(ctx, s.handBuilt(),
				client.Preconditions{UID: &s.current.UID, ResourceVersion: &s.current.ResourceVersion})
		}},
		{"delete of a hand-built object with a lagging cache", func(t *testing.T, s superseded) error {
			return k.Client(t, staticHolder{Tok: s.a}, fenced.WithReader(laggingReader{s.aView})).Delete(ctx, s.handBuilt())
		}},
		{"patch pinned to a hand-built base", func(t *testing.T, s superseded) error {
			base := s.handBuilt()
			obj := base.DeepCopy()
			obj.Data["by"] = "a-late"
			return k.Client(t, staticHolder{Tok: s.a}).Patch(ctx, obj, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{}))
		}},
		{"patch pinned with a lagging cache", func(t *testing.T, s superseded) error {
			base := s.handBuilt()
			obj := base.DeepCopy()
			obj.Data["by"] = "a-late"
			c := k.Client(t, staticHolder{Tok: s.a}, fenced.WithReader(laggingReader{s.aView}))
			return c.Patch(ctx, obj, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{}))
		}},
		{"apply with a lagging cache", func(t *testing.T, s superseded) error {
			c := k.Client(t, staticHolder{Tok: s.a}, fenced.WithReader(laggingReader{s.aView}))
			return c.Apply(ctx, corev1ac.ConfigMap(s.current.Name, k.NS).WithData(map[string]string{"by": "a-late"}), client.FieldOwner("a"), client.ForceOwnership)
		}},
		{"apply pinned to the current resourceVersion with a lagging cache", func(t *testing.T, s superseded) error {
			c := k.Client(t, staticHolder{Tok: s.a}, fenced.WithReader(laggingReader{s.aView}))
			cfg := corev1ac.ConfigMap(s.current.Name, k.NS).WithResourceVersion(s.current.ResourceVersion).
				WithAnnotations(s.a.Stamp(nil)).WithData(map[string]string{"by": "a-late"})
			return c.Apply(ctx, cfg, client.FieldOwner("a"), client.ForceOwnership)
		}},
		{"unpinned merge patch with a lagging cache", func(t *testing.T, s superseded) error {
			c := k.Client(t, staticHolder{Tok: s.a}, fenced.WithReader(laggingReader{s.aView}))
			return c.Patch(ctx, s.aView.DeepCopy(), client.RawPatch(types.MergePatchType, []byte(`{"data":{"by":"a-late"}}`)))
		}},
		{"unpinned strategic merge patch with a lagging cache", func(t *testing.T, s superseded) error {
			c := k.Client(t, staticHolder{Tok: s.a}, fenced.WithReader(laggingReader{s.aView}))
			return c.Patch(ctx, s.aView.DeepCopy(), client.RawPatch(types.StrategicMergePatchType, []byte(`{"data":{"by":"a-late"}}`)))
		}},
		{"json patch removing the annotations with a lagging cache", func(t *testing.T, s superseded) error {
			c := k.Client(t, staticHolder{Tok: s.a}, fenced.WithReader(laggingReader{s.aView}))
			return c.Patch(ctx, s.handBuilt(), client.RawPatch(types.JSONPatchType,
				[]byte(`[{"op":"remove","path":"/metadata/annotations"},{"op":"replace","path":"/data/by","value":"a-late"}]`)))
		}},
		{"json patch lowering the stamp", func(t *testing.T, s superseded) error {
			c := k.Client(t, staticHolder{Tok: s.a})
			return c.Patch(ctx, s.handBuilt(), client.RawPatch(types.JSONPatchType,
				[]byte(`[{"op":"replace","path":"/metadata/annotations/fencer.dev~1token","value":"1"},{"op":"replace","path":"/data/by","value":"a-late"}]`)))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSuperseded(t, k, sanitize(tc.name))
			err := tc.write(t, s)
			require.ErrorIs(t, err, token.ErrStale)
			s.requireIntact(t)
		})
	}

	t.Run("status update of a hand-built object", func(t *testing.T) {
		toks := k.Tokens(t, 2)
		a, b := toks[0], toks[1]
		d := deployment(k.NS, "status-attack")
		require.NoError(t, k.Client(t, staticHolder{Tok: a}).Create(ctx, d))
		aView := d.DeepCopy()
		d.Status.ObservedGeneration = 7
		require.NoError(t, k.Client(t, staticHolder{Tok: b}).Status().Update(ctx, d))
		late := aView.DeepCopy()
		late.ResourceVersion = d.ResourceVersion
		late.Status.ObservedGeneration = 1
		for _, c := range []*fenced.Client{
			k.Client(t, staticHolder{Tok: a}),
			k.Client(t, staticHolder{Tok: a}, fenced.WithReader(laggingReader{aView})),
		} {
			require.ErrorIs(t, c.Status().Update(ctx, late.DeepCopy()), token.ErrStale)
			base := late.DeepCopy()
			patched := base.DeepCopy()
			patched.Status.ObservedGeneration = 2
			require.ErrorIs(t, c.Status().Patch(ctx, patched, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})), token.ErrStale)
		}
		var got appsv1.Deployment
		require.NoError(t, k.CRC.Get(ctx, client.ObjectKeyFromObject(d), &got))
		requireStamped(t, got.Annotations, b)
		require.EqualValues(t, 7, got.Status.ObservedGeneration)
	})

	t.Run("create of a Binding over a newer holder's Pod", func(t *testing.T) {
		toks := k.Tokens(t, 2)
		a, b := toks[0], toks[1]
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: k.NS, Name: "bound"},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "example.invalid/c"}}},
		}
		require.NoError(t, k.Client(t, staticHolder{Tok: b}).Create(ctx, pod))
		// A Binding's annotations are copied onto its Pod: a create that
		// writes another object, which the fenced client cannot check.
		binding := &corev1.Binding{
			ObjectMeta: metav1.ObjectMeta{Namespace: k.NS, Name: "bound"},
			Target:     corev1.ObjectReference{Kind: "Node", Name: "node-a"},
		}
		require.ErrorIs(t, k.Client(t, staticHolder{Tok: a}).Create(ctx, binding), fenced.ErrUnsupported)
		var got corev1.Pod
		require.NoError(t, k.CRC.Get(ctx, client.ObjectKeyFromObject(pod), &got))
		requireStamped(t, got.Annotations, b)
		require.Empty(t, got.Spec.NodeName)
	})

	t.Run("takeover after a newer holder", func(t *testing.T) {
		s := newSuperseded(t, k, "takeover")
		cfg := k.Fast("other")
		cfg.Name = "other"
		other, err := kubeadapter.NewElector(k.CS.CoordinationV1(), cfg)
		require.NoError(t, err)
		hm := acquire(t, other)
		defer hm.Release(context.Background())
		obj := s.current.DeepCopy()
		obj.Data["by"] = "m"
		require.NoError(t, k.Client(t, hm, fenced.WithTakeover()).Update(ctx, obj))
		stored := k.ConfigMap(t, "takeover")
		requireStamped(t, stored.Annotations, hm.Token())
		require.Equal(t, strconv.FormatInt(s.b.Revision, 10), stored.Annotations[token.MarkKey(s.b.Lease)], "the takeover keeps b as the lease's mark")

		// A, whose token is older than b, takes the object back: refused.
		back := stored.DeepCopy()
		back.Data["by"] = "a-late"
		require.ErrorIs(t, k.Client(t, staticHolder{Tok: s.a}, fenced.WithTakeover()).Update(ctx, back), token.ErrStale)
		require.Equal(t, "m", k.ConfigMap(t, "takeover").Data["by"])
		// B, the newest holder of the lease, may.
		require.NoError(t, k.Client(t, staticHolder{Tok: s.b}, fenced.WithTakeover()).Update(ctx, back))
		requireStamped(t, k.ConfigMap(t, "takeover").Annotations, s.b)
	})

	t.Run("apply creating over an object the reads missed", func(t *testing.T) {
		// Both reads miss the object a newer holder created: the apply
		// that would create it is conditional on a version no object has,
		// so it conflicts and writes nothing.
		toks := k.Tokens(t, 2)
		newer := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: k.NS, Name: "missed"}, Data: map[string]string{"by": "newer"}}
		require.NoError(t, k.Client(t, staticHolder{Tok: toks[1]}).Create(ctx, newer))
		apply := corev1ac.ConfigMap("missed", k.NS).WithData(map[string]string{"by": "older"})
		blind := k.Client(t, staticHolder{Tok: toks[0]}, fenced.WithReader(notFoundReader{}), fenced.WithAPIReader(notFoundReader{}))
		require.True(t, apierrors.IsConflict(blind.Apply(ctx, apply, client.FieldOwner("older"), client.ForceOwnership)))
		// The live read misses it once, as when the newer holder creates
		// it between the read and the apply: the retry reads it and finds
		// the newer stamp.
		late := k.Client(t, staticHolder{Tok: toks[0]}, fenced.WithReader(notFoundReader{}), fenced.WithAPIReader(&missOnce{Reader: k.CRC}))
		require.ErrorIs(t, late.Apply(ctx, apply, client.FieldOwner("older"), client.ForceOwnership), token.ErrStale)
		got := k.ConfigMap(t, "missed")
		require.Equal(t, "newer", got.Data["by"])
		requireStamped(t, got.Annotations, toks[1])
	})

	t.Run("a current holder's object cannot lower its stamp", func(t *testing.T) {
		s := newSuperseded(t, k, "lower")
		c := k.Client(t, staticHolder{Tok: s.b})
		obj := s.current.DeepCopy()
		obj.Annotations = s.a.Stamp(map[string]string{"team": "x"})
		require.NoError(t, c.Update(ctx, obj))
		stored := k.ConfigMap(t, "lower")
		requireStamped(t, stored.Annotations, s.b)
		require.Equal(t, "x", stored.Annotations["team"], "the caller's other annotations are written")
		require.NoError(t, c.Patch(ctx, stored, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"annotations":{"fencer.dev/token":null}}}`))))
		requireStamped(t, k.ConfigMap(t, "lower").Annotations, s.b)
	})
}

func isStale(err error) bool { return errors.Is(err, token.ErrStale) }

// sanitize turns a test case name into a DNS label of at most 40
// characters.
func sanitize(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			b[i] = '-'
		}
	}
	if len(b) > 40 {
		b = b[:40]
	}
	return strings.Trim(string(b), "-")
}
