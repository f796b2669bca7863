package kubeadapter

import (
	"context"
	"fmt"
	"reflect"
	"slices"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fencer-dev/fencer/token"
)

// Client is a controller-runtime client.Client whose writes follow fencer's
// object protocol (docs/protocol.md): every write checks the object's
// fencer annotations with token.CheckStamp, stamps the holder's token and
// is conditional on the resourceVersion that was checked, so the API server
// rejects it if any write, in particular one with a greater token, landed
// in between. On a conflict a write is re-read and retried, at most
// WithMaxAttempts times and only while the Holder still holds the lease,
// unless the caller pinned a resourceVersion of its own.
//
// Reads (Get, List, SubResource Get) pass through to the inner client
// unchanged.
//
// What it guarantees, per object: once a write stamped with a token of the
// lease has landed on an object, no write through a Client holding a
// smaller token of that lease lands on it afterwards. What it does not
// guarantee: that a stale holder cannot write an object that no newer
// holder has written yet (that write is then ordered before the newer
// holder's), and anything about objects written by other means (install
// the admission policy in deploy/admission for those). Status writes and
// deletes carry the weaker guarantees described on their methods.
//
// Client refuses, with ErrUnsupported, what it cannot fence: DeleteAllOf,
// server-side apply, patch types other than JSON patch, merge patch and
// (for typed objects) strategic merge patch, and subresources other than
// status.
type Client struct {
	inner  client.Client
	reader client.Reader
	holder Holder
	opts   options
}

var (
	_ client.Client            = (*Client)(nil)
	_ client.SubResourceClient = (*subResourceClient)(nil)
)

// NewClient returns a fenced Client that writes through inner with the
// token of holder. It returns a *ConfigError for a nil inner or holder or
// an invalid option, and performs no I/O.
func NewClient(inner client.Client, holder Holder, opts ...Option) (*Client, error) {
	if inner == nil {
		return nil, &ConfigError{Field: "inner", Reason: "must not be nil"}
	}
	if holder == nil {
		return nil, &ConfigError{Field: "holder", Reason: "must not be nil"}
	}
	o, err := newOptions(opts)
	if err != nil {
		return nil, err
	}
	c := &Client{inner: inner, reader: o.reader, holder: holder, opts: o}
	if c.reader == nil {
		c.reader = inner
	}
	return c, nil
}

// Get passes through to the inner client.
func (c *Client) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	return c.inner.Get(ctx, key, obj, opts...)
}

// List passes through to the inner client.
func (c *Client) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	return c.inner.List(ctx, list, opts...)
}

// Scheme returns the inner client's scheme.
func (c *Client) Scheme() *runtime.Scheme { return c.inner.Scheme() }

// RESTMapper returns the inner client's RESTMapper.
func (c *Client) RESTMapper() meta.RESTMapper { return c.inner.RESTMapper() }

// GroupVersionKindFor passes through to the inner client.
func (c *Client) GroupVersionKindFor(obj runtime.Object) (schema.GroupVersionKind, error) {
	return c.inner.GroupVersionKindFor(obj)
}

// IsObjectNamespaced passes through to the inner client.
func (c *Client) IsObjectNamespaced(obj runtime.Object) (bool, error) {
	return c.inner.IsObjectNamespaced(obj)
}

// Create refuses an obj whose own annotations carry a stamp the holder may
// not overwrite, stamps the token and creates obj. Creation is conditional
// by nature (it fails if the object exists), but a stale holder can still
// create an object that does not exist. On error obj's annotations are
// restored.
func (c *Client) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	ann := obj.GetAnnotations()
	tok, err := heldToken(c.holder)
	if err == nil {
		err = token.CheckStamp(tok, ann, c.opts.takeover)
	}
	if err == nil {
		stamp(obj, ann, tok)
		err = c.inner.Create(ctx, obj, opts...)
	}
	if err != nil {
		obj.SetAnnotations(ann)
		return c.fail("create", obj, err)
	}
	return nil
}

