package kubeadapter

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fencer-dev/fencer/token"
)

// subResourceClient is the fenced client of one subresource. Only status
// writes are fenced.
//
// A status write cannot change annotations, so it cannot carry a stamp.
// It is fenced instead by its resourceVersion precondition: the write is
// conditional on a version of the object that carries the holder's own
// stamp. When the object does not carry it yet (no stamp, or an older
// token of the lease), the main resource is first stamped with a
// conditional Update of the freshly read object, and the status write is
// conditional on that write's resourceVersion. So a newer holder's status
// write, which stamps first, fences an older holder's status writes.
type subResourceClient struct {
	c    *Client
	name string
}

// Get passes through to the inner client's subresource client.
func (s *subResourceClient) Get(ctx context.Context, obj, subResource client.Object, opts ...client.SubResourceGetOption) error {
	return s.c.inner.SubResource(s.name).Get(ctx, obj, subResource, opts...)
}

// Create is refused with ErrUnsupported.
func (s *subResourceClient) Create(_ context.Context, obj client.Object, _ client.Object, _ ...client.SubResourceCreateOption) error {
	return s.c.fail("create "+s.name, obj, fmt.Errorf("%w: subresource create cannot be fenced", ErrUnsupported))
}

// Apply is refused with ErrUnsupported.
func (s *subResourceClient) Apply(_ context.Context, _ runtime.ApplyConfiguration, _ ...client.SubResourceApplyOption) error {
	return fmt.Errorf("kubeadapter: apply %s: %w: server-side apply cannot be fenced", s.name, ErrUnsupported)
}

// Update writes obj's status. The object is always read first, its stamp
// checked and, if needed, stamped (see the type's doc). The precondition
// is obj's resourceVersion when set (moved past the holder's own stamping
// write, if one was made), otherwise the read one, and then a conflict is
// retried with a fresh read. A body other than obj
// (client.WithSubResourceBody) is refused.
func (s *subResourceClient) Update(ctx context.Context, obj client.Object, opts ...client.SubResourceUpdateOption) error {
	if s.name != "status" {
		return s.c.fail("update "+s.name, obj, fmt.Errorf("%w: only the status subresource is fenced", ErrUnsupported))
	}
	if (&client.SubResourceUpdateOptions{}).ApplyOptions(opts).SubResourceBody != nil {
		return s.c.fail("update status", obj, fmt.Errorf("%w: a status update with a separate body", ErrUnsupported))
	}
	callerRV := obj.GetResourceVersion()
	err := retry(ctx, s.c.holder, s.c.opts.maxAttempts, func(ctx context.Context, _ bool) (bool, error) {
		tok, cur, _, err := s.readStamped(ctx, obj, callerRV)
		if callerRV != "" && apierrors.IsConflict(err) {
			return false, s.c.conflictOrStale(ctx, obj, tok, err)
		}
		if err != nil {
			return true, err
		}
		obj.SetResourceVersion(cur.GetResourceVersion())
		err = s.c.inner.Status().Update(ctx, obj, opts...)
		if callerRV != "" && apierrors.IsConflict(err) {
			return false, s.c.conflictOrStale(ctx, obj, tok, err)
		}
		return true, err
	})
	if err != nil {
		obj.SetResourceVersion(callerRV)
		return s.c.fail("update status", obj, err)
	}
	return nil
}

// Patch applies patch to the status of a fresh, stamped read of the
// object (see the type's doc), locally as Client.Patch does, and writes it
// with a status Update conditional on the read resourceVersion. A
// conflict is retried with a fresh read unless the patch sets
// metadata.resourceVersion. On success obj holds the written object.
func (s *subResourceClient) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	if s.name != "status" {
		return s.c.fail("patch "+s.name, obj, fmt.Errorf("%w: only the status subresource is fenced", ErrUnsupported))
	}
	po := (&client.SubResourcePatchOptions{}).ApplyOptions(opts)
	if po.SubResourceBody != nil {
		return s.c.fail("patch status", obj, fmt.Errorf("%w: a status patch with a separate body", ErrUnsupported))
	}
	data, err := patch.Data(obj)
	if err != nil {
		return s.c.fail("patch status", obj, err)
	}
	uo := &client.SubResourceUpdateOptions{UpdateOptions: client.UpdateOptions{
		DryRun: po.DryRun, FieldManager: po.FieldManager, FieldValidation: po.FieldValidation,
	}}
	var next client.Object
	err = retry(ctx, s.c.holder, s.c.opts.maxAttempts, func(ctx context.Context, _ bool) (bool, error) {
		tok, cur, readRV, err := s.readStamped(ctx, obj, "")
		if err != nil {
			return true, err
		}
		var pinned bool
		if next, pinned, err = applyPatch(cur, patch.Type(), data); err != nil {
			return false, err
		}
		if pinned && next.GetResourceVersion() == readRV {
			// The patch pinned the version it was computed from; the only
			// write since is the holder's own stamp.
			next.SetResourceVersion(cur.GetResourceVersion())
		}
		err = s.c.inner.Status().Update(ctx, next, uo)
		if pinned && apierrors.IsConflict(err) {
			return false, s.c.conflictOrStale(ctx, obj, tok, err)
		}
		return true, err
	})
	if err != nil {
		return s.c.fail("patch status", obj, err)
	}
	return copyInto(obj, next)
}

// readStamped reads the object, checks its stamp and, unless it already
// carries exactly the holder's token, stamps the main resource with an
// Update conditional on rv (or, when rv is empty, on the read
// resourceVersion). It returns the token and the object as stored after
// the check or the stamping write; its resourceVersion is the status
// write's precondition. When rv is set and the object was already stamped,
// the returned object's resourceVersion is rv. readRV is the
// resourceVersion the object was read at.
func (s *subResourceClient) readStamped(ctx context.Context, obj client.Object, rv string) (tok token.Token, cur client.Object, readRV string, err error) {
	if tok, err = heldToken(s.c.holder); err != nil {
		return tok, nil, "", err
	}
	if cur, err = s.c.read(ctx, obj); err != nil {
		return tok, nil, "", err
	}
	if err := token.CheckStamp(tok, cur.GetAnnotations(), s.c.opts.takeover); err != nil {
		return tok, nil, "", err
	}
	readRV = cur.GetResourceVersion()
	if rv != "" {
		cur.SetResourceVersion(rv)
	}
	if stampedWith(cur.GetAnnotations(), tok) {
		return tok, cur, readRV, nil
	}
	stamp(cur, cur.GetAnnotations(), tok)
	if err := s.c.inner.Update(ctx, cur); err != nil {
		return tok, nil, readRV, fmt.Errorf("stamp before status write: %w", err)
	}
	return tok, cur, readRV, nil
}
