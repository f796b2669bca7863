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

// Update writes obj's status. The object is always read first (see
// Client.Update for how), its stamp checked and, if needed, stamped (see
// the type's doc). When obj carries a resourceVersion, the version read
// must be that one, or Update writes nothing and returns a Conflict error
// or a *token.StaleError; the status write is then conditional on it (or
// on the holder's own stamping write after it). Otherwise the version read
// is the precondition, and a conflict is retried with a fresh read. The
// fencer annotations sent are those of the version written over (some
// kinds' status writes store the body's annotations). A body other than
// obj (client.WithSubResourceBody) is refused. On error obj's annotations
// and resourceVersion are restored.
func (s *subResourceClient) Update(ctx context.Context, obj client.Object, opts ...client.SubResourceUpdateOption) error {
	if s.name != "status" {
		return s.c.fail("update "+s.name, obj, fmt.Errorf("%w: only the status subresource is fenced", ErrUnsupported))
	}
	if (&client.SubResourceUpdateOptions{}).ApplyOptions(opts).SubResourceBody != nil {
		return s.c.fail("update status", obj, fmt.Errorf("%w: a status update with a separate body", ErrUnsupported))
	}
	callerRV, ann := obj.GetResourceVersion(), obj.GetAnnotations()
	err := retry(ctx, s.c.holder, s.c.opts.maxAttempts, func(ctx context.Context, first bool) (bool, error) {
		tok, cur, err := s.readStamped(ctx, obj, callerRV, first)
		if callerRV != "" && apierrors.IsConflict(err) {
			return false, s.c.conflictOrStale(ctx, obj, tok, err)
		}
		if err != nil {
			return true, err
		}
		obj.SetAnnotations(tok.Restamp(ann, cur.GetAnnotations()))
		obj.SetResourceVersion(cur.GetResourceVersion())
		err = s.c.inner.Status().Update(ctx, obj, opts...)
		if callerRV != "" && apierrors.IsConflict(err) {
			return false, s.c.conflictOrStale(ctx, obj, tok, err)
		}
		return true, err
	})
	if err != nil {
		obj.SetAnnotations(ann)
		obj.SetResourceVersion(callerRV)
		return s.c.fail("update status", obj, err)
	}
	return nil
}

// Patch applies patch to the status of the version fencer read, checked
// and, if needed, stamped (see the type's doc), locally as Client.Patch
// does, and writes it with a status Update conditional on that version.
// The patch cannot change fencer's annotations. A conflict is retried with
// a fresh read unless the patch sets metadata.resourceVersion: then the
// version read must be that one, or Patch writes nothing and returns a
// Conflict error or a *token.StaleError. On success obj holds the written
// object.
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
	p := &patchedRead{c: s.c, obj: obj, pt: patch.Type(), data: data}
	err = retry(ctx, s.c.holder, s.c.opts.maxAttempts, func(ctx context.Context, first bool) (bool, error) {
		tok, read, _, err := p.read(ctx, first)
		if err != nil {
			return false, err
		}
		cur, err := s.stamp(ctx, tok, read)
		if err != nil {
			return true, err
		}
		if next, err = applyPatch(cur, p.pt, p.data); err != nil {
			return false, err
		}
		restamp(next, cur.GetAnnotations(), tok)
		next.SetResourceVersion(cur.GetResourceVersion())
		err = s.c.inner.Status().Update(ctx, next, uo)
		if p.pinned != "" && apierrors.IsConflict(err) {
			return false, s.c.conflictOrStale(ctx, obj, tok, err)
		}
		return true, err
	})
	if err != nil {
		return s.c.fail("patch status", obj, err)
	}
	return copyInto(obj, next)
}

// readStamped reads and checks the object (Client.readChecked, which
// requires version want when set) and stamps it if needed (stamp). It
// returns the token and the object as stored after the check or the
// stamping write; its resourceVersion is the status write's precondition.
func (s *subResourceClient) readStamped(ctx context.Context, obj client.Object, want string, first bool) (token.Token, client.Object, error) {
	tok, cur, err := s.c.readChecked(ctx, obj, want, first)
	if err != nil {
		return tok, nil, err
	}
	cur, err = s.stamp(ctx, tok, cur)
	return tok, cur, err
}

// stamp returns cur, checked, when it carries exactly tok's stamp, and
// otherwise stamps the main resource with an Update of cur conditional on
// cur's resourceVersion and returns the stored result.
func (s *subResourceClient) stamp(ctx context.Context, tok token.Token, cur client.Object) (client.Object, error) {
	if stampedWith(cur.GetAnnotations(), tok) {
		return cur, nil
	}
	restamp(cur, cur.GetAnnotations(), tok)
	if err := s.c.inner.Update(ctx, cur); err != nil {
		return nil, fmt.Errorf("stamp before status write: %w", err)
	}
	return cur, nil
}
