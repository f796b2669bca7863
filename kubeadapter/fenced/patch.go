package fenced

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"

	"github.com/fencer-dev/fencer/token"
)

// fencedPatch is a caller's patch, parsed, that fencer sends on to the API
// server with the stamp and a resourceVersion precondition added (with).
// The API server applies it to the stored object, so fields that the
// caller's Go type does not know are kept.
type fencedPatch struct {
	pt types.PatchType
	// ops is a JSON patch's operations; doc is the object of any other
	// patch type.
	ops []map[string]json.RawMessage
	doc map[string]any
	// pinned is the resourceVersion the caller's patch sets itself, if
	// any: the version written over must then be that one.
	pinned string
	// uid is the UID the caller's merge, strategic merge or apply patch
	// sets itself, if any: the object written over must then be that one.
	uid types.UID
}

// parsePatch parses data, a patch of type pt, and finds the
// resourceVersion it pins. Malformed data, and patches that replace the
// whole object or its metadata, fail with ErrInvalidPatch; patch types
// other than JSON patch, merge patch, strategic merge patch and apply fail
// with ErrUnsupported.
func parsePatch(pt types.PatchType, data []byte) (*fencedPatch, error) {
	p := &fencedPatch{pt: pt}
	switch pt {
	case types.JSONPatchType:
		if err := json.Unmarshal(data, &p.ops); err != nil {
			return nil, invalidPatch(pt, "not a JSON array of operations: %v", err)
		}
		for i, op := range p.ops {
			if err := p.parseOp(i, op); err != nil {
				return nil, err
			}
		}
	case types.MergePatchType, types.StrategicMergePatchType, types.ApplyPatchType:
		js := data
		if pt == types.ApplyPatchType {
			var err error
			if js, err = yaml.YAMLToJSON(data); err != nil {
				return nil, invalidPatch(pt, "not YAML or JSON: %v", err)
			}
		}
		if err := json.Unmarshal(js, &p.doc); err != nil || p.doc == nil {
			return nil, invalidPatch(pt, "not a JSON object: %v", err)
		}
		if err := p.parseDoc(); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("%w: patch type %q: only JSON patch, merge patch, strategic merge patch and apply can be fenced", ErrUnsupported, pt)
	}
	return p, nil
}

// parseOp checks one JSON patch operation: it must not write the object or
// its metadata as a whole, nor move a fencer annotation away, and it may
// pin the resourceVersion.
func (p *fencedPatch) parseOp(i int, op map[string]json.RawMessage) error {
	var name, path, from string
	if err := json.Unmarshal(op["op"], &name); err != nil {
		return invalidPatch(p.pt, "operation %d has no op", i)
	}
	if err := json.Unmarshal(op["path"], &path); err != nil {
		return invalidPatch(p.pt, "operation %d has no path", i)
	}
	if raw, ok := op["from"]; ok {
		if err := json.Unmarshal(raw, &from); err != nil {
			return invalidPatch(p.pt, "operation %d has a malformed from", i)
		}
	}
	if name == "test" {
		return nil
	}
	if path == "" || path == "/metadata" {
		return invalidPatch(p.pt, "operation %d (%s) writes %q as a whole; patch its fields instead", i, name, path)
	}
	if name == "move" && (from == "/metadata" || from == annotationsPath || protocolPath(from) || protocolPath(path)) {
		return invalidPatch(p.pt, "operation %d moves from %q to %q: fencer stamps its annotations itself", i, from, path)
	}
	if path == rvPath && (name == "add" || name == "replace") {
		if err := json.Unmarshal(op["value"], &p.pinned); err != nil || p.pinned == "" {
			return invalidPatch(p.pt, "operation %d sets resourceVersion to a value that is not a version", i)
		}
	}
	return nil
}

// parseDoc checks the object of a merge, strategic merge or apply patch:
// its metadata and annotations, when present, must be objects (or null
// annotations), strategic merge directives must not replace or delete
// them, and metadata.resourceVersion may pin a version.
func (p *fencedPatch) parseDoc() error {
	if err := p.noDirectives(p.doc, "the object"); err != nil {
		return err
	}
	raw, ok := p.doc["metadata"]
	if !ok {
		return nil
	}
	meta, ok := raw.(map[string]any)
	if !ok {
		return invalidPatch(p.pt, "metadata is not an object")
	}
	if err := p.noDirectives(meta, "metadata"); err != nil {
		return err
	}
	if rv, ok := meta["resourceVersion"]; ok && rv != nil {
		if p.pinned, ok = rv.(string); !ok || p.pinned == "" {
			return invalidPatch(p.pt, "metadata.resourceVersion is not a version")
		}
	}
	if raw, ok := meta["uid"]; ok && raw != nil {
		uid, ok := raw.(string)
		if !ok || uid == "" {
			return invalidPatch(p.pt, "metadata.uid is not a UID")
		}
		p.uid = types.UID(uid)
	}
	switch ann := meta["annotations"].(type) {
	case nil:
	case map[string]any:
		for k, v := range ann {
			if strings.HasPrefix(k, "$") && (p.pt != types.StrategicMergePatchType || k != "$patch" || v != "replace") {
				return invalidPatch(p.pt, "metadata.annotations carries the directive %q", k)
			}
		}
	default:
		return invalidPatch(p.pt, "metadata.annotations is not an object")
	}
	return nil
}

// noDirectives refuses strategic merge directives that replace, delete or
// prune obj (the object or its metadata), since they could drop the stamp.
func (p *fencedPatch) noDirectives(obj map[string]any, what string) error {
	if p.pt != types.StrategicMergePatchType {
		return nil
	}
	for _, d := range []string{"$patch", "$retainKeys"} {
		if _, ok := obj[d]; ok {
			return invalidPatch(p.pt, "%s carries the directive %q", what, d)
		}
	}
	return nil
}

