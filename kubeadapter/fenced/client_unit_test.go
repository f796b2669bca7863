package fenced

import (
	"context"
	"errors"
	"maps"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/fencer-dev/fencer/token"
)

// flagHolder holds tok until lost is set.
type flagHolder struct {
	tok  token.Token
	lost atomic.Bool
}

func (h *flagHolder) Token() token.Token { return h.tok }

// Context is never done: the fenced writes under test consult Err.
func (h *flagHolder) Context() context.Context { return context.Background() }

func (h *flagHolder) Err() error {
	if h.lost.Load() {
		return errors.New("lost in test")
	}
	return nil
}

// TestConflictRetryStopsWhenLeaseLost checks the retry decisions of a
// fenced Update whose every write conflicts: it retries up to the attempt
// limit while the lease is held, stops as soon as the holder reports the
// lease lost, and never retries a write pinned to the caller's
// resourceVersion.
func TestConflictRetryStopsWhenLeaseLost(t *testing.T) {
	for _, tc := range []struct {
		name         string
		loseAfter    int // the holder loses the lease after this many writes; 0: never
		callerRV     bool
		opts         []Option
		wantAttempts int
		wantNotHeld  bool
	}{
		{name: "held throughout", wantAttempts: DefaultMaxAttempts},
		{name: "held throughout, two attempts", opts: []Option{WithMaxAttempts(2)}, wantAttempts: 2},
		{name: "lost after first conflict", loseAfter: 1, wantAttempts: 1, wantNotHeld: true},
		{name: "lost after third conflict", loseAfter: 3, wantAttempts: 3, wantNotHeld: true},
		{name: "caller pinned resourceVersion", callerRV: true, wantAttempts: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := &flagHolder{tok: token.Token{Lease: "ns/fence", Epoch: 1, Revision: 10}}
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "o"}}
			var writes int
			inner := fake.NewClientBuilder().WithObjects(cm).WithInterceptorFuncs(interceptor.Funcs{
				Update: func(_ context.Context, _ client.WithWatch, obj client.Object, _ ...client.UpdateOption) error {
					writes++
					require.Equal(t, "10", obj.GetAnnotations()[token.AnnotationToken], "write not stamped")
					require.NotEmpty(t, obj.GetResourceVersion(), "write not conditional")
					if writes == tc.loseAfter {
						h.lost.Store(true)
					}
					return apierrors.NewConflict(corev1.Resource("configmaps"), obj.GetName(), errors.New("injected"))
				},
			}).Build()
			c, err := NewClient(inner, h, tc.opts...)
			require.NoError(t, err)

			obj := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "o"}, Data: map[string]string{"k": "v"}}
			if tc.callerRV {
				require.NoError(t, inner.Get(t.Context(), client.ObjectKeyFromObject(cm), obj))
			}
			rv := obj.ResourceVersion
			err = c.Update(t.Context(), obj)
			require.Equal(t, tc.wantAttempts, writes)
			require.Equal(t, tc.wantNotHeld, errors.Is(err, token.ErrNotHeld), "%v", err)
			if !tc.wantNotHeld {
				require.True(t, apierrors.IsConflict(err), "%v", err)
			}
			require.Equal(t, rv, obj.ResourceVersion, "resourceVersion not restored")
			require.Empty(t, obj.Annotations, "annotations not restored")
		})
	}
}

func TestNewClientRejects(t *testing.T) {
	inner := fake.NewClientBuilder().Build()
	h := &flagHolder{tok: token.Token{Lease: "ns/fence", Revision: 1}}
	for name, f := range map[string]func() error{
		"nil inner":     func() error { _, err := NewClient(nil, h); return err },
		"nil holder":    func() error { _, err := NewClient(inner, nil); return err },
		"zero attempts": func() error { _, err := NewClient(inner, h, WithMaxAttempts(0)); return err },
	} {
		t.Run(name, func(t *testing.T) { require.ErrorIs(t, f(), ErrInvalidConfig) })
	}
}

// TestUpdateFencedNeverWritesIntoTheReadersObject gives UpdateFenced a get
// that returns the same object every time, as a client-go lister does
// (its objects are the informer's cache): neither mutate nor fencer's
// stamp may change that object, whether the write fails or lands.
func TestUpdateFencedNeverWritesIntoTheReadersObject(t *testing.T) {
	h := &flagHolder{tok: token.Token{Lease: "ns/fence", Epoch: 2, Revision: 20}}
	for _, tc := range []struct {
		name string
		err  error
	}{
		{name: "the write lands"},
		{name: "the write fails", err: errors.New("refused in test")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cached := &corev1.ConfigMap{
				ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "o", ResourceVersion: "7", Annotations: map[string]string{"team": "a"}},
				Data:       map[string]string{"by": "cache"},
			}
			before := cached.DeepCopy()
			var sent *corev1.ConfigMap
			_, err := UpdateFenced(t.Context(), h,
				func(context.Context) (*corev1.ConfigMap, error) { return cached, nil },
				func(cm *corev1.ConfigMap) error { cm.Data["by"] = "mutate"; return nil },
				func(_ context.Context, cm *corev1.ConfigMap) (*corev1.ConfigMap, error) { sent = cm; return cm, tc.err },
				WithMaxAttempts(1))
			if tc.err != nil {
				require.ErrorIs(t, err, tc.err)
			} else {
				require.NoError(t, err)
			}
			require.Equal(t, before, cached, "the reader's object was changed")
			require.Equal(t, "mutate", sent.Data["by"])
			requireStampedWith(t, sent.Annotations, h.tok)
		})
	}
}