// Update writes obj as a whole, like client.Update, conditionally:
//
//   - When obj carries a resourceVersion, that is the precondition, as in
//     client.Update. The stamp checked is obj's own, as read at that
//     resourceVersion (WithLiveRead reads the object instead). A conflict
//     is not retried, since the caller asked for that version; it is
//     returned, or a *token.StaleError when a fresh read shows a greater
//     token.
//   - When obj carries no resourceVersion (an unconditional update), the
//     object is read, its stamp checked, and obj written with the read
//     resourceVersion; a conflict is retried with a fresh read.
//
// On error obj's annotations and resourceVersion are restored.
func (c *Client) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	callerRV, ann := obj.GetResourceVersion(), obj.GetAnnotations()
	err := retry(ctx, c.holder, c.opts.maxAttempts, func(ctx context.Context, first bool) (bool, error) {
		tok, err := heldToken(c.holder)
		if err != nil {
			return false, err
		}
		readAnn, rv := ann, callerRV
		if !first || callerRV == "" || c.opts.liveRead {
			cur, err := c.read(ctx, obj)
			if err != nil {
				return false, err
			}
			readAnn = cur.GetAnnotations()
			if rv == "" {
				rv = cur.GetResourceVersion()
			}
		}
		if err := token.CheckStamp(tok, readAnn, c.opts.takeover); err != nil {
			return false, err
		}
		stamp(obj, ann, tok)
		obj.SetResourceVersion(rv)
		err = c.inner.Update(ctx, obj, opts...)
		if callerRV != "" && apierrors.IsConflict(err) {
			return false, c.conflictOrStale(ctx, obj, tok, err)
		}
		return true, err
	})
	if err != nil {
		obj.SetAnnotations(ann)
		obj.SetResourceVersion(callerRV)
		return c.fail("update", obj, err)
	}
	return nil
}

// Patch applies patch to a fresh read of the object, not on the server:
// it reads the object, checks its stamp, applies the patch locally,
// stamps the result and writes it with Update, conditional on the read
// resourceVersion. A conflict is retried with a fresh read, which is what
// the API server does for a patch, unless the patch itself sets
// metadata.resourceVersion (client.MergeFromWithOptimisticLock), which
// then is the precondition. Supported types: JSON patch, JSON merge patch
// and, for typed (not unstructured) objects, strategic merge patch; others
// return ErrUnsupported. Patch options map to the equivalent update
// options (DryRun, FieldManager, FieldValidation); Force is ignored. On
// success obj holds the written object.
func (c *Client) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	data, err := patch.Data(obj)
	if err != nil {
		return c.fail("patch", obj, err)
	}
	po := (&client.PatchOptions{}).ApplyOptions(opts)
	uo := &client.UpdateOptions{DryRun: po.DryRun, FieldManager: po.FieldManager, FieldValidation: po.FieldValidation}
	var next client.Object
	err = retry(ctx, c.holder, c.opts.maxAttempts, func(ctx context.Context, _ bool) (bool, error) {
		tok, err := heldToken(c.holder)
		if err != nil {
			return false, err
		}
		cur, err := c.read(ctx, obj)
		if err != nil {
			return false, err
		}
		if err := token.CheckStamp(tok, cur.GetAnnotations(), c.opts.takeover); err != nil {
			return false, err
		}
		var pinned bool
		next, pinned, err = applyPatch(cur, patch.Type(), data)
		if err != nil {
			return false, err
		}
		stamp(next, next.GetAnnotations(), tok)
		err = c.inner.Update(ctx, next, uo)
		if pinned && apierrors.IsConflict(err) {
			return false, c.conflictOrStale(ctx, obj, tok, err)
		}
		return true, err
	})
	if err != nil {
		return c.fail("patch", obj, err)
	}
	return copyInto(obj, next)
}

// Delete reads the object (or uses obj when it carries a resourceVersion
// and a UID, unless WithLiveRead), checks its stamp and deletes it with
// UID and resourceVersion preconditions, so that it fails if the object
// changed, or was replaced, after the check. A conflict is retried with a
// fresh read, unless the caller passed preconditions of its own, which
// then take precedence. A stale holder can still delete an object that no
// newer holder has written.
func (c *Client) Delete(ctx context.Context, obj client.Object, opts ...client.DeleteOption) error {
	callerPre := (&client.DeleteOptions{}).ApplyOptions(opts).Preconditions
	pinned := callerPre != nil && (callerPre.UID != nil || callerPre.ResourceVersion != nil)
	err := retry(ctx, c.holder, c.opts.maxAttempts, func(ctx context.Context, first bool) (bool, error) {
		tok, err := heldToken(c.holder)
		if err != nil {
			return false, err
		}
		var cur client.Object = obj
		if !first || c.opts.liveRead || obj.GetResourceVersion() == "" || obj.GetUID() == "" {
			if cur, err = c.read(ctx, obj); err != nil {
				return false, err
			}
		}
		if err := token.CheckStamp(tok, cur.GetAnnotations(), c.opts.takeover); err != nil {
			return false, err
		}
		uid, rv := cur.GetUID(), cur.GetResourceVersion()
		if pinned {
			if callerPre.UID != nil {
				uid = *callerPre.UID
			}
			if callerPre.ResourceVersion != nil {
				rv = *callerPre.ResourceVersion
			}
		}
		err = c.inner.Delete(ctx, obj, append(slices.Clone(opts), client.Preconditions{UID: &uid, ResourceVersion: &rv})...)
		if pinned && apierrors.IsConflict(err) {
			return false, c.conflictOrStale(ctx, obj, tok, err)
		}
		return true, err
	})
	if err != nil {
		return c.fail("delete", obj, err)
	}
	return nil
}

