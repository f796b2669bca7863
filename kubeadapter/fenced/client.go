package fenced

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fencer-dev/fencer/token"
)

// Client is a controller-runtime client.Client whose writes follow fencer's
// object protocol (docs/protocol.md): every write reads the object itself
// (WithReader, WithAPIReader), checks that copy's fencer annotations with
// token.CheckStamp, stamps the holder's token over that copy's protocol
// annotations (token.Restamp) and is conditional on that copy's
// resourceVersion, so the API server rejects it if any write, in
// particular one with a greater token, landed in between. The caller's
// object supplies the content written, never the stamp checked or the
// version written over. On a conflict a write is re-read and retried, at most
// WithMaxAttempts times and only while the Holder still holds the lease,
// unless the caller pinned a resourceVersion of its own.
//
// Reads (Get, List, SubResource Get) pass through to the inner client
// unchanged.
//
// What it guarantees, per object: once a write stamped with a token of the
// lease has landed on an object, no write through a Client holding a
// smaller token of that lease lands on it afterwards, also after other
// leases took the object over (WithTakeover keeps the replaced lease's
// mark). What it does not
// guarantee: that a stale holder cannot write an object that no newer
// holder has written yet (that write is then ordered before the newer
// holder's), and anything about objects written by other means (install
// the admission policy in deploy/admission for those). Status writes and
// deletes carry the weaker guarantees described on their methods.
//
// Patch and Apply are sent to the API server as a patch and an apply,
// so fields that the caller's Go type does not know are kept.
//
// Client refuses, with ErrUnsupported, what it cannot fence: DeleteAllOf,
// a create of a core/v1 Binding (it writes the Pod), patch types other
// than JSON patch, merge patch, strategic merge patch and apply, and
// subresources other than status. Updates of metadata-only objects
// (metav1.PartialObjectMetadata) fail, since the whole object is written;
// patch them instead.
type Client struct {
	inner     client.Client
	reader    client.Reader
	apiReader client.Reader
	holder    Holder
	opts      options
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
	c := &Client{inner: inner, reader: o.reader, apiReader: o.apiReader, holder: holder, opts: o}
	if c.reader == nil {
		c.reader = inner
	}
	if c.apiReader == nil {
		c.apiReader = inner
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

// bindingKind is the kind whose create writes another object, its Pod.
var bindingKind = schema.GroupKind{Kind: "Binding"}

// Create refuses an obj whose own annotations carry a stamp the holder may
// not overwrite, stamps the token and creates obj. A core/v1 Binding, whose
// create writes its Pod, is refused with ErrUnsupported. Creation is conditional
// by nature (it fails if the object exists), but a stale holder can still
// create an object that does not exist: install the live-Lease admission
// mode (docs/protocol.md) to refuse that too. On error obj's annotations
// are restored.
func (c *Client) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	if err := checkMetadata(obj); err != nil {
		return c.fail("create", obj, err)
	}
	if gvk, err := c.inner.GroupVersionKindFor(obj); err == nil && gvk.GroupKind() == bindingKind {
		return c.fail("create", obj, fmt.Errorf("%w: a Binding's create writes its Pod, whose stamp cannot be checked first; bind through the pods/binding subresource", ErrUnsupported))
	}
	ann := obj.GetAnnotations()
	tok, err := heldToken(c.holder)
	if err == nil {
		err = token.CheckStamp(tok, ann, c.opts.takeover)
	}
	if err == nil {
		obj.SetAnnotations(tok.Stamp(maps.Clone(ann)))
		err = c.inner.Create(ctx, obj, opts...)
	}
	if err != nil {
		obj.SetAnnotations(ann)
		return c.fail("create", obj, err)
	}
	return nil
}

// Update writes obj as a whole, like client.Update, conditionally on the
// version whose stamp it checked, which fencer reads itself: from the
// reader (WithReader) when that holds the version to be written, through
// the API reader (WithAPIReader) otherwise. It never trusts the stamp or
// the resourceVersion of obj:
//
//   - When obj carries a resourceVersion, that version must be the one
//     read and checked. If the object has moved past it, Update writes
//     nothing and returns a *token.StaleError when the current version
//     carries a greater token, otherwise a Conflict error; it does not
//     retry, since the caller asked for that version.
//   - When obj carries no resourceVersion, the version read is written
//     over, and a conflict is retried with a fresh live read.
//
// The fencer annotations written are those of the version checked,
// stamped with the holder's token (token.Restamp): obj's own fencer
// annotations are ignored, so a caller-built object can neither lower nor
// drop a stamp. obj's other annotations are written as given. The write
// also carries the UID of the version checked (unless obj has its own),
// so an object deleted after the check is not created again by a kind
// whose PUT creates absent objects (Lease, LimitRange). On error obj's
// annotations, resourceVersion and UID are restored.
func (c *Client) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	if err := checkMetadata(obj); err != nil {
		return c.fail("update", obj, err)
	}
	callerRV, callerUID, ann := obj.GetResourceVersion(), obj.GetUID(), obj.GetAnnotations()
	e := c.engine(obj, callerRV, callerRV != "")
	err := e.run(ctx, func(ctx context.Context, tok token.Token, cur client.Object) (bool, error) {
		obj.SetAnnotations(restamp(tok, ann, cur))
		obj.SetResourceVersion(e.version(cur))
		if callerUID == "" {
			// Some kinds' PUT creates an absent object whatever
			// resourceVersion it carries; with the UID checked it cannot.
			obj.SetUID(cur.GetUID())
		}
		return true, c.inner.Update(ctx, obj, opts...)
	})
	if err != nil {
		obj.SetAnnotations(ann)
		obj.SetResourceVersion(callerRV)
		obj.SetUID(callerUID)
		return c.fail("update", obj, err)
	}
	return nil
}