func requireStampedWith(t *testing.T, ann map[string]string, tok token.Token) {
	t.Helper()
	got, ok, err := token.FromAnnotations(ann)
	require.NoError(t, err)
	require.True(t, ok, "no stamp in %v", ann)
	require.Equal(t, tok, got)
}

// sharingReader hands out its object without a deep copy, as a
// controller-runtime cache with UnsafeDisableDeepCopy does: the struct is
// copied, its maps are shared.
type sharingReader struct{ obj *corev1.ConfigMap }

func (r sharingReader) Get(_ context.Context, _ client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	*obj.(*corev1.ConfigMap) = *r.obj
	return nil
}

func (sharingReader) List(context.Context, client.ObjectList, ...client.ListOption) error {
	panic("not used")
}

// TestUpdateChecksTheStoreNotTheCallersSharedMemory is a superseded holder
// whose reader shares memory with the objects it hands out: it reads the
// newer holder's version, stamps its own token into the annotations it got
// (so into the reader's memory) and updates. The fenced Update must see
// through it: the shared map is not evidence of what is stored, so it reads
// live, finds the newer stamp and writes nothing.
func TestUpdateChecksTheStoreNotTheCallersSharedMemory(t *testing.T) {
	older := token.Token{Lease: "ns/fence", Epoch: 1, Revision: 10}
	newer := token.Token{Lease: "ns/fence", Epoch: 2, Revision: 20}
	stored := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "o", Annotations: newer.Stamp(nil)}, Data: map[string]string{"by": "newer"}}
	inner := fake.NewClientBuilder().WithObjects(stored).Build()
	cached := &corev1.ConfigMap{}
	require.NoError(t, inner.Get(t.Context(), client.ObjectKeyFromObject(stored), cached))

	c, err := NewClient(inner, &flagHolder{tok: older}, WithReader(sharingReader{cached}))
	require.NoError(t, err)
	var obj corev1.ConfigMap
	require.NoError(t, sharingReader{cached}.Get(t.Context(), client.ObjectKeyFromObject(stored), &obj))
	older.Stamp(obj.Annotations) // a hand edit, into the reader's memory
	obj.Data = map[string]string{"by": "older"}
	require.ErrorIs(t, c.Update(t.Context(), &obj), token.ErrStale)

	got := &corev1.ConfigMap{}
	require.NoError(t, inner.Get(t.Context(), client.ObjectKeyFromObject(stored), got))
	require.Equal(t, "newer", got.Data["by"])
	requireStampedWith(t, got.Annotations, newer)
}

// TestInvalidUnstructuredMetadataIsRefused gives every fenced write that
// takes an object an unstructured object whose annotations or
// resourceVersion have the wrong type: each is refused with
// ErrInvalidObject and writes nothing.
func TestInvalidUnstructuredMetadataIsRefused(t *testing.T) {
	tok := token.Token{Lease: "ns/fence", Epoch: 1, Revision: 10}
	for _, tc := range []struct {
		name string
		meta map[string]any
	}{
		{"an annotation that is a number", map[string]any{"annotations": map[string]any{"n": int64(5)}}},
		{"annotations that are a string", map[string]any{"annotations": "keep"}},
		{"a resourceVersion that is a number", map[string]any{"resourceVersion": int64(1)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stored := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "o", Annotations: map[string]string{"keep": "me"}}}
			var writes atomic.Int32
			count := func() { writes.Add(1) }
			inner := fake.NewClientBuilder().WithObjects(stored).WithInterceptorFuncs(interceptor.Funcs{
				Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
					count()
					return c.Create(ctx, obj, opts...)
				},
				Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
					count()
					return c.Update(ctx, obj, opts...)
				},
				SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
					count()
					return c.SubResource(sub).Update(ctx, obj, opts...)
				},
			}).Build()
			c, err := NewClient(inner, &flagHolder{tok: tok})
			require.NoError(t, err)
			obj := func(name string) *unstructured.Unstructured {
				meta := map[string]any{"namespace": "ns", "name": name}
				maps.Copy(meta, tc.meta)
				return &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta}}
			}
			require.ErrorIs(t, c.Create(t.Context(), obj("new")), ErrInvalidObject)
			require.ErrorIs(t, c.Update(t.Context(), obj("o")), ErrInvalidObject)
			require.ErrorIs(t, c.Status().Update(t.Context(), obj("o")), ErrInvalidObject)
			require.Zero(t, writes.Load())
		})
	}
}

// TestFencedWriteRefusesNonKubeLease hands a fenced Update a token.Holder
// whose token is an etcd store lease's ("jobs"), as an etcdstore.Lease or
// a client.Lease would give: the type is accepted, and the write is
// refused as malformed before anything is sent.
func TestFencedWriteRefusesNonKubeLease(t *testing.T) {
	var writes int
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "o"}}
	inner := fake.NewClientBuilder().WithObjects(cm).WithInterceptorFuncs(interceptor.Funcs{
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			writes++
			return c.Update(ctx, obj, opts...)
		},
	}).Build()
	c, err := NewClient(inner, &flagHolder{tok: token.Token{Lease: "jobs", Epoch: 1, Revision: 7}})
	require.NoError(t, err)
	var got corev1.ConfigMap
	require.NoError(t, inner.Get(t.Context(), client.ObjectKeyFromObject(cm), &got))
	got.Data = map[string]string{"k": "v"}
	require.ErrorIs(t, c.Update(t.Context(), &got), token.ErrMalformed)
	require.Zero(t, writes, "a write was sent")
	var after corev1.ConfigMap
	require.NoError(t, inner.Get(t.Context(), client.ObjectKeyFromObject(cm), &after))
	require.Empty(t, after.Data)
	require.Empty(t, after.Annotations)
}
