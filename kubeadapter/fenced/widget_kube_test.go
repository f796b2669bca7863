package fenced_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// widgetGV is the group of the Widget custom resource the patch tests use:
// its schema has spec.known and spec.extra, while the Go type below knows
// only spec.known, as a controller built against an older schema would.
var widgetGV = schema.GroupVersion{Group: "test.fencer.dev", Version: "v1"}

type widgetSpec struct {
	Known string `json:"known,omitempty"`
}

type widget struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              widgetSpec `json:"spec,omitempty"`
}

func (w *widget) DeepCopyObject() runtime.Object {
	out := *w
	w.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	return &out
}

type widgetList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []widget `json:"items"`
}

func (l *widgetList) DeepCopyObject() runtime.Object {
	out := *l
	out.Items = make([]widget, len(l.Items))
	for i := range l.Items {
		out.Items[i] = *l.Items[i].DeepCopyObject().(*widget)
	}
	return &out
}

// widgets installs the Widget CRD on k's API server, unless it is there,
// and returns an admin client whose scheme knows the widget Go type. Tests
// run on more than one API server, so the CRD is installed per call.
func widgets(t *testing.T, k *kube) client.Client {
	t.Helper()
	require.NoError(t, installWidgetCRD(t.Context(), k))
	return crdClient(t, k, widgetGV.WithKind("Widget"), &widget{}, &widgetList{})
}

// crdClient returns an admin client whose scheme knows obj and list as
// gvk and its list, once the API server's discovery serves gvk. A client's
// REST mapper keeps what discovery first told it about a group, so each
// attempt takes a new client.
func crdClient(t *testing.T, k *kube, gvk schema.GroupVersionKind, obj, list runtime.Object) client.Client {
	t.Helper()
	require.NoError(t, waitDiscovered(t.Context(), k, gvk))
	scheme := runtime.NewScheme()
	require.NoError(t, clientgoscheme.AddToScheme(scheme))
	scheme.AddKnownTypeWithName(gvk, obj)
	scheme.AddKnownTypeWithName(gvk.GroupVersion().WithKind(gvk.Kind+"List"), list)
	metav1.AddToGroupVersion(scheme, gvk.GroupVersion())
	var c client.Client
	require.NoError(t, untilDiscovered(t.Context(), func() error {
		var err error
		if c, err = client.New(k.Env.Admin(), client.Options{Scheme: scheme}); err != nil {
			return err
		}
		_, err = c.RESTMapper().RESTMapping(gvk.GroupKind(), gvk.Version)
		return err
	}))
	return c
}

// waitDiscovered waits until the API server's discovery serves gvk, which
// lags a moment behind a CRD's creation. A REST mapper that asks earlier
// keeps the answer, so no client should map the kind before.
func waitDiscovered(ctx context.Context, k *kube, gvk schema.GroupVersionKind) error {
	dc, err := discovery.NewDiscoveryClientForConfig(k.Env.Admin())
	if err != nil {
		return err
	}
	deadline := time.Now().Add(time.Minute)
	for {
		list, err := dc.ServerResourcesForGroupVersion(gvk.GroupVersion().String())
		if err == nil && slices.ContainsFunc(list.APIResources, func(r metav1.APIResource) bool { return r.Kind == gvk.Kind }) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kind %s is not discovered: %v", gvk, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func installWidgetCRD(ctx context.Context, k *kube) error {
	str := map[string]any{"type": "string"}
	crd := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiextensions.k8s.io/v1",
		"kind":       "CustomResourceDefinition",
		"metadata":   map[string]any{"name": "widgets." + widgetGV.Group},
		"spec": map[string]any{
			"group": widgetGV.Group,
			"scope": "Namespaced",
			"names": map[string]any{"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
			"versions": []any{map[string]any{
				"name": widgetGV.Version, "served": true, "storage": true,
				"schema": map[string]any{"openAPIV3Schema": map[string]any{
					"type": "object",
					"properties": map[string]any{"spec": map[string]any{
						"type":       "object",
						"properties": map[string]any{"known": str, "extra": str},
					}},
				}},
			}},
		},
	}}
	if err := k.CRC.Create(ctx, crd); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	return waitDiscovered(ctx, k, widgetGV.WithKind("Widget"))
}

// newWidget creates a Widget with both fields through an unstructured
// object, so that the extra field is stored although the Go type lacks it.
func newWidget(t *testing.T, k *kube, name string) {
	t.Helper()
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": widgetGV.String(), "kind": "Widget",
		"metadata": map[string]any{"namespace": k.NS, "name": name},
		"spec":     map[string]any{"known": "k0", "extra": "keep me"},
	}}
	require.NoError(t, untilDiscovered(t.Context(), func() error { return k.CRC.Create(t.Context(), u) }))
}

// untilDiscovered runs f until it returns anything but a discovery error.
// Just after a CRD is established, the API server's discovery can still
// miss its group for a moment, and a client's REST mapper then refuses
// the kind.
func untilDiscovered(ctx context.Context, f func() error) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := f()
		_, discovering := discovery.GroupDiscoveryFailedErrorGroups(err)
		if !meta.IsNoMatchError(err) && !discovering || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// storedWidget reads a Widget as stored, with every field.
func storedWidget(t *testing.T, k *kube, name string) *unstructured.Unstructured {
	t.Helper()
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(widgetGV.WithKind("Widget"))
	require.NoError(t, k.CRC.Get(t.Context(), client.ObjectKey{Namespace: k.NS, Name: name}, u))
	return u
}