// Patch sends patch to the API server as a patch, with two additions:
// the holder's stamp over the fencer annotations of the version it read
// and checked (see Update for how it reads; token.Restamp), and that
// version's resourceVersion as a precondition, so the API server refuses
// the patch with a Conflict if the object moved after the check. The API
// server applies the patch to the stored object, so fields that obj's Go
// type does not know are kept, as with a plain patch.
//
// What the patch may do:
//   - Writes of fencer's annotations in the patch are dropped: the stamp
//     is fencer's to set, so a patch can neither lower nor drop it. Null
//     annotations (merge patch) or a removal of /metadata/annotations
//     (JSON patch) remove every annotation but fencer's.
//   - A patch that writes the whole object or metadata, moves a fencer
//     annotation, or carries a strategic merge directive that replaces,
//     deletes or prunes the object, its metadata or its annotations, is
//     refused with ErrInvalidPatch, as is one that cannot be parsed.
//   - Supported types: JSON patch, JSON merge patch, strategic merge patch
//     and apply (server-side apply; see Apply). Others return
//     ErrUnsupported.
//
// A conflict is retried with a fresh read, unless the patch itself sets
// metadata.resourceVersion (client.MergeFromWithOptimisticLock, or a JSON
// patch op that sets /metadata/resourceVersion): then that version must
// be the one checked, or Patch writes nothing and returns a Conflict error
// or a *token.StaleError, as Update does for a pinned resourceVersion.
// Patch options pass through. On success obj holds the object the API
// server returned.
func (c *Client) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	return c.patch(ctx, "patch", obj, patch, nil, func(ctx context.Context, p client.Patch, force, _ bool) error {
		o := opts
		if force {
			o = append(slices.Clone(opts), client.ForceOwnership)
		}
		return c.inner.Patch(ctx, obj, p, o...)
	})
}

// sendFunc sends a fenced patch; force adds client.ForceOwnership. A
// dry run adds client.DryRunAll and decodes the result into a copy of the
// object, never into the caller's.
type sendFunc func(ctx context.Context, p client.Patch, force, dryRun bool) error

// absentRV is the precondition of an apply that must create its object: a
// resourceVersion no stored object has, since etcd revisions, from which
// the API server takes resourceVersions, count up from 1 as int64 and
// never reach it. The API server ignores an apply's resourceVersion when
// the apply creates the object (verified on kube-apiserver v1.37 by
// TestApplyOverAnObjectTheReadsMissed).
const absentRV = "9223372036854775807"

