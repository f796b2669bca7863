package fenced

import (
	"context"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/fencer-dev/fencer/token"
)

// UpdateFenced runs the object protocol for client-go's typed and dynamic
// clients. Each attempt reads the object with get, checks its stamp with
// token.CheckStamp, lets mutate change it, stamps the token and writes it
// with update, conditional on the read resourceVersion (typed and dynamic
// Update send the object's resourceVersion as precondition). On a conflict
// it retries from a fresh read, at most WithMaxAttempts times and only
// while h holds the lease, so mutate must be safe to run again on a newer
// object. It returns update's result.
//
// mutate gets a deep copy of what get returned (T must be a
// runtime.Object, as every API type is), so neither mutate nor the stamp
// changes an object get shares, such as a lister's. The check itself
// trusts get: an object whose shared copy the caller changed by hand is
// checked as it was changed; the admission policy (deploy/admission) still
// refuses a stale stamp in the API server.
//
// UpdateFenced restores the read resourceVersion and UID and the read
// fencer annotations (token.Restamp) after mutate, so mutate can change
// neither the version written over nor the stamp, and a kind whose PUT
// creates absent objects cannot create again an object deleted after the
// read. An unstructured object that
// mutate leaves with annotations that are not a map of strings is refused
// with ErrInvalidObject, and nothing is written. WithLiveRead and WithReader have no effect
// here. Like Client.Update, UpdateFenced only fences against writes that
// stamped a greater token on this object.
//
// For a clientset, get and update are, for example,
//
//	func(ctx context.Context) (*corev1.ConfigMap, error) { return cms.Get(ctx, name, metav1.GetOptions{}) }
//	func(ctx context.Context, cm *corev1.ConfigMap) (*corev1.ConfigMap, error) { return cms.Update(ctx, cm, metav1.UpdateOptions{}) }
//
// and for a dynamic client the same with *unstructured.Unstructured.
func UpdateFenced[T metav1.Object](ctx context.Context, h Holder, get func(context.Context) (T, error), mutate func(T) error, update func(context.Context, T) (T, error), opts ...Option) (T, error) {
	var out T
	o, err := newOptions(opts)
	if err != nil {
		return out, err
	}
	e := &engine[T]{holder: h, opts: o, read: func(ctx context.Context, _ bool) (T, error) { return get(ctx) }}
	err = e.run(ctx, func(ctx context.Context, tok token.Token, read T) (bool, error) {
		cur, err := deepCopy(read)
		if err != nil {
			return false, err
		}
		rv, uid := e.version(cur), cur.GetUID()
		if err := mutate(cur); err != nil {
			return false, err
		}
		if err := checkMetadata(cur); err != nil {
			return false, err
		}
		cur.SetAnnotations(restamp(tok, cur.GetAnnotations(), read))
		cur.SetResourceVersion(rv)
		cur.SetUID(uid)
		out, err = update(ctx, cur)
		return true, err
	})
	if err != nil {
		var zero T
		return zero, fmt.Errorf("fenced: update: %w", err)
	}
	return out, nil
}

// DeleteFenced reads the object with get, checks its stamp and calls del
// with the read object's UID and resourceVersion as preconditions, which
// del must pass on (metav1.DeleteOptions.Preconditions). A conflict is
// retried from a fresh read, at most WithMaxAttempts times and only while
// h holds the lease. A stale holder can still delete an object that no
// newer holder has written.
func DeleteFenced[T metav1.Object](ctx context.Context, h Holder, get func(context.Context) (T, error), del func(context.Context, metav1.Preconditions) error, opts ...Option) error {
	o, err := newOptions(opts)
	if err != nil {
		return err
	}
	e := &engine[T]{holder: h, opts: o, read: func(ctx context.Context, _ bool) (T, error) { return get(ctx) }}
	err = e.run(ctx, func(ctx context.Context, _ token.Token, cur T) (bool, error) {
		uid, rv := cur.GetUID(), e.version(cur)
		return true, del(ctx, metav1.Preconditions{UID: &uid, ResourceVersion: &rv})
	})
	if err != nil {
		return fmt.Errorf("fenced: delete: %w", err)
	}
	return nil
}

// deepCopy returns a deep copy of obj, so that neither mutate nor the stamp
// writes into an object the reader shares, such as a lister's, which is
// the informer's cache.
func deepCopy[T metav1.Object](obj T) (T, error) {
	var zero T
	ro, ok := any(obj).(runtime.Object)
	if !ok {
		return zero, fmt.Errorf("%w: %T is not a runtime.Object, so it cannot be copied before it is changed", ErrUnsupported, obj)
	}
	out, ok := ro.DeepCopyObject().(T)
	if !ok {
		return zero, fmt.Errorf("%w: a deep copy of %T is not a %T", ErrUnsupported, obj, zero)
	}
	return out, nil
}
