package kubeadapter

import (
	"encoding/json"
	"fmt"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// applyPatch applies a patch of type pt to cur, locally, the way the API
// server would, and returns the result as a new object of cur's type.
// A patch that clears metadata.resourceVersion gets cur's back, so the
// write is always conditional; one that sets another value pins the
// version the caller asked for.
func applyPatch(cur client.Object, pt types.PatchType, data []byte) (next client.Object, err error) {
	doc, err := json.Marshal(cur)
	if err != nil {
		return nil, fmt.Errorf("kubeadapter: encode %T: %w", cur, err)
	}
	var out []byte
	switch pt {
	case types.JSONPatchType:
		p, perr := jsonpatch.DecodePatch(data)
		if perr != nil {
			return nil, fmt.Errorf("kubeadapter: decode json patch: %w", perr)
		}
		out, err = p.Apply(doc)
	case types.MergePatchType:
		out, err = jsonpatch.MergePatch(doc, data)
	case types.StrategicMergePatchType:
		if _, ok := cur.(runtime.Unstructured); ok {
			return nil, patchUnsupported(pt, "needs a typed object, not unstructured")
		}
		schema, serr := emptyLike(cur)
		if serr != nil {
			return nil, serr
		}
		out, err = strategicpatch.StrategicMergePatch(doc, data, schema)
	default:
		return nil, patchUnsupported(pt, "only JSON patch, merge patch and strategic merge patch can be fenced")
	}
	if err != nil {
		return nil, fmt.Errorf("kubeadapter: apply %s patch: %w", pt, err)
	}
	if next, err = emptyLike(cur); err != nil {
		return nil, err
	}
	if err := json.Unmarshal(out, next); err != nil {
		return nil, fmt.Errorf("kubeadapter: decode patched %T: %w", cur, err)
	}
	if next.GetResourceVersion() == "" {
		next.SetResourceVersion(cur.GetResourceVersion())
	}
	return next, nil
}