// prepareFunc returns the version a patch is sent over, given the version
// read and checked. The status client stamps the object first; before a
// stamping write it calls probe, which sends the patch over cur as a dry
// run, so that a patch the API server refuses stores no stamp either.
type prepareFunc func(ctx context.Context, tok token.Token, cur client.Object, probe func(context.Context) error) (client.Object, error)

// patch runs one fenced patch of obj: it reads and checks the object,
// prepares it when prepare is set, and sends the caller's patch with the
// stamp and the precondition added (fencedPatch.with).
//
// An apply over an object that was read is also conditional on the UID
// read: the API server refuses, with a Conflict, an apply that names a UID
// when no object exists, instead of creating one (the resourceVersion
// alone does not stop it, since the API server ignores it on a create).
// So an object deleted after the read is not recreated: the conflict is
// retried with a fresh read, which finds nothing, and patch returns
// ErrDeleted with the NotFound error.
//
// An apply whose object is not found, also through the API reader, and
// that neither the caller's object (a resourceVersion or UID) nor the
// patch (a UID) nor an earlier attempt showed existing, creates it,
// stamped, with the precondition resourceVersion absentRV: the API
// server ignores it when the apply creates, and refuses the apply with a
// Conflict when the object exists, since no stored object is at that
// version. So an object that another holder creates between the live read
// and the apply is not written over: the conflict is retried with a fresh
// read, which checks that holder's stamp. Otherwise it returns ErrDeleted.
//
// An apply that conflicts with other field managers only over fencer's
// annotations is sent again with Force, conditional on the same version:
// the stamp is fencer's, whoever applied it last. Conflicts over any other
// field are returned as they are, and not retried.
func (c *Client) patch(ctx context.Context, op string, obj client.Object, patch client.Patch, prepare prepareFunc, send sendFunc) error {
	data, err := patch.Data(obj)
	if err != nil {
		return c.fail(op, obj, err)
	}
	p, err := parsePatch(patch.Type(), data)
	if err != nil {
		return c.fail(op, obj, err)
	}
	// seen is whether the caller's object, or a read, showed the object
	// existing: an apply must then not create it.
	seen := obj.GetResourceVersion() != "" || obj.GetUID() != "" || p.uid != ""
	e := c.engine(obj, p.pinned, p.pinned != "")
	if p.pt == types.ApplyPatchType {
		e.absent = func(ctx context.Context, tok token.Token, err error) (bool, error) {
			if seen {
				return false, fmt.Errorf("%w: %w", ErrDeleted, err)
			}
			if p.pinned != "" || prepare != nil {
				return false, err
			}
			body, err := p.with(tok.Stamp(nil), nil, absentRV, "")
			if err != nil {
				return false, err
			}
			return true, send(ctx, client.RawPatch(p.pt, body), false, false)
		}
	}
	// over returns the patch to send over cur: the caller's, stamped and
	// conditional on cur's version.
	over := func(tok token.Token, cur client.Object) ([]byte, error) {
		return p.with(restamp(tok, nil, cur), cur.GetAnnotations(), e.version(cur), cur.GetUID())
	}
	err = e.run(ctx, func(ctx context.Context, tok token.Token, cur client.Object) (bool, error) {
		seen = true
		if p.uid != "" && p.uid != cur.GetUID() {
			return false, e.pinnedConflict(fmt.Sprintf("the patch names UID %s, the object has UID %s", p.uid, cur.GetUID()))
		}
		if prepare != nil {
			probe := func(ctx context.Context) error {
				body, err := over(tok, cur)
				if err != nil {
					return err
				}
				return send(ctx, client.RawPatch(p.pt, body), false, true)
			}
			var err error
			if cur, err = prepare(ctx, tok, cur, probe); err != nil {
				return true, err
			}
		}
		body, err := over(tok, cur)
		if err != nil {
			return false, err
		}
		err = send(ctx, client.RawPatch(p.pt, body), false, false)
		if stampConflictsOnly(err) {
			err = send(ctx, client.RawPatch(p.pt, body), true, false)
		}
		return !fieldConflict(err), err
	})
	if err != nil {
		return c.fail(op, obj, err)
	}
	return nil
}

