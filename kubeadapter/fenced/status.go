package fenced

import (
	"context"
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
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
// token of the lease), the status write is first sent as a dry run, so
// that a write the API server refuses stores nothing; then the main
// resource is stamped with a conditional merge patch of the freshly read
// object's annotations, and the status write is conditional on that
// write's resourceVersion. A dry run (client.DryRunAll) sends no stamping
// write. So a newer holder's status
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

// Apply applies config to the status subresource, fenced as Patch is with
// an apply patch. The object must exist.
func (s *subResourceClient) Apply(ctx context.Context, config runtime.ApplyConfiguration, opts ...client.SubResourceApplyOption) error {
	ao := (&client.SubResourceApplyOptions{}).ApplyOpts(opts)
	if ao.SubResourceBody != nil {
		return fmt.Errorf("fenced: apply %s: %w: a separate body", s.name, ErrUnsupported)
	}
	return s.c.apply(ctx, config, ao.ApplyOptions, func(ctx context.Context, obj client.Object, p client.Patch, po []client.PatchOption) error {
		return s.Patch(ctx, obj, p, &client.SubResourcePatchOptions{PatchOptions: *(&client.PatchOptions{}).ApplyOptions(po)})
	})
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
	if err := checkMetadata(obj); err != nil {
		return s.c.fail("update status", obj, err)
	}
	callerRV, ann := obj.GetResourceVersion(), obj.GetAnnotations()
	dryRun := len((&client.SubResourceUpdateOptions{}).ApplyOptions(opts).DryRun) > 0
	e := s.c.engine(obj, callerRV, callerRV != "")
	// send writes o's status over cur, with cur's fencer annotations
	// stamped and cur's resourceVersion as the precondition.
	send := func(ctx context.Context, tok token.Token, cur, o client.Object, opts ...client.SubResourceUpdateOption) error {
		o.SetAnnotations(restamp(tok, ann, cur))
		o.SetResourceVersion(e.version(cur))
		return s.c.inner.Status().Update(ctx, o, opts...)
	}
	err := e.run(ctx, func(ctx context.Context, tok token.Token, cur client.Object) (bool, error) {
		read := cur
		cur, err := s.stamp(ctx, tok, cur, dryRun, func(ctx context.Context) error {
			return send(ctx, tok, read, obj.DeepCopyObject().(client.Object), append(slices.Clone(opts), client.DryRunAll)...)
		})
		if err != nil {
			return true, err
		}
		return true, send(ctx, tok, cur, obj, opts...)
	})
	if err != nil {
		obj.SetAnnotations(ann)
		obj.SetResourceVersion(callerRV)
		return s.c.fail("update status", obj, err)
	}
	return nil
}

// Patch sends patch to the status subresource as a patch over the version
// fencer read, checked and, if needed, stamped (see the type's doc), with
// that version's resourceVersion as a precondition and the stamp added,
// as Client.Patch does (see it for what a patch may do, apply patches
// included, and how conflicts are retried). An apply never creates the
// object here: the object must exist. On success obj holds the object the
// API server returned.
func (s *subResourceClient) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	if s.name != "status" {
		return s.c.fail("patch "+s.name, obj, fmt.Errorf("%w: only the status subresource is fenced", ErrUnsupported))
	}
	if (&client.SubResourcePatchOptions{}).ApplyOptions(opts).SubResourceBody != nil {
		return s.c.fail("patch status", obj, fmt.Errorf("%w: a status patch with a separate body", ErrUnsupported))
	}
	dryRun := len((&client.SubResourcePatchOptions{}).ApplyOptions(opts).DryRun) > 0
	prepare := func(ctx context.Context, tok token.Token, cur client.Object, probe func(context.Context) error) (client.Object, error) {
		return s.stamp(ctx, tok, cur, dryRun, probe)
	}
	return s.c.patch(ctx, "patch status", obj, patch, prepare, func(ctx context.Context, p client.Patch, force, probe bool) error {
		o, target := slices.Clone(opts), obj
		if force {
			o = append(o, client.ForceOwnership)
		}
		if probe {
			o, target = append(o, client.DryRunAll), obj.DeepCopyObject().(client.Object)
		}
		return s.c.inner.Status().Patch(ctx, target, p, o...)
	})
}

// stamp returns cur, checked, when it carries exactly tok's stamp, or when
// the status write is a dry run, which must store nothing. Otherwise it
// sends the status write as a dry run over cur (probe), so that a write
// the API server refuses stores no stamp either, then stamps the main
// resource with a merge patch of its annotations conditional on cur's
// resourceVersion, and returns the stored result.
func (s *subResourceClient) stamp(ctx context.Context, tok token.Token, cur client.Object, dryRun bool, probe func(context.Context) error) (client.Object, error) {
	if stampedWith(cur.GetAnnotations(), tok) || dryRun {
		return cur, nil
	}
	if err := probe(ctx); err != nil {
		return nil, err
	}
	body, err := (&fencedPatch{pt: types.MergePatchType, doc: map[string]any{}}).with(restamp(tok, nil, cur), cur.GetAnnotations(), cur.GetResourceVersion(), "")
	if err == nil {
		err = s.c.inner.Patch(ctx, cur, client.RawPatch(types.MergePatchType, body))
	}
	if err != nil {
		return nil, fmt.Errorf("stamp before status write: %w", err)
	}
	return cur, nil
}