// with returns the patch to send over a stored object whose annotations
// are stored: the caller's patch, whose writes of fencer's annotations are
// dropped, with stamp (the protocol annotations to store, from
// token.Restamp) set, and conditional on resourceVersion rv. An apply is
// also conditional on uid, when set: the API server refuses an apply that
// names a UID when no object exists, so it cannot create one.
func (p *fencedPatch) with(stamp, stored map[string]string, rv string, uid types.UID) ([]byte, error) {
	if p.pt == types.JSONPatchType {
		return json.Marshal(p.opsWith(stamp, stored, rv))
	}
	doc := maps.Clone(p.doc)
	meta, _ := doc["metadata"].(map[string]any)
	meta = maps.Clone(meta)
	if meta == nil {
		meta = map[string]any{}
	}
	doc["metadata"] = meta
	ann, _ := meta["annotations"].(map[string]any)
	if v, ok := meta["annotations"]; ok && v == nil && p.pt != types.ApplyPatchType {
		// null annotations delete every annotation but fencer's.
		ann = map[string]any{}
		for k := range stored {
			if !token.IsProtocolKey(k) {
				ann[k] = nil
			}
		}
	}
	out := make(map[string]any, len(ann)+len(stamp))
	for k, v := range ann {
		if !token.IsProtocolKey(k) {
			out[k] = v
		}
	}
	for k, v := range stamp {
		out[k] = v
	}
	meta["annotations"] = out
	meta["resourceVersion"] = rv
	if p.pt == types.ApplyPatchType && uid != "" {
		meta["uid"] = string(uid)
	}
	return json.Marshal(doc)
}

// stampConflictsOnly reports whether err is an apply's conflict with other
// field managers over fencer's annotations and nothing else.
func stampConflictsOnly(err error) bool {
	causes := fieldConflicts(err)
	for _, c := range causes {
		key, ok := strings.CutPrefix(c.Field, ".metadata.annotations.")
		if !ok || !token.IsProtocolKey(key) {
			return false
		}
	}
	return len(causes) > 0
}

// fieldConflict reports whether err is an apply's conflict with other
// field managers, rather than a resourceVersion conflict.
func fieldConflict(err error) bool { return len(fieldConflicts(err)) > 0 }

// fieldConflicts returns the field manager conflicts err reports, or none
// when any cause of a Conflict error is of another type.
func fieldConflicts(err error) []metav1.StatusCause {
	var status apierrors.APIStatus
	if !apierrors.IsConflict(err) || !errors.As(err, &status) || status.Status().Details == nil {
		return nil
	}
	causes := status.Status().Details.Causes
	for _, c := range causes {
		if c.Type != metav1.CauseTypeFieldManagerConflict {
			return nil
		}
	}
	return causes
}

// opsWith is with for a JSON patch: the caller's operations without those
// that write a fencer annotation, a removal of all annotations turned
// into an emptying, then one add per stamp annotation and a replace of
// the resourceVersion, which makes the write conditional: the API server
// refuses it with a Conflict when the object is at another version.
func (p *fencedPatch) opsWith(stamp, stored map[string]string, rv string) []map[string]json.RawMessage {
	out := make([]map[string]json.RawMessage, 0, len(p.ops)+len(stamp)+1)
	annotations := len(stored) > 0
	for _, op := range p.ops {
		var name, path string
		_ = json.Unmarshal(op["op"], &name)
		_ = json.Unmarshal(op["path"], &path)
		switch {
		case name == "test":
		case protocolPath(path):
			continue
		case path == annotationsPath && name == "remove":
			op = jsonOp("add", annotationsPath, map[string]string{})
			annotations = true
		case path == annotationsPath && (name == "add" || name == "replace"):
			var value map[string]any
			if json.Unmarshal(op["value"], &value) == nil {
				maps.DeleteFunc(value, func(k string, _ any) bool { return token.IsProtocolKey(k) })
				if value == nil {
					value = map[string]any{}
				}
				op = jsonOp(name, annotationsPath, value)
			}
			annotations = true
		}
		out = append(out, op)
	}
	if annotations {
		for k, v := range stamp {
			out = append(out, jsonOp("add", annotationsPath+"/"+escapePointer(k), v))
		}
	} else {
		out = append(out, jsonOp("add", annotationsPath, stamp))
	}
	return append(out, jsonOp("replace", rvPath, rv))
}

const (
	annotationsPath = "/metadata/annotations"
	rvPath          = "/metadata/resourceVersion"
)

// protocolPath reports whether a JSON pointer names one fencer annotation.
func protocolPath(path string) bool {
	key, ok := strings.CutPrefix(path, annotationsPath+"/")
	return ok && token.IsProtocolKey(unescapePointer(key))
}

// JSON pointer escaping of a map key (RFC 6901), built once.
var (
	pointerEscaper   = strings.NewReplacer("~", "~0", "/", "~1")
	pointerUnescaper = strings.NewReplacer("~1", "/", "~0", "~")
)

func escapePointer(s string) string { return pointerEscaper.Replace(s) }

func unescapePointer(s string) string { return pointerUnescaper.Replace(s) }

func jsonOp(op, path string, value any) map[string]json.RawMessage {
	enc := func(v any) json.RawMessage {
		b, _ := json.Marshal(v)
		return b
	}
	return map[string]json.RawMessage{"op": enc(op), "path": enc(path), "value": enc(value)}
}

func invalidPatch(pt types.PatchType, format string, args ...any) error {
	return fmt.Errorf("%w: %s patch: %s", ErrInvalidPatch, pt, fmt.Sprintf(format, args...))
}