// Delete reads the object (see Update for how), checks its stamp and
// deletes it with the UID and resourceVersion of the version checked as
// preconditions, so that it fails if the object changed, or was replaced,
// after the check. obj's own UID and resourceVersion are not trusted. A
// conflict is retried with a fresh read, unless the caller passed
// preconditions of its own: then the version checked must match them, or
// Delete deletes nothing and returns a Conflict error or a
// *token.StaleError. A stale holder can still delete an object that no
// newer holder has written.
func (c *Client) Delete(ctx context.Context, obj client.Object, opts ...client.DeleteOption) error {
	callerPre := (&client.DeleteOptions{}).ApplyOptions(opts).Preconditions
	var wantUID types.UID
	var wantRV string
	if callerPre != nil && callerPre.UID != nil {
		wantUID = *callerPre.UID
	}
	if callerPre != nil && callerPre.ResourceVersion != nil {
		wantRV = *callerPre.ResourceVersion
	}
	e := c.engine(obj, wantRV, wantUID != "" || wantRV != "")
	err := e.run(ctx, func(ctx context.Context, _ token.Token, cur client.Object) (bool, error) {
		uid, rv := cur.GetUID(), e.version(cur)
		if wantUID != "" && wantUID != uid {
			return false, e.pinnedConflict(fmt.Sprintf("the precondition names UID %s, the object has UID %s", wantUID, uid))
		}
		return true, c.inner.Delete(ctx, obj, append(slices.Clone(opts), client.Preconditions{UID: &uid, ResourceVersion: &rv})...)
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

// Apply is server-side apply, fenced: it sends config as an apply patch
// through Patch, which adds the holder's stamp and the resourceVersion and
// UID of the version it checked as preconditions (see Patch for reads,
// conflicts, and the creation of an absent object). An object a read saw
// is never created again: if it was deleted since, Apply returns
// ErrDeleted with the NotFound error. An object no read saw is created,
// which is not fenced against a stale holder (docs/protocol.md, Limits).
//
// The stamp annotations are owned by the applying field manager, not by a
// field manager of fencer's own (that would take a second write per
// apply): a later plain apply by the same manager, without them, removes
// the stamp, unless the admission policy refuses it. Send every apply of
// that manager through Apply. A conflict over the stamp alone is taken
// over with Force, a conflict over any other field is returned as a
// Conflict error whose causes name the fields, as a plain apply returns it
// (pass client.ForceOwnership to take those over too). On success config
// holds the object the API server returned.
func (c *Client) Apply(ctx context.Context, config runtime.ApplyConfiguration, opts ...client.ApplyOption) error {
	return c.apply(ctx, config, *(&client.ApplyOptions{}).ApplyOptions(opts), func(ctx context.Context, obj client.Object, p client.Patch, po []client.PatchOption) error {
		return c.Patch(ctx, obj, p, po...)
	})
}

// apply sends config as an apply patch through patch, with the patch
// options of the same meaning as ao, and decodes the result into config.
func (c *Client) apply(ctx context.Context, config runtime.ApplyConfiguration, ao client.ApplyOptions,
	patch func(ctx context.Context, obj client.Object, p client.Patch, po []client.PatchOption) error) error {
	data, err := json.Marshal(config)
	if err != nil {
		return fmt.Errorf("fenced: apply: encode %T: %w", config, err)
	}
	_, unstructuredConfig := config.(runtime.Unstructured)
	target, err := c.applyTarget(data, unstructuredConfig)
	if err != nil {
		return fmt.Errorf("fenced: apply: %w", err)
	}
	po := []client.PatchOption{&client.PatchOptions{DryRun: ao.DryRun, FieldManager: ao.FieldManager}}
	if ao.Force != nil && *ao.Force {
		po = append(po, client.ForceOwnership)
	}
	if err := patch(ctx, target, client.RawPatch(types.ApplyPatchType, data), po); err != nil {
		return err
	}
	out, err := json.Marshal(target)
	if err == nil {
		err = json.Unmarshal(out, config)
	}
	if err != nil {
		return fmt.Errorf("fenced: apply: decode the applied object into %T: %w", config, err)
	}
	return nil
}

// applyTarget returns the object an apply configuration names: of its Go
// type when the scheme knows its kind, else unstructured. An unstructured
// configuration gets an unstructured target, so that the object the API
// server returns reaches it whole, with fields the Go type lacks.
func (c *Client) applyTarget(data []byte, unstructuredConfig bool) (client.Object, error) {
	var head struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name      string `json:"name"`
			Namespace string `json:"namespace"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(data, &head); err != nil || head.Kind == "" || head.Metadata.Name == "" {
		return nil, fmt.Errorf("%w: an apply configuration needs apiVersion, kind and metadata.name", ErrInvalidPatch)
	}
	gvk := schema.FromAPIVersionAndKind(head.APIVersion, head.Kind)
	var obj client.Object = &unstructured.Unstructured{}
	if typed, err := c.inner.Scheme().New(gvk); err == nil && !unstructuredConfig {
		if o, ok := typed.(client.Object); ok {
			obj = o
		}
	}
	obj.GetObjectKind().SetGroupVersionKind(gvk)
	obj.SetName(head.Metadata.Name)
	obj.SetNamespace(head.Metadata.Namespace)
	return obj, nil
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

// engine returns the fenced write of obj: read with read, want the
// resourceVersion the caller asked for, pinned whether conflicts are the
// caller's to handle.
func (c *Client) engine(obj client.Object, want string, pinned bool) *engine[client.Object] {
	return &engine[client.Object]{
		holder: c.holder, opts: c.opts, want: want, pinned: pinned, caller: obj,
		read: func(ctx context.Context, live bool) (client.Object, error) { return c.read(ctx, obj, live) },
	}
}

// read reads the object obj names, into a new object of obj's type,
// through the API reader when live, else through the reader.
//
// A reader whose objects share memory with what it handed the caller (a
// controller-runtime cache with UnsafeDisableDeepCopy) returns the
// caller's own annotations, hand edits included, as the stored ones. When
// the read's annotations are obj's own map, read reads live instead, so
// that a stamp the caller wrote into that memory is never checked as the
// store's.
func (c *Client) read(ctx context.Context, obj client.Object, live bool) (client.Object, error) {
	cur, err := emptyLike(obj)
	if err != nil {
		return nil, err
	}
	r := c.reader
	if live {
		r = c.apiReader
	}
	if err := r.Get(ctx, client.ObjectKeyFromObject(obj), cur); err != nil {
		return nil, err
	}
	if !live && sameMap(cur.GetAnnotations(), obj.GetAnnotations()) {
		return c.read(ctx, obj, true)
	}
	return cur, nil
}

// checkMetadata refuses, with ErrInvalidObject, an unstructured object
// whose annotations or resourceVersion fencer could not read exactly: their
// getters return nothing for a value of the wrong type, and fencer's write
// would then replace it instead of failing.
func checkMetadata(obj any) error {
	u, ok := obj.(runtime.Unstructured)
	if !ok {
		return nil
	}
	content := u.UnstructuredContent()
	if _, _, err := unstructured.NestedStringMap(content, "metadata", "annotations"); err != nil {
		return fmt.Errorf("%w: metadata.annotations: %v", ErrInvalidObject, err)
	}
	if _, _, err := unstructured.NestedString(content, "metadata", "resourceVersion"); err != nil {
		return fmt.Errorf("%w: metadata.resourceVersion: %v", ErrInvalidObject, err)
	}
	return nil
}

// sameMap reports whether a and b are one non-nil map.
func sameMap(a, b map[string]string) bool {
	return a != nil && b != nil && reflect.ValueOf(a).UnsafePointer() == reflect.ValueOf(b).UnsafePointer()
}

func (c *Client) fail(op string, obj client.Object, err error) error {
	return fmt.Errorf("fenced: %s %s %s: %w", op, kindOf(obj), client.ObjectKeyFromObject(obj), err)
}

// kindOf names obj's kind for errors: its GroupVersionKind's kind when
// set, else its Go type's name.
func kindOf(obj runtime.Object) string {
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
		return nil, fmt.Errorf("fenced: %T is not a pointer", obj)
	}
	n, ok := reflect.New(t.Elem()).Interface().(client.Object)
	if !ok {
		return nil, fmt.Errorf("fenced: new %T is not a client.Object", obj)
	}
	n.GetObjectKind().SetGroupVersionKind(obj.GetObjectKind().GroupVersionKind())
	return n, nil
}