// DeleteAllOf is refused with ErrUnsupported: a collection delete cannot
// check each object's stamp under a precondition. List the objects and
// Delete each instead.
func (c *Client) DeleteAllOf(_ context.Context, obj client.Object, _ ...client.DeleteAllOfOption) error {
	return c.fail("delete all of", obj, fmt.Errorf("%w: a collection delete cannot be fenced; delete each object", ErrUnsupported))
}

// Apply is refused with ErrUnsupported: server-side apply has no
// resourceVersion precondition that covers a stamp check.
func (c *Client) Apply(_ context.Context, _ runtime.ApplyConfiguration, _ ...client.ApplyOption) error {
	return fmt.Errorf("kubeadapter: apply: %w: server-side apply cannot be fenced", ErrUnsupported)
}

// Status returns the fenced writer of the status subresource; see
// SubResource.
func (c *Client) Status() client.SubResourceWriter { return c.SubResource("status") }

// SubResource returns a client for the named subresource. Its Get passes
// through. For "status", Update and Patch are fenced as their doc says;
// every other write, and any write to another subresource, returns
// ErrUnsupported.
func (c *Client) SubResource(subResource string) client.SubResourceClient {
	return &subResourceClient{c: c, name: subResource}
}

// read reads the object obj names, into a new object of obj's type,
// through the protocol reader.
func (c *Client) read(ctx context.Context, obj client.Object) (client.Object, error) {
	cur, err := emptyLike(obj)
	if err != nil {
		return nil, err
	}
	if err := c.reader.Get(ctx, client.ObjectKeyFromObject(obj), cur); err != nil {
		return nil, err
	}
	return cur, nil
}

// conflictOrStale classifies a conflict on a write the caller pinned to
// its own resourceVersion; see the package-level function.
func (c *Client) conflictOrStale(ctx context.Context, obj client.Object, tok token.Token, conflict error) error {
	return conflictOrStale(conflict, func() error {
		cur, err := c.read(ctx, obj)
		if err != nil {
			return nil
		}
		return token.CheckStamp(tok, cur.GetAnnotations(), c.opts.takeover)
	})
}

func (c *Client) fail(op string, obj client.Object, err error) error {
	return fmt.Errorf("kubeadapter: %s %s %s: %w", op, kindOf(obj), client.ObjectKeyFromObject(obj), err)
}

// kindOf names obj's kind for errors: its GroupVersionKind's kind when
// set, else its Go type's name.
func kindOf(obj client.Object) string {
	if k := obj.GetObjectKind().GroupVersionKind().Kind; k != "" {
		return k
	}
	t := reflect.TypeOf(obj)
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t.Name()
}

// emptyLike returns a new, zero object of obj's type with obj's
// GroupVersionKind, ready to be read into.
func emptyLike(obj client.Object) (client.Object, error) {
	t := reflect.TypeOf(obj)
	if t.Kind() != reflect.Pointer {
		return nil, fmt.Errorf("kubeadapter: %T is not a pointer", obj)
	}
	n, ok := reflect.New(t.Elem()).Interface().(client.Object)
	if !ok {
		return nil, fmt.Errorf("kubeadapter: new %T is not a client.Object", obj)
	}
	n.GetObjectKind().SetGroupVersionKind(obj.GetObjectKind().GroupVersionKind())
	return n, nil
}

// copyInto makes dst a shallow copy of src, an object of the same type.
func copyInto(dst, src client.Object) error {
	d, s := reflect.ValueOf(dst), reflect.ValueOf(src)
	if d.Type() != s.Type() {
		return fmt.Errorf("kubeadapter: cannot copy %T into %T", src, dst)
	}
	d.Elem().Set(s.Elem())
	return nil
}

// patchUnsupported is the error for a patch type the fenced client does
// not apply.
func patchUnsupported(pt types.PatchType, why string) error {
	return fmt.Errorf("%w: patch type %q: %s", ErrUnsupported, pt, why)
}
