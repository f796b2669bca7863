package fenced_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fencer-dev/fencer/kubeadapter"
	"github.com/fencer-dev/fencer/kubeadapter/fenced"
	"github.com/fencer-dev/fencer/kubeadapter/internal/kubetest"
	"github.com/fencer-dev/fencer/kubeadapter/kubefencertest"
	"github.com/fencer-dev/fencer/token"
)

// clientKube is an API server without fencer's admission policy, so that
// only the fenced client stands between a write and the store: the shared
// one while no test of the process has installed the policy, a fresh one
// otherwise.
func clientKube(t *testing.T) *kube {
	t.Helper()
	k := newKube(t)
	var vaps admissionregistrationv1.ValidatingAdmissionPolicyList
	require.NoError(t, k.CRC.List(t.Context(), &vaps))
	if len(vaps.Items) == 0 {
		return k
	}
	return kubetest.NewKube(t, kubefencertest.APIServerForTest(t))
}

// leaseTokens acquires and releases the Lease name of k's namespace n
// times and returns the tokens, oldest first.
func leaseTokens(k *kube, t *testing.T, name string, n int) []token.Token {
	t.Helper()
	cfg := k.Fast("red-" + name)
	cfg.Name = name
	e, err := kubeadapter.NewElector(k.CS.CoordinationV1(), cfg)
	require.NoError(t, err)
	var toks []token.Token
	for range n {
		h, err := e.TryAcquire(t.Context())
		require.NoError(t, err)
		toks = append(toks, h.Token())
		require.NoError(t, h.Release(t.Context()))
	}
	return toks
}

// hopScene is an object that lease "other" fenced with token m, that
// lease "fence" then took over with token b, so that it carries b's stamp
// and the mark m of "other"; a < b is a superseded token of "fence", and
// m0 < m a superseded token of "other".
type hopScene struct {
	k         *kube
	a, b      token.Token
	m0, m     token.Token
	name      string
	wantAnnot map[string]string
}

func newHopScene(t *testing.T, k *kube, name string) *hopScene {
	t.Helper()
	s := takeoverScene(t, k, name, func(c *fenced.Client, obj *corev1.ConfigMap) error {
		obj.Data["by"] = "b"
		return c.Update(t.Context(), obj)
	})
	s.wantAnnot[token.AnnotationEpoch] = fmt.Sprint(s.b.Epoch)
	s.requireFenced(t)
	return s
}

// requireFenced checks that the object still carries b's stamp and m's
// mark, and that the superseded holders of both leases are still refused.
func (s *hopScene) requireFenced(t *testing.T) {
	t.Helper()
	ctx := t.Context()
	cur := s.k.ConfigMap(t, s.name)
	for key, want := range s.wantAnnot {
		require.Equal(t, want, cur.Annotations[key], "protocol annotation %s after the write; annotations %v", key, cur.Annotations)
	}
	for _, stale := range []struct {
		tok  token.Token
		opts []fenced.Option
	}{{s.a, nil}, {s.a, []fenced.Option{fenced.WithTakeover()}}, {s.m0, []fenced.Option{fenced.WithTakeover()}}} {
		late := cur.DeepCopy()
		late.Data["by"] = "late " + stale.tok.String()
		err := s.k.Client(t, staticHolder{Tok: stale.tok}, stale.opts...).Update(ctx, late)
		require.ErrorIs(t, err, token.ErrStale, "superseded holder %v (takeover %v) was not refused: %v", stale.tok, len(stale.opts) > 0, err)
	}
	after := s.k.ConfigMap(t, s.name)
	require.Equal(t, cur.ResourceVersion, after.ResourceVersion, "a superseded holder's write landed")
}

// patchCase is one patch the current holder sends through the fenced
// client. Whatever it says, the stamp and marks must survive it.
type patchCase struct {
	name  string
	typ   types.PatchType
	patch string
}

func runHolderPatches(t *testing.T, cases []patchCase) {
	k := clientKube(t)
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := newHopScene(t, k, fmt.Sprintf("p%d", i))
			obj := s.k.ConfigMap(t, s.name)
			body := strings.ReplaceAll(strings.ReplaceAll(tc.patch, "{ns}", k.NS), "NAME", s.name)
			var opts []client.PatchOption
			if tc.typ == types.ApplyYAMLPatchType {
				opts = append(opts, client.FieldOwner("red"), client.ForceOwnership)
			}
			err := k.Client(t, staticHolder{Tok: s.b}).Patch(t.Context(), obj, client.RawPatch(tc.typ, []byte(body)), opts...)
			t.Logf("fenced patch by the current holder: err=%v", err)
			s.requireFenced(t)
		})
	}
}

// TestRedTeamJSONPatchOnTheStamp sends JSON patches that reach the
// protocol annotations: plainly, through JSON-pointer escapes, through
// pointers the API server's patch library reads differently from RFC 6901
// (it ignores whatever precedes the first "/"), through copy and move,
// and through duplicated or differently cased member names.
func TestRedTeamJSONPatchOnTheStamp(t *testing.T) {
	const tokP = "/metadata/annotations/fencer.dev~1token"
	const leaseP = "/metadata/annotations/fencer.dev~1lease"
	const markP = "/metadata/annotations/{ns}.other.mark.fencer.dev~1token"
	j := types.JSONPatchType
	runHolderPatches(t, []patchCase{
		{"remove token", j, `[{"op":"remove","path":"` + tokP + `"}]`},
		{"replace token low", j, `[{"op":"replace","path":"` + tokP + `","value":"1"}]`},
		{"replace lease", j, `[{"op":"replace","path":"` + leaseP + `","value":"x/y"}]`},
		{"replace annotations", j, `[{"op":"replace","path":"/metadata/annotations","value":{}}]`},
		{"add annotations", j, `[{"op":"add","path":"/metadata/annotations","value":{"keep":"x"}}]`},
		{"remove mark", j, `[{"op":"remove","path":"` + markP + `"}]`},
		{"replace mark low", j, `[{"op":"replace","path":"` + markP + `","value":"1"}]`},
		{"prefix-segment remove mark", j, `[{"op":"remove","path":"x` + markP + `"}]`},
		{"remove annotations", j, `[{"op":"remove","path":"/metadata/annotations"}]`},
		{"prefix-segment remove token", j, `[{"op":"remove","path":"x` + tokP + `"}]`},
		{"prefix-segment replace annotations", j, `[{"op":"replace","path":"x/metadata/annotations","value":{}}]`},
		{"prefix-segment remove annotations", j, `[{"op":"remove","path":"x/metadata/annotations"}]`},
		{"prefix-segment replace metadata", j, `[{"op":"replace","path":"x/metadata","value":{"name":"` + "p7" + `"}}]`},
		{"copy over token", j, `[{"op":"copy","from":"/metadata/annotations/keep","path":"` + tokP + `"}]`},
		{"move over token", j, `[{"op":"move","from":"/metadata/annotations/keep","path":"` + tokP + `"}]`},
		{"prefix-segment copy over token", j, `[{"op":"copy","from":"/metadata/annotations/keep","path":"x` + tokP + `"}]`},
		{"move annotations away", j, `[{"op":"move","from":"/metadata/annotations","path":"/data/moved"}]`},
		{"prefix-segment move annotations away", j, `[{"op":"move","from":"x/metadata/annotations","path":"/metadata/labels"}]`},
		{"duplicate path member", j, `[{"op":"remove","path":"/data/by","path":"` + tokP + `"}]`},
		{"duplicate path member reversed", j, `[{"op":"remove","path":"` + tokP + `","path":"/data/by"}]`},
		{"cased path member last", j, `[{"op":"remove","path":"` + tokP + `","Path":"/data/by"}]`},
		{"cased path member first", j, `[{"op":"remove","Path":"/data/by","path":"` + tokP + `"}]`},
		{"cased op member", j, `[{"op":"test","path":"/data/by","value":"b","OP":"remove","path":"` + tokP + `"}]`},
		{"unicode-escaped pointer", j, `[{"op":"remove","path":"\u002fmetadata\u002fannotations\u002ffencer.dev\u007e1token"}]`},
		{"duplicate op member", j, `[{"op":"test","value":"b","path":"` + tokP + `","op":"remove"}]`},
	})
}

// TestRedTeamMergePatchOnTheStamp sends JSON merge patches that null or
// lower the protocol annotations, plainly, through JSON string escapes
// that a byte-level filter would miss, through duplicated members, and
// with a resourceVersion of their own.
func TestRedTeamMergePatchOnTheStamp(t *testing.T) {
	m := types.MergePatchType
	runHolderPatches(t, []patchCase{
		{"null annotations", m, `{"metadata":{"annotations":null}}`},
		{"null token", m, `{"metadata":{"annotations":{"fencer.dev/token":null}}}`},
		{"null mark", m, `{"metadata":{"annotations":{"{ns}.other.mark.fencer.dev/token":null}}}`},
		{"low token", m, `{"metadata":{"annotations":{"fencer.dev/token":"1"}}}`},
		{"escaped slash token", m, `{"metadata":{"annotations":{"fencer.dev\/token":null,"fencer.dev\u002flease":"x/y"}}}`},
		{"escaped mark", m, `{"metadata":{"annotations":{"{ns}.other.mark.fencer.dev\u002ftoken":null}}}`},
		{"duplicate metadata last null", m, `{"metadata":{"annotations":{"keep":"x"}},"metadata":{"annotations":null}}`},
		{"duplicate metadata first null", m, `{"metadata":{"annotations":null},"metadata":{"labels":{"a":"b"}}}`},
		{"duplicate annotations", m, `{"metadata":{"annotations":{"keep":"y"},"annotations":null}}`},
		{"duplicate token", m, `{"metadata":{"annotations":{"fencer.dev/token":"1","fencer.dev/token":null}}}`},
		{"null metadata", m, `{"metadata":null}`},
		{"annotations not an object", m, `{"metadata":{"annotations":"x"}}`},
		{"annotations a list", m, `{"metadata":{"annotations":["fencer.dev/token"]}}`},
		{"null resourceVersion", m, `{"metadata":{"resourceVersion":null,"annotations":null}}`},
		{"empty resourceVersion", m, `{"metadata":{"resourceVersion":"","annotations":null}}`},
		{"numeric resourceVersion", m, `{"metadata":{"resourceVersion":1,"annotations":null}}`},
		{"top-level null", m, `null`},
		{"top-level list", m, `[{"metadata":{"annotations":null}}]`},
		{"trailing document", m, `{"data":{"z":"1"}} {"metadata":{"annotations":null}}`},
		{"cased metadata", m, `{"Metadata":{"annotations":null},"METADATA":{"Annotations":null}}`},
	})
}

// TestRedTeamStrategicPatchOnTheStamp sends strategic merge patches with
// the directives that replace, delete or prune maps, hidden behind JSON
// string escapes, at the object, metadata and annotations levels, and
// directives the docs do not name.
func TestRedTeamStrategicPatchOnTheStamp(t *testing.T) {
	s := types.StrategicMergePatchType
	runHolderPatches(t, []patchCase{
		{"replace annotations", s, `{"metadata":{"annotations":{"$patch":"replace","keep":"x"}}}`},
		{"delete annotations", s, `{"metadata":{"annotations":{"$patch":"delete"}}}`},
		{"replace metadata", s, `{"metadata":{"$patch":"replace","name":"x"}}`},
		{"retainKeys metadata", s, `{"metadata":{"$retainKeys":["name","namespace"]}}`},
		{"retainKeys object", s, `{"$retainKeys":["data"],"data":{"by":"x"}}`},
		{"replace object", s, `{"$patch":"replace","data":{"by":"x"}}`},
		{"escaped replace annotations", s, `{"metadata":{"annotations":{"\u0024patch":"replace","keep":"x"}}}`},
		{"escaped delete annotations", s, `{"metadata":{"annotations":{"\u0024patch":"delete"}}}`},
		{"escaped replace metadata", s, `{"metadata":{"\u0024patch":"replace","name":"x"}}`},
		{"escaped retainKeys metadata", s, `{"metadata":{"\u0024retainKeys":["name","namespace"]}}`},
		{"escaped replace object", s, `{"\u0024patch":"replace","data":{"by":"x"}}`},
		{"duplicate patch directive", s, `{"metadata":{"annotations":{"$patch":"merge","$patch":"replace"}}}`},
		{"deleteFromPrimitiveList annotations", s, `{"metadata":{"$deleteFromPrimitiveList/annotations":["fencer.dev/token"]}}`},
		{"setElementOrder annotations", s, `{"metadata":{"$setElementOrder/annotations":[]}}`},
		{"null annotations", s, `{"metadata":{"annotations":null}}`},
		{"null token and mark", s, `{"metadata":{"annotations":{"fencer.dev/token":null,"{ns}.other.mark.fencer.dev/token":null}}}`},
		{"delete metadata", s, `{"metadata":{"$patch":"delete"}}`},
		{"duplicate metadata", s, `{"metadata":{"annotations":{"keep":"y"}},"metadata":{"annotations":{"$patch":"replace"}}}`},
	})
}

// TestRedTeamApplyPatchOnTheStamp sends server-side apply bodies (JSON and
// YAML) through Patch with the apply type: ones that state protocol keys,
// YAML that hides them behind anchors, merge keys, escapes and duplicated
// keys, and managedFields.
func TestRedTeamApplyPatchOnTheStamp(t *testing.T) {
	a := types.ApplyYAMLPatchType
	head := "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: NAME\n"
	runHolderPatches(t, []patchCase{
		{"json low token", a, `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"NAME","annotations":{"fencer.dev/token":"1","fencer.dev/lease":"x/y","{ns}.other.mark.fencer.dev/token":"1"}}}`},
		{"json empty annotations", a, `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"NAME","annotations":{}}}`},
		{"yaml escaped key", a, head + "  annotations:\n    \"fencer.dev\\x2ftoken\": \"1\"\n    \"{ns}.other.mark.fencer.dev\\u002ftoken\": \"1\"\n"},
		{"yaml merge key", a, head + "  annotations:\n    <<: {\"fencer.dev/token\": \"1\", \"{ns}.other.mark.fencer.dev/token\": \"1\"}\n"},
		{"yaml anchor", a, "x: &low \"1\"\n" + head + "  annotations:\n    fencer.dev/token: *low\n"},
		{"yaml duplicate key", a, head + "  annotations:\n    keep: a\n    keep: b\n    fencer.dev/token: \"1\"\n"},
		{"yaml flow duplicate metadata", a, "{apiVersion: v1, kind: ConfigMap, metadata: {name: NAME}, metadata: {name: NAME, annotations: {fencer.dev/token: \"1\"}}}"},
		{"yaml tagged string", a, head + "  annotations:\n    !!str fencer.dev/token: !!str 1\n"},
		{"yaml null annotations", a, head + "  annotations: ~\n"},
		{"managedFields", a, `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"NAME","managedFields":[{"manager":"x","operation":"Apply","apiVersion":"v1","fieldsType":"FieldsV1","fieldsV1":{"f:metadata":{"f:annotations":{"f:fencer.dev/token":{}}}}}]}}`},
		{"resourceVersion of its own", a, `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"NAME","resourceVersion":"1","annotations":{"fencer.dev/token":"1"}}}`},
	})
}

// takeoverScene is newHopScene with the takeover by "fence" done by write
// instead of a plain Update, so that every write path must keep the mark
// of the lease it replaces.
func takeoverScene(t *testing.T, k *kube, name string, write func(c *fenced.Client, obj *corev1.ConfigMap) error) *hopScene {
	t.Helper()
	ctx := t.Context()
	fence := leaseTokens(k, t, "fence", 2)
	other := leaseTokens(k, t, "other", 2)
	s := &hopScene{k: k, a: fence[0], b: fence[1], m0: other[0], m: other[1], name: name}
	obj := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: k.NS, Name: name, Annotations: map[string]string{"keep": "me"}},
		Data:       map[string]string{"by": "m", "extra": "keep me"},
	}
	require.NoError(t, k.Client(t, staticHolder{Tok: s.m}).Create(ctx, obj))
	require.NoError(t, write(k.Client(t, staticHolder{Tok: s.b}, fenced.WithTakeover()), obj))
	s.wantAnnot = map[string]string{
		token.AnnotationLease:    s.b.Lease,
		token.AnnotationToken:    fmt.Sprint(s.b.Revision),
		token.MarkKey(s.m.Lease): fmt.Sprint(s.m.Revision),
	}
	return s
}

// TestRedTeamTakeoverKeepsTheMarkOnEveryPath takes an object over from
// another lease by each fenced write (JSON, merge and strategic patches,
// apply, two applies by one field manager), then checks that the mark of
// the replaced lease is there and that the superseded holders of both
// leases are refused.
func TestRedTeamTakeoverKeepsTheMarkOnEveryPath(t *testing.T) {
	k := clientKube(t)
	ctx := t.Context()
	apply := func(c *fenced.Client, obj *corev1.ConfigMap, data string) error {
		body := `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"` + obj.Name + `"},"data":{"by":"` + data + `"}}`
		return c.Patch(ctx, obj, client.RawPatch(types.ApplyYAMLPatchType, []byte(body)), client.FieldOwner("red-applier"), client.ForceOwnership)
	}
	for name, write := range map[string]func(c *fenced.Client, obj *corev1.ConfigMap) error{
		"json": func(c *fenced.Client, obj *corev1.ConfigMap) error {
			return c.Patch(ctx, obj, client.RawPatch(types.JSONPatchType, []byte(`[{"op":"replace","path":"/data/by","value":"b"}]`)))
		},
		"merge": func(c *fenced.Client, obj *corev1.ConfigMap) error {
			return c.Patch(ctx, obj, client.RawPatch(types.MergePatchType, []byte(`{"data":{"by":"b"}}`)))
		},
		"strategic": func(c *fenced.Client, obj *corev1.ConfigMap) error {
			return c.Patch(ctx, obj, client.RawPatch(types.StrategicMergePatchType, []byte(`{"data":{"by":"b"}}`)))
		},
		"apply": func(c *fenced.Client, obj *corev1.ConfigMap) error { return apply(c, obj, "b") },
		"apply twice": func(c *fenced.Client, obj *corev1.ConfigMap) error {
			if err := apply(c, obj, "b1"); err != nil {
				return err
			}
			return apply(c, obj, "b2")
		},
		"json remove annotations": func(c *fenced.Client, obj *corev1.ConfigMap) error {
			return c.Patch(ctx, obj, client.RawPatch(types.JSONPatchType, []byte(`[{"op":"remove","path":"/metadata/annotations"}]`)))
		},
		"merge null annotations": func(c *fenced.Client, obj *corev1.ConfigMap) error {
			return c.Patch(ctx, obj, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"annotations":null}}`)))
		},
		"update without annotations": func(c *fenced.Client, obj *corev1.ConfigMap) error {
			o := obj.DeepCopy()
			o.Annotations = nil
			o.ResourceVersion = ""
			return c.Update(ctx, o)
		},
	} {
		t.Run(name, func(t *testing.T) {
			s := takeoverScene(t, k, sanitize(name), write)
			s.requireFenced(t)
			// The holder's own next plain write keeps the mark too.
			obj := k.ConfigMap(t, s.name)
			require.NoError(t, apply(k.Client(t, staticHolder{Tok: s.b}), obj, "again"))
			s.requireFenced(t)
		})
	}
}

// podScene is a Pod, whose /status stores the annotations of its body,
// that the stale holder a stamped, then the current holder b.
type podScene struct {
	k    *kube
	a, b token.Token
	name string
}

func newPodScene(t *testing.T, k *kube, name string) *podScene {
	t.Helper()
	toks := leaseTokens(k, t, "fence", 2)
	s := &podScene{k: k, a: toks[0], b: toks[1], name: name}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: k.NS, Name: name, Annotations: map[string]string{"keep": "me"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "example.invalid/none"}}},
	}
	require.NoError(t, k.Client(t, staticHolder{Tok: s.a}).Create(t.Context(), pod))
	pod.Labels = map[string]string{"by": "b"}
	require.NoError(t, k.Client(t, staticHolder{Tok: s.b}).Update(t.Context(), pod))
	return s
}

func (s *podScene) pod(t *testing.T) *corev1.Pod {
	t.Helper()
	var pod corev1.Pod
	require.NoError(t, s.k.CRC.Get(t.Context(), client.ObjectKey{Namespace: s.k.NS, Name: s.name}, &pod))
	return &pod
}

// requireFenced checks that the Pod carries b's stamp and that a's fenced
// writes, through the main resource and /status, are refused.
func (s *podScene) requireFenced(t *testing.T) {
	t.Helper()
	ctx := t.Context()
	cur := s.pod(t)
	requireStamped(t, cur.Annotations, s.b)
	ca := s.k.Client(t, staticHolder{Tok: s.a})
	late := cur.DeepCopy()
	late.Status.Message = "late a"
	require.ErrorIs(t, ca.Status().Update(ctx, late), token.ErrStale)
	late = cur.DeepCopy()
	late.Labels = map[string]string{"by": "late a"}
	require.ErrorIs(t, ca.Update(ctx, late), token.ErrStale)
	require.Equal(t, cur.ResourceVersion, s.pod(t).ResourceVersion, "a superseded holder's write landed")
}

// TestRedTeamPodStatusOnTheStamp sends, as the current holder, writes of
// Pod /status that drop or lower the stamp: a status Update without
// annotations or with a's stamp, and JSON, merge and strategic patches of
// /status on the annotations. pods/status stores the body's annotations,
// so the fenced status writer must keep the stamp. It also sends a's
// status writes, stale, in every form.
func TestRedTeamPodStatusOnTheStamp(t *testing.T) {
	k := clientKube(t)
	ctx := t.Context()
	const tokP = "/metadata/annotations/fencer.dev~1token"
	for i, tc := range []struct {
		name  string
		write func(c *fenced.Client, s *podScene, pod *corev1.Pod) error
	}{
		{"update without annotations", func(c *fenced.Client, _ *podScene, pod *corev1.Pod) error {
			pod.Annotations = nil
			pod.Status.Message = "b"
			return c.Status().Update(ctx, pod)
		}},
		{"update with the stale stamp", func(c *fenced.Client, s *podScene, pod *corev1.Pod) error {
			pod.Annotations = s.a.Stamp(map[string]string{})
			pod.Status.Message = "b"
			return c.Status().Update(ctx, pod)
		}},
		{"json remove token", func(c *fenced.Client, _ *podScene, pod *corev1.Pod) error {
			return c.Status().Patch(ctx, pod, client.RawPatch(types.JSONPatchType, []byte(`[{"op":"remove","path":"`+tokP+`"}]`)))
		}},
		{"json prefix-segment remove token", func(c *fenced.Client, _ *podScene, pod *corev1.Pod) error {
			return c.Status().Patch(ctx, pod, client.RawPatch(types.JSONPatchType, []byte(`[{"op":"remove","path":"x`+tokP+`"}]`)))
		}},
		{"json remove annotations", func(c *fenced.Client, _ *podScene, pod *corev1.Pod) error {
			return c.Status().Patch(ctx, pod, client.RawPatch(types.JSONPatchType, []byte(`[{"op":"remove","path":"/metadata/annotations"}]`)))
		}},
		{"merge null annotations", func(c *fenced.Client, _ *podScene, pod *corev1.Pod) error {
			return c.Status().Patch(ctx, pod, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"annotations":null},"status":{"message":"b"}}`)))
		}},
		{"merge low token", func(c *fenced.Client, s *podScene, pod *corev1.Pod) error {
			return c.Status().Patch(ctx, pod, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"annotations":{"fencer.dev/token":"`+fmt.Sprint(s.a.Revision)+`"}}}`)))
		}},
		{"strategic escaped replace annotations", func(c *fenced.Client, _ *podScene, pod *corev1.Pod) error {
			return c.Status().Patch(ctx, pod, client.RawPatch(types.StrategicMergePatchType, []byte(`{"metadata":{"annotations":{"\u0024patch":"replace"}}}`)))
		}},
		{"strategic null token", func(c *fenced.Client, _ *podScene, pod *corev1.Pod) error {
			return c.Status().Patch(ctx, pod, client.RawPatch(types.StrategicMergePatchType, []byte(`{"metadata":{"annotations":{"fencer.dev/token":null}}}`)))
		}},
		{"apply empty annotations", func(c *fenced.Client, s *podScene, pod *corev1.Pod) error {
			body := `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"` + s.name + `","annotations":{}},"status":{"message":"b"}}`
			return c.Status().Patch(ctx, pod, client.RawPatch(types.ApplyYAMLPatchType, []byte(body)), client.FieldOwner("red"), client.ForceOwnership)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newPodScene(t, k, fmt.Sprintf("pod%d", i))
			err := tc.write(k.Client(t, staticHolder{Tok: s.b}), s, s.pod(t))
			t.Logf("fenced status write by the current holder: err=%v", err)
			s.requireFenced(t)
			// The same write by the superseded holder must be refused.
			before := s.pod(t)
			err = tc.write(k.Client(t, staticHolder{Tok: s.a}), s, s.pod(t))
			require.Error(t, err, "the superseded holder's status write was accepted")
			t.Logf("fenced status write by the superseded holder: err=%v", err)
			require.Equal(t, before.ResourceVersion, s.pod(t).ResourceVersion, "the superseded holder's status write landed")
		})
	}
}

// TestRedTeamSharedCacheMemory is a careless caller whose reader shares
// memory with the objects it hands out: a controller-runtime cache with
// UnsafeDisableDeepCopy (a documented option of controller-runtime) as
// WithReader. The superseded holder a reads the object (b's version) from the cache and
// stamps its own token into the annotations it got (a hand-edited stamp),
// which writes into the cache's copy; then it writes through the fenced
// client. The fenced client must not take the caller's annotations for
// the stored ones: the write must be refused and b's stamp must stay.
func TestRedTeamSharedCacheMemory(t *testing.T) {
	k := clientKube(t)
	s, err := unsafeCacheWrite(t, k, "unsafe-cache")
	require.ErrorIs(t, err, token.ErrStale)
	s.requireIntact(t)
}

// gadgetGV is the group of the Gadget custom resource: like the Widget,
// but with a status subresource, and spec.extra and status.extra that the
// Go type below does not know.
var gadgetGV = schema.GroupVersion{Group: "redteam.fencer.dev", Version: "v1"}

type gadgetFields struct {
	Known string `json:"known,omitempty"`
}

type gadget struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              gadgetFields `json:"spec,omitempty"`
	Status            gadgetFields `json:"status,omitempty"`
}

func (g *gadget) DeepCopyObject() runtime.Object {
	out := *g
	g.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	return &out
}

type gadgetList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []gadget `json:"items"`
}

func (l *gadgetList) DeepCopyObject() runtime.Object {
	out := *l
	out.Items = make([]gadget, len(l.Items))
	for i := range l.Items {
		out.Items[i] = *l.Items[i].DeepCopyObject().(*gadget)
	}
	return &out
}

// gadgets installs the Gadget CRD (if needed) and returns a client whose
// scheme knows the gadget Go type.
func gadgets(t *testing.T, k *kube) client.Client {
	t.Helper()
	ctx := t.Context()
	str := map[string]any{"type": "string"}
	fields := map[string]any{"type": "object", "properties": map[string]any{"known": str, "extra": str}}
	crd := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiextensions.k8s.io/v1",
		"kind":       "CustomResourceDefinition",
		"metadata":   map[string]any{"name": "gadgets." + gadgetGV.Group},
		"spec": map[string]any{
			"group": gadgetGV.Group,
			"scope": "Namespaced",
			"names": map[string]any{"plural": "gadgets", "singular": "gadget", "kind": "Gadget", "listKind": "GadgetList"},
			"versions": []any{map[string]any{
				"name": gadgetGV.Version, "served": true, "storage": true,
				"subresources": map[string]any{"status": map[string]any{}},
				"schema": map[string]any{"openAPIV3Schema": map[string]any{
					"type":       "object",
					"properties": map[string]any{"spec": fields, "status": fields},
				}},
			}},
		},
	}}
	if err := k.CRC.Create(ctx, crd); err != nil && !apierrors.IsAlreadyExists(err) {
		require.NoError(t, err)
	}
	return crdClient(t, k, gadgetGV.WithKind("Gadget"), &gadget{}, &gadgetList{})
}

// newGadget creates a Gadget with both fields in spec and status, stamped
// by holder (if not nil), through unstructured objects.
func newGadget(t *testing.T, k *kube, name string, holder fenced.Holder) {
	t.Helper()
	ctx := t.Context()
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": gadgetGV.String(), "kind": "Gadget",
		"metadata": map[string]any{"namespace": k.NS, "name": name, "annotations": map[string]any{"keep": "me"}},
		"spec":     map[string]any{"known": "k0", "extra": "keep me"},
	}}
	if holder != nil {
		require.NoError(t, k.Client(t, holder).Create(ctx, u))
	} else {
		require.NoError(t, k.CRC.Create(ctx, u))
	}
	require.NoError(t, unstructured.SetNestedStringMap(u.Object, map[string]string{"known": "s0", "extra": "keep me too"}, "status"))
	require.NoError(t, k.CRC.Status().Update(ctx, u))
}

func storedGadget(t *testing.T, k *kube, name string) *unstructured.Unstructured {
	t.Helper()
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(gadgetGV.WithKind("Gadget"))
	require.NoError(t, k.CRC.Get(t.Context(), client.ObjectKey{Namespace: k.NS, Name: name}, u))
	return u
}

// TestRedTeamDataLossThroughTheFencedClient writes a Gadget through a Go
// type that lacks spec.extra and status.extra, with every fenced write,
// and the same write through the plain client on a twin Gadget. A fenced
// write must lose no field that the plain one keeps, and patches, applies
// and status writes must keep the fields the type does not know (a status
// write must never touch spec). The holder's token is newer than the one
// the Gadget was created with, so status writes also stamp the main
// resource first.
func TestRedTeamDataLossThroughTheFencedClient(t *testing.T) {
	k := clientKube(t)
	ctx := t.Context()
	gc := gadgets(t, k)
	toks := leaseTokens(k, t, "fence", 2)
	older, tok := toks[0], toks[1]
	fc, err := fenced.NewClient(gc, staticHolder{Tok: tok})
	require.NoError(t, err)

	type write func(c client.Client, g *gadget) error
	for _, tc := range []struct {
		name             string
		write            write
		specKept, status bool // what the docs promise: spec.extra kept; status.extra kept
	}{
		{"update", func(c client.Client, g *gadget) error {
			g.Spec.Known = "k1"
			return c.Update(ctx, g)
		}, false, true},
		{"merge patch", func(c client.Client, g *gadget) error {
			base := g.DeepCopyObject().(*gadget)
			g.Spec.Known = "k1"
			return c.Patch(ctx, g, client.MergeFrom(base))
		}, true, true},
		{"optimistic merge patch", func(c client.Client, g *gadget) error {
			base := g.DeepCopyObject().(*gadget)
			g.Spec.Known = "k1"
			return c.Patch(ctx, g, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{}))
		}, true, true},
		{"json patch", func(c client.Client, g *gadget) error {
			return c.Patch(ctx, g, client.RawPatch(types.JSONPatchType, []byte(`[{"op":"replace","path":"/spec/known","value":"k1"}]`)))
		}, true, true},
		{"json patch emptying annotations", func(c client.Client, g *gadget) error {
			return c.Patch(ctx, g, client.RawPatch(types.JSONPatchType, []byte(`[{"op":"remove","path":"/metadata/annotations"},{"op":"replace","path":"/spec/known","value":"k1"}]`)))
		}, true, true},
		{"apply unstructured", func(c client.Client, g *gadget) error {
			u := &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": gadgetGV.String(), "kind": "Gadget",
				"metadata": map[string]any{"namespace": g.Namespace, "name": g.Name},
				"spec":     map[string]any{"known": "k1"},
			}}
			return c.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner("red"), client.ForceOwnership)
		}, true, true},
		{"metadata-only patch", func(c client.Client, g *gadget) error {
			pm := &metav1.PartialObjectMetadata{TypeMeta: metav1.TypeMeta{APIVersion: gadgetGV.String(), Kind: "Gadget"}, ObjectMeta: *g.ObjectMeta.DeepCopy()}
			return c.Patch(ctx, pm, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"labels":{"x":"y"}}}`)))
		}, true, true},
		{"status update", func(c client.Client, g *gadget) error {
			g.Status.Known = "s1"
			return c.Status().Update(ctx, g)
		}, true, false},
		{"status merge patch", func(c client.Client, g *gadget) error {
			base := g.DeepCopyObject().(*gadget)
			g.Status.Known = "s1"
			return c.Status().Patch(ctx, g, client.MergeFrom(base))
		}, true, true},
		{"status json patch", func(c client.Client, g *gadget) error {
			return c.Status().Patch(ctx, g, client.RawPatch(types.JSONPatchType, []byte(`[{"op":"replace","path":"/status/known","value":"s1"}]`)))
		}, true, true},
		{"status apply", func(c client.Client, g *gadget) error {
			u := &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": gadgetGV.String(), "kind": "Gadget",
				"metadata": map[string]any{"namespace": g.Namespace, "name": g.Name},
				"status":   map[string]any{"known": "s1"},
			}}
			return c.Status().Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner("red"), client.ForceOwnership)
		}, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := sanitize(tc.name)
			newGadget(t, k, name, staticHolder{Tok: older})
			newGadget(t, k, name+"-plain", nil)
			outcome := func(c client.Client, name string) (*unstructured.Unstructured, error) {
				g := &gadget{}
				require.NoError(t, gc.Get(ctx, client.ObjectKey{Namespace: k.NS, Name: name}, g))
				err := tc.write(c, g)
				return storedGadget(t, k, name), err
			}
			plain, plainErr := outcome(gc, name+"-plain")
			got, fencedErr := outcome(fc, name)
			require.NoError(t, plainErr, "the plain write")
			if errors.Is(fencedErr, fenced.ErrUnsupported) {
				t.Logf("fenced %s: %v", tc.name, fencedErr)
				return
			}
			require.NoError(t, fencedErr)
			for _, f := range [][]string{{"spec", "extra"}, {"status", "extra"}, {"spec", "known"}, {"status", "known"}} {
				want, _, _ := unstructured.NestedString(plain.Object, f...)
				have, _, _ := unstructured.NestedString(got.Object, f...)
				require.Equal(t, want, have, "%s after the fenced write (plain write keeps %q)", strings.Join(f, "."), want)
			}
			spec, _, _ := unstructured.NestedString(got.Object, "spec", "extra")
			status, _, _ := unstructured.NestedString(got.Object, "status", "extra")
			if tc.specKept {
				require.Equal(t, "keep me", spec, "spec.extra erased")
			}
			if tc.status {
				require.Equal(t, "keep me too", status, "status.extra erased")
			}
			requireStamped(t, got.GetAnnotations(), tok)
			wantKeep := plain.GetAnnotations()["keep"]
			require.Equal(t, wantKeep, got.GetAnnotations()["keep"], "annotation keep")
		})
	}
}

// policyKube is the shared API server with fencer's admission policy.
func policyKube(t *testing.T) *kube {
	t.Helper()
	k := newKube(t)
	shared.InstallPolicy(t)
	return k
}

// requireDenied checks that the API server refused a raw write, and that
// the object did not change.
func requireDenied(t *testing.T, k *kube, name, rv string, err error) {
	t.Helper()
	require.Error(t, err, "the raw write was admitted")
	require.True(t, apierrors.IsForbidden(err) || apierrors.IsInvalid(err), "not an admission denial: %v", err)
	require.Equal(t, rv, k.ConfigMap(t, name).ResourceVersion, "the object changed")
	t.Logf("denied: %v", err)
}

// TestRedTeamRawWriterWithPolicy sends, with the admission policy
// installed, raw writes (the plain controller-runtime client, as kubectl
// would) that carry the superseded token a over an object b stamped, drop
// or lower the stamp or a mark, hop leases, or use JSON-pointer prefixes,
// escapes and SSA field ownership to reach the annotations. Each must be
// denied by the API server and change nothing.
func TestRedTeamRawWriterWithPolicy(t *testing.T) {
	k := policyKube(t)
	ctx := t.Context()
	aTok := func(s *hopScene) string { return fmt.Sprint(s.a.Revision) }
	raw := func(typ types.PatchType, body string) func(s *hopScene, obj *corev1.ConfigMap) error {
		return func(s *hopScene, obj *corev1.ConfigMap) error {
			b := strings.NewReplacer("{ns}", k.NS, "NAME", s.name, "{a}", aTok(s), "{m}", fmt.Sprint(s.m.Revision), "{b}", fmt.Sprint(s.b.Revision)).Replace(body)
			var opts []client.PatchOption
			if typ == types.ApplyYAMLPatchType {
				opts = append(opts, client.FieldOwner("raw"), client.ForceOwnership)
			}
			return k.CRC.Patch(ctx, obj, client.RawPatch(typ, []byte(b)), opts...)
		}
	}
	j, m, sm, ap := types.JSONPatchType, types.MergePatchType, types.StrategicMergePatchType, types.ApplyYAMLPatchType
	for _, tc := range []struct {
		name  string
		write func(s *hopScene, obj *corev1.ConfigMap) error
	}{
		{"update with the stale stamp and the current resourceVersion", func(s *hopScene, obj *corev1.ConfigMap) error {
			obj.Annotations = s.a.Stamp(map[string]string{token.MarkKey(s.m.Lease): fmt.Sprint(s.m.Revision)})
			obj.Data["by"] = "a-late"
			return k.CRC.Update(ctx, obj)
		}},
		{"update without annotations", func(_ *hopScene, obj *corev1.ConfigMap) error {
			obj.Annotations = nil
			return k.CRC.Update(ctx, obj)
		}},
		{"merge patch stale token", raw(m, `{"metadata":{"annotations":{"fencer.dev/token":"{a}"}},"data":{"by":"a-late"}}`)},
		{"merge patch null annotations", raw(m, `{"metadata":{"annotations":null}}`)},
		{"merge patch null mark", raw(m, `{"metadata":{"annotations":{"{ns}.other.mark.fencer.dev/token":null}}}`)},
		{"merge patch low mark", raw(m, `{"metadata":{"annotations":{"{ns}.other.mark.fencer.dev/token":"1"}}}`)},
		{"json patch prefix-segment stale token", raw(j, `[{"op":"replace","path":"x/metadata/annotations/fencer.dev~1token","value":"{a}"}]`)},
		{"json patch remove annotations", raw(j, `[{"op":"remove","path":"/metadata/annotations"}]`)},
		{"json patch copy over token", raw(j, `[{"op":"add","path":"/metadata/annotations/low","value":"{a}"},{"op":"move","from":"/metadata/annotations/low","path":"/metadata/annotations/fencer.dev~1token"}]`)},
		{"strategic replace annotations", raw(sm, `{"metadata":{"annotations":{"$patch":"replace","keep":"x"}}}`)},
		{"strategic delete annotations", raw(sm, `{"metadata":{"annotations":{"$patch":"delete"}}}`)},
		{"apply stale token by another manager", raw(ap, `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"NAME","annotations":{"fencer.dev/token":"{a}"}},"data":{"by":"a-late"}}`)},
		{"non-canonical token", raw(m, `{"metadata":{"annotations":{"fencer.dev/token":"0{b}"}}}`)},
		{"signed token", raw(m, `{"metadata":{"annotations":{"fencer.dev/token":"+{b}"}}}`)},
		{"spaced token", raw(m, `{"metadata":{"annotations":{"fencer.dev/token":" {b}"}}}`)},
		{"overflowing token", raw(m, `{"metadata":{"annotations":{"fencer.dev/token":"9223372036854775808"}}}`)},
		{"takeover without mark", raw(m, `{"metadata":{"annotations":{"fencer.dev/lease":"{ns}/third","fencer.dev/token":"1"}}}`)},
		{"takeover dropping the older mark", raw(m, `{"metadata":{"annotations":{"fencer.dev/lease":"{ns}/third","fencer.dev/token":"1","{ns}.fence.mark.fencer.dev/token":"{b}","{ns}.other.mark.fencer.dev/token":null}}}`)},
		{"hop back to other below its mark", raw(m, `{"metadata":{"annotations":{"fencer.dev/lease":"{ns}/other","fencer.dev/token":"1","{ns}.fence.mark.fencer.dev/token":"{b}"}}}`)},
		{"hop back to other below its mark, mark dropped", raw(m, `{"metadata":{"annotations":{"fencer.dev/lease":"{ns}/other","fencer.dev/token":"1","{ns}.fence.mark.fencer.dev/token":"{b}","{ns}.other.mark.fencer.dev/token":null}}}`)},
		{"mark under a malformed key", raw(m, `{"metadata":{"annotations":{"fencer.dev/lease":"{ns}/third","fencer.dev/token":"1","{ns}.Fence.mark.fencer.dev/token":"{b}"}}}`)},
		{"lease with a trailing dot", raw(m, `{"metadata":{"annotations":{"fencer.dev/lease":"{ns}/fence.","fencer.dev/token":"1","{ns}.fence.mark.fencer.dev/token":"{b}"}}}`)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newHopScene(t, k, sanitize(tc.name))
			obj := k.ConfigMap(t, s.name)
			err := tc.write(s, obj.DeepCopy())
			requireDenied(t, k, s.name, obj.ResourceVersion, err)
			s.requireFenced(t)
		})
	}

	t.Run("apply by the field manager that owns the stamp", func(t *testing.T) {
		toks := leaseTokens(k, t, "fence", 1)
		name := "ssa-owner"
		body := `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"namespace":"` + k.NS + `","name":"` + name + `"},"data":{"by":"b-apply"}}`
		// The fenced apply creates the object: "ctrl" alone owns the
		// protocol keys.
		obj := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: k.NS, Name: name}}
		require.NoError(t, k.Client(t, staticHolder{Tok: toks[0]}).Patch(ctx, obj, client.RawPatch(types.ApplyYAMLPatchType, []byte(body)), client.FieldOwner("ctrl")))
		obj = k.ConfigMap(t, name)
		requireStamped(t, obj.Annotations, toks[0])
		t.Logf("managed fields: %+v", obj.ManagedFields)
		// The same manager's raw apply, without them: SSA removes fields a
		// manager owned alone and no longer applies.
		err := k.CRC.Patch(ctx, obj.DeepCopy(), client.RawPatch(types.ApplyYAMLPatchType, []byte(body)), client.FieldOwner("ctrl"))
		requireDenied(t, k, name, obj.ResourceVersion, err)
		requireStamped(t, k.ConfigMap(t, name).Annotations, toks[0])
	})
}

// TestRedTeamCarelessCaller is a superseded holder a that writes, through
// the fenced client and without the admission policy, objects it built
// carelessly: a forged stamp greater than b's, a copy of b's own stamp and
// resourceVersion, a retry after its refusal, deletes pinned to b's
// version, a status apply, and a create of b's object under b's stamp
// after b deleted it. Each must be refused, and b's object unchanged.
func TestRedTeamCarelessCaller(t *testing.T) {
	k := clientKube(t)
	ctx := t.Context()
	forged := func(s superseded) map[string]string {
		return map[string]string{
			token.AnnotationLease: s.b.Lease, token.AnnotationToken: "9223372036854775807", token.AnnotationEpoch: "99",
		}
	}
	for _, tc := range []struct {
		name  string
		write func(s superseded, c *fenced.Client) error
	}{
		{"update with a forged greater stamp", func(s superseded, c *fenced.Client) error {
			obj := s.handBuilt()
			obj.Annotations = forged(s)
			return c.Update(ctx, obj)
		}},
		{"update with a forged greater stamp and no resourceVersion", func(s superseded, c *fenced.Client) error {
			obj := s.handBuilt()
			obj.ResourceVersion, obj.Annotations = "", forged(s)
			return c.Update(ctx, obj)
		}},
		{"update with b's stamp and resourceVersion copied", func(s superseded, c *fenced.Client) error {
			obj := s.current.DeepCopy()
			obj.Data["by"] = "a-late"
			return c.Update(ctx, obj)
		}},
		{"update retried after its refusal", func(s superseded, c *fenced.Client) error {
			obj := s.aView.DeepCopy()
			obj.Data["by"] = "a-late"
			err := c.Update(ctx, obj)
			if !errors.Is(err, token.ErrStale) {
				return fmt.Errorf("first attempt: %w", err)
			}
			obj.ResourceVersion = ""
			if err := c.Update(ctx, obj); err == nil || !errors.Is(err, token.ErrStale) {
				return fmt.Errorf("retry without resourceVersion: %w", err)
			}
			obj.ResourceVersion = s.current.ResourceVersion
			return c.Update(ctx, obj)
		}},
		{"merge patch with a forged stamp", func(s superseded, c *fenced.Client) error {
			obj := s.current.DeepCopy()
			return c.Patch(ctx, obj, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"annotations":{"fencer.dev/token":"9223372036854775807"}},"data":{"by":"a-late"}}`)))
		}},
		{"optimistic patch from b's version", func(s superseded, c *fenced.Client) error {
			obj := s.current.DeepCopy()
			base := obj.DeepCopy()
			obj.Data["by"] = "a-late"
			return c.Patch(ctx, obj, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{}))
		}},
		{"json patch pinning b's version", func(s superseded, c *fenced.Client) error {
			obj := s.current.DeepCopy()
			return c.Patch(ctx, obj, client.RawPatch(types.JSONPatchType, []byte(`[{"op":"test","path":"/metadata/resourceVersion","value":"`+s.current.ResourceVersion+`"},{"op":"replace","path":"/data/by","value":"a-late"}]`)))
		}},
		{"apply forced", func(s superseded, c *fenced.Client) error {
			body := `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"` + s.current.Name + `"},"data":{"by":"a-late"}}`
			return c.Patch(ctx, s.current.DeepCopy(), client.RawPatch(types.ApplyYAMLPatchType, []byte(body)), client.FieldOwner("a"), client.ForceOwnership)
		}},
		{"delete with b's preconditions", func(s superseded, c *fenced.Client) error {
			return c.Delete(ctx, s.current.DeepCopy(), client.Preconditions{UID: &s.current.UID, ResourceVersion: &s.current.ResourceVersion})
		}},
		{"delete of a hand-built object", func(s superseded, c *fenced.Client) error {
			return c.Delete(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: s.current.Namespace, Name: s.current.Name}})
		}},
		{"DeleteFenced with b's copy", func(s superseded, _ *fenced.Client) error {
			cms := k.CS.CoreV1().ConfigMaps(k.NS)
			return fenced.DeleteFenced(ctx, staticHolder{Tok: s.a},
				func(ctx context.Context) (*corev1.ConfigMap, error) {
					return cms.Get(ctx, s.current.Name, metav1.GetOptions{})
				},
				func(ctx context.Context, p metav1.Preconditions) error {
					return cms.Delete(ctx, s.current.Name, metav1.DeleteOptions{Preconditions: &p})
				})
		}},
		{"UpdateFenced with a mutate that restamps", func(s superseded, _ *fenced.Client) error {
			cms := k.CS.CoreV1().ConfigMaps(k.NS)
			_, err := fenced.UpdateFenced(ctx, staticHolder{Tok: s.a},
				func(ctx context.Context) (*corev1.ConfigMap, error) {
					return cms.Get(ctx, s.current.Name, metav1.GetOptions{})
				},
				func(cm *corev1.ConfigMap) error {
					cm.Annotations = s.a.Stamp(nil)
					cm.Data["by"] = "a-late"
					return nil
				},
				func(ctx context.Context, cm *corev1.ConfigMap) (*corev1.ConfigMap, error) {
					return cms.Update(ctx, cm, metav1.UpdateOptions{})
				})
			return err
		}},
		{"UpdateFenced with a get that returns a's old copy", func(s superseded, _ *fenced.Client) error {
			cms := k.CS.CoreV1().ConfigMaps(k.NS)
			_, err := fenced.UpdateFenced(ctx, staticHolder{Tok: s.a},
				func(context.Context) (*corev1.ConfigMap, error) { return s.aView.DeepCopy(), nil },
				func(cm *corev1.ConfigMap) error { cm.Data["by"] = "a-late"; return nil },
				func(ctx context.Context, cm *corev1.ConfigMap) (*corev1.ConfigMap, error) {
					return cms.Update(ctx, cm, metav1.UpdateOptions{})
				})
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSuperseded(t, k, sanitize(tc.name))
			err := tc.write(s, k.Client(t, staticHolder{Tok: s.a}))
			t.Logf("superseded holder: %v", err)
			require.Error(t, err, "the superseded holder's write was accepted")
			s.requireIntact(t)
			require.Equal(t, s.current.ResourceVersion, k.ConfigMap(t, s.current.Name).ResourceVersion)
		})
	}

	t.Run("create of an object b deleted, with b's stamp copied", func(t *testing.T) {
		s := newSuperseded(t, k, "recreate")
		require.NoError(t, k.Client(t, staticHolder{Tok: s.b}).Delete(ctx, s.current.DeepCopy()))
		obj := s.current.DeepCopy()
		obj.ResourceVersion, obj.UID = "", ""
		obj.Data["by"] = "a-late"
		err := k.Client(t, staticHolder{Tok: s.a}).Create(ctx, obj)
		t.Logf("superseded holder: %v", err)
		require.ErrorIs(t, err, token.ErrStale)
		require.True(t, apierrors.IsNotFound(k.CRC.Get(ctx, client.ObjectKeyFromObject(obj), &corev1.ConfigMap{})))
	})

	t.Run("status apply", func(t *testing.T) {
		s := newPodScene(t, k, "status-apply")
		before := s.pod(t)
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "v1", "kind": "Pod",
			"metadata": map[string]any{"namespace": k.NS, "name": s.name},
			"status":   map[string]any{"message": "a-late"},
		}}
		err := k.Client(t, staticHolder{Tok: s.a}).Status().Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner("a"), client.ForceOwnership)
		t.Logf("superseded holder: %v", err)
		require.Error(t, err)
		require.Equal(t, before.ResourceVersion, s.pod(t).ResourceVersion)
		s.requireFenced(t)
	})
}

// interposingReader reads through the API and then, once, lets another
// holder write the object before the read returns: the newer holder's
// write lands exactly between the fenced client's check and its write.
type interposingReader struct {
	client.Reader
	once  bool
	write func()
}

func (r *interposingReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if err := r.Reader.Get(ctx, key, obj, opts...); err != nil {
		return err
	}
	if !r.once {
		r.once = true
		r.write()
	}
	return nil
}

// TestRedTeamWriteBetweenCheckAndWrite makes the newer holder b write the
// object after holder a's fenced client has read and checked it (a's own
// stamp, so the check passes) and before a's write is sent, for every
// fenced write. a's write must not land: the newer stamp must stay.
func TestRedTeamWriteBetweenCheckAndWrite(t *testing.T) {
	k := clientKube(t)
	ctx := t.Context()
	for _, tc := range []struct {
		name  string
		write func(c *fenced.Client, obj *corev1.ConfigMap) error
	}{
		{"update pinned", func(c *fenced.Client, obj *corev1.ConfigMap) error {
			obj.Data["by"] = "a-late"
			return c.Update(ctx, obj)
		}},
		{"update unpinned", func(c *fenced.Client, obj *corev1.ConfigMap) error {
			obj.ResourceVersion = ""
			obj.Data["by"] = "a-late"
			return c.Update(ctx, obj)
		}},
		{"json patch", func(c *fenced.Client, obj *corev1.ConfigMap) error {
			return c.Patch(ctx, obj, client.RawPatch(types.JSONPatchType, []byte(`[{"op":"replace","path":"/data/by","value":"a-late"}]`)))
		}},
		{"merge patch", func(c *fenced.Client, obj *corev1.ConfigMap) error {
			return c.Patch(ctx, obj, client.RawPatch(types.MergePatchType, []byte(`{"data":{"by":"a-late"}}`)))
		}},
		{"strategic patch", func(c *fenced.Client, obj *corev1.ConfigMap) error {
			return c.Patch(ctx, obj, client.RawPatch(types.StrategicMergePatchType, []byte(`{"data":{"by":"a-late"}}`)))
		}},
		{"apply", func(c *fenced.Client, obj *corev1.ConfigMap) error {
			body := `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"` + obj.Name + `"},"data":{"by":"a-late"}}`
			return c.Patch(ctx, obj, client.RawPatch(types.ApplyYAMLPatchType, []byte(body)), client.FieldOwner("a"), client.ForceOwnership)
		}},
		{"delete", func(c *fenced.Client, obj *corev1.ConfigMap) error { return c.Delete(ctx, obj) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			toks := leaseTokens(k, t, "fence", 2)
			a, b := toks[0], toks[1]
			name := sanitize(tc.name)
			obj := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: k.NS, Name: name}, Data: map[string]string{"by": "a"}}
			require.NoError(t, k.Client(t, staticHolder{Tok: a}).Create(ctx, obj))
			var bRV string
			hook := &interposingReader{Reader: k.CRC, write: func() {
				cur := k.ConfigMap(t, name)
				cur.Data["by"] = "b"
				require.NoError(t, k.Client(t, staticHolder{Tok: b}).Update(ctx, cur))
				bRV = cur.ResourceVersion
			}}
			ca := k.Client(t, staticHolder{Tok: a}, fenced.WithReader(hook))
			err := tc.write(ca, obj.DeepCopy())
			t.Logf("a's write after b's: %v", err)
			require.True(t, hook.once, "the fenced client did not read")
			require.Error(t, err, "a's write landed after b's")
			cur := k.ConfigMap(t, name)
			requireStamped(t, cur.Annotations, b)
			require.Equal(t, "b", cur.Data["by"])
			require.Equal(t, bRV, cur.ResourceVersion)
		})
	}

	for _, tc := range []struct {
		name  string
		write func(c *fenced.Client, pod *corev1.Pod) error
	}{
		{"status update", func(c *fenced.Client, pod *corev1.Pod) error {
			pod.Status.Message = "a-late"
			return c.Status().Update(ctx, pod)
		}},
		{"status merge patch", func(c *fenced.Client, pod *corev1.Pod) error {
			return c.Status().Patch(ctx, pod, client.RawPatch(types.MergePatchType, []byte(`{"status":{"message":"a-late"}}`)))
		}},
		{"status json patch", func(c *fenced.Client, pod *corev1.Pod) error {
			return c.Status().Patch(ctx, pod, client.RawPatch(types.JSONPatchType, []byte(`[{"op":"add","path":"/status/message","value":"a-late"}]`)))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			toks := leaseTokens(k, t, "fence", 2)
			a, b := toks[0], toks[1]
			name := sanitize(tc.name)
			pod := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Namespace: k.NS, Name: name},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "example.invalid/none"}}},
			}
			require.NoError(t, k.Client(t, staticHolder{Tok: a}).Create(ctx, pod))
			get := func() *corev1.Pod {
				var p corev1.Pod
				require.NoError(t, k.CRC.Get(ctx, client.ObjectKeyFromObject(pod), &p))
				return &p
			}
			var bRV string
			hook := &interposingReader{Reader: k.CRC, write: func() {
				cur := get()
				cur.Status.Message = "b"
				require.NoError(t, k.Client(t, staticHolder{Tok: b}).Status().Update(ctx, cur))
				bRV = cur.ResourceVersion
			}}
			ca := k.Client(t, staticHolder{Tok: a}, fenced.WithReader(hook))
			err := tc.write(ca, get())
			t.Logf("a's write after b's: %v", err)
			require.True(t, hook.once)
			require.Error(t, err, "a's status write landed after b's")
			cur := get()
			requireStamped(t, cur.Annotations, b)
			require.Equal(t, "b", cur.Status.Message)
			require.Equal(t, bRV, cur.ResourceVersion)
		})
	}

	t.Run("UpdateFenced with b writing during mutate", func(t *testing.T) {
		toks := leaseTokens(k, t, "fence", 2)
		a, b := toks[0], toks[1]
		obj := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: k.NS, Name: "mutate"}, Data: map[string]string{"by": "a"}}
		require.NoError(t, k.Client(t, staticHolder{Tok: a}).Create(ctx, obj))
		cms := k.CS.CoreV1().ConfigMaps(k.NS)
		first := true
		_, err := fenced.UpdateFenced(ctx, staticHolder{Tok: a},
			func(ctx context.Context) (*corev1.ConfigMap, error) {
				return cms.Get(ctx, "mutate", metav1.GetOptions{})
			},
			func(cm *corev1.ConfigMap) error {
				if first {
					first = false
					cur := k.ConfigMap(t, "mutate")
					cur.Data["by"] = "b"
					require.NoError(t, k.Client(t, staticHolder{Tok: b}).Update(ctx, cur))
				}
				cm.Data["by"] = "a-late"
				return nil
			},
			func(ctx context.Context, cm *corev1.ConfigMap) (*corev1.ConfigMap, error) {
				return cms.Update(ctx, cm, metav1.UpdateOptions{})
			})
		t.Logf("a's write after b's: %v", err)
		require.ErrorIs(t, err, token.ErrStale)
		cur := k.ConfigMap(t, "mutate")
		requireStamped(t, cur.Annotations, b)
		require.Equal(t, "b", cur.Data["by"])
	})
}

// unsafeCacheWrite is the write of TestRedTeamSharedCacheMemory through a
// controller-runtime cache without deep copies: the superseded holder a
// stamps its token into the annotations the cache handed it and updates
// through the fenced client reading from that cache.
func unsafeCacheWrite(t *testing.T, k *kube, name string) (superseded, error) {
	t.Helper()
	ctx := t.Context()
	s := newSuperseded(t, k, name)
	unsafe := true
	c, err := cache.New(k.Env.Admin(), cache.Options{
		Scheme:                       clientgoscheme.Scheme,
		DefaultNamespaces:            map[string]cache.Config{k.NS: {}},
		DefaultUnsafeDisableDeepCopy: &unsafe,
	})
	require.NoError(t, err)
	cctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Start(cctx) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
	_, err = c.GetInformer(ctx, &corev1.ConfigMap{})
	require.NoError(t, err)
	require.True(t, c.WaitForCacheSync(ctx))
	key := client.ObjectKey{Namespace: k.NS, Name: s.current.Name}
	require.Eventually(t, func() bool {
		var cm corev1.ConfigMap
		return c.Get(ctx, key, &cm) == nil && cm.ResourceVersion == s.current.ResourceVersion
	}, 10*time.Second, 10*time.Millisecond)

	var obj corev1.ConfigMap
	require.NoError(t, c.Get(ctx, key, &obj))
	s.a.Stamp(obj.Annotations) // the careless caller stamps "its" token by hand
	obj.Data = map[string]string{"by": "a-late"}
	fc := k.Client(t, staticHolder{Tok: s.a}, fenced.WithReader(c))
	err = fc.Update(ctx, &obj)
	stored := k.ConfigMap(t, s.current.Name)
	t.Logf("fenced Update of the superseded holder (a=%v, b=%v): err=%v; stored annotations %v, data %v", s.a, s.b, err, stored.Annotations, stored.Data)
	return s, err
}

// TestRedTeamSharedCacheMemoryWithPolicy hand-edits the superseded
// holder's stamp into a client-go lister's object, which UpdateFenced's get
// then returns: no client-side check can tell that memory from what the
// API server stores (docs/protocol.md, Limits), so the admission policy
// must refuse the write.
func TestRedTeamSharedCacheMemoryWithPolicy(t *testing.T) {
	k := policyKube(t)
	ctx := t.Context()
	s := newSuperseded(t, k, "lister")
	factory := informers.NewSharedInformerFactoryWithOptions(k.CS, 0, informers.WithNamespace(k.NS))
	lister := factory.Core().V1().ConfigMaps().Lister()
	stop := make(chan struct{})
	factory.Start(stop)
	t.Cleanup(func() { close(stop); factory.Shutdown() })
	factory.WaitForCacheSync(stop)
	require.Eventually(t, func() bool {
		cm, err := lister.ConfigMaps(k.NS).Get(s.current.Name)
		return err == nil && cm.ResourceVersion == s.current.ResourceVersion
	}, 10*time.Second, 10*time.Millisecond)

	cached, err := lister.ConfigMaps(k.NS).Get(s.current.Name)
	require.NoError(t, err)
	s.a.Stamp(cached.Annotations) // hand-edited, in the lister's memory
	cms := k.CS.CoreV1().ConfigMaps(k.NS)
	_, err = fenced.UpdateFenced(ctx, staticHolder{Tok: s.a},
		func(context.Context) (*corev1.ConfigMap, error) { return lister.ConfigMaps(k.NS).Get(s.current.Name) },
		func(cm *corev1.ConfigMap) error { cm.Data = map[string]string{"by": "a-late"}; return nil },
		func(ctx context.Context, cm *corev1.ConfigMap) (*corev1.ConfigMap, error) {
			return cms.Update(ctx, cm, metav1.UpdateOptions{})
		})
	stored := k.ConfigMap(t, s.current.Name)
	t.Logf("UpdateFenced of the superseded holder (a=%v, b=%v): err=%v; stored annotations %v, data %v", s.a, s.b, err, stored.Annotations, stored.Data)
	require.True(t, apierrors.IsForbidden(err), "not denied by the policy: %v", err)
	s.requireIntact(t)
}

// TestRedTeamResurrectionWithLiveLease installs both admission policies
// and lets holder a, superseded (kubefencertest.Supersede) but not
// noticing, write objects the new holder has not written and recreate one
// the new holder deleted: through the fenced client (Create, Apply,
// Update) and raw, with and without the epoch. The live-Lease policy must
// refuse every one.
func TestRedTeamResurrectionWithLiveLease(t *testing.T) {
	k := kubetest.LiveKube(t)
	ctx := t.Context()
	ha := acquire(t, k.Elector(t, "replica-a"))
	ta := ha.Token()
	a := k.Client(t, staticHolder{Tok: ta})
	for _, name := range []string{"deleted", "untouched"} {
		require.NoError(t, a.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: k.NS, Name: name}, Data: map[string]string{"by": "a"}}))
	}
	pctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	require.NoError(t, kubefencertest.InstallPolicy(pctx, k.Env.Admin()))
	k.InstallLiveLease(t)
	taken := kubefencertest.Supersede(t, k.Env.Admin(), ha)
	b := k.Client(t, taken)
	require.NoError(t, b.Delete(ctx, k.ConfigMap(t, "deleted")))
	untouched := k.ConfigMap(t, "untouched").ResourceVersion
	// The live check reads the API server's Lease cache: wait until it has
	// the takeover, so that each write below comes after it.
	require.Eventually(t, func() bool {
		probe := k.ConfigMap(t, "untouched")
		return apierrors.IsForbidden(k.CRC.Update(ctx, probe, client.DryRunAll))
	}, 10*time.Second, 5*time.Millisecond)

	requireRefused := func(t *testing.T, err error) {
		t.Helper()
		t.Logf("a's write: %v", err)
		require.True(t, apierrors.IsForbidden(err), "not refused by the API server: %v", err)
		require.True(t, apierrors.IsNotFound(k.CRC.Get(ctx, client.ObjectKey{Namespace: k.NS, Name: "deleted"}, &corev1.ConfigMap{})), "resurrected")
		require.Equal(t, untouched, k.ConfigMap(t, "untouched").ResourceVersion, "the untouched object changed")
	}
	t.Run("fenced create", func(t *testing.T) {
		requireRefused(t, a.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: k.NS, Name: "deleted"}, Data: map[string]string{"by": "a-late"}}))
	})
	t.Run("fenced apply", func(t *testing.T) {
		body := `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"namespace":"` + k.NS + `","name":"deleted"},"data":{"by":"a-late"}}`
		obj := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: k.NS, Name: "deleted"}}
		requireRefused(t, a.Patch(ctx, obj, client.RawPatch(types.ApplyYAMLPatchType, []byte(body)), client.FieldOwner("a")))
	})
	t.Run("fenced update of an untouched object", func(t *testing.T) {
		obj := k.ConfigMap(t, "untouched")
		obj.Data["by"] = "a-late"
		requireRefused(t, a.Update(ctx, obj))
	})
	t.Run("fenced merge patch of an untouched object", func(t *testing.T) {
		obj := k.ConfigMap(t, "untouched")
		requireRefused(t, a.Patch(ctx, obj, client.RawPatch(types.MergePatchType, []byte(`{"data":{"by":"a-late"}}`))))
	})
	t.Run("raw create with a's stamp", func(t *testing.T) {
		requireRefused(t, k.CRC.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: k.NS, Name: "deleted", Annotations: ta.Stamp(nil)}}))
	})
	t.Run("raw create with a's stamp without the epoch", func(t *testing.T) {
		ann := ta.Stamp(nil)
		delete(ann, token.AnnotationEpoch)
		requireRefused(t, k.CRC.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: k.NS, Name: "deleted", Annotations: ann}}))
	})
	t.Run("raw update of an untouched object dropping the epoch", func(t *testing.T) {
		obj := k.ConfigMap(t, "untouched")
		delete(obj.Annotations, token.AnnotationEpoch)
		obj.Data["by"] = "a-late"
		requireRefused(t, k.CRC.Update(ctx, obj))
	})
}

// bindingAlias is a Go type of its own that a scheme registers as core/v1
// Binding: a fenced client that recognizes Bindings by Go type would not
// know it.
type bindingAlias corev1.Binding

func (b *bindingAlias) DeepCopyObject() runtime.Object {
	out := (*corev1.Binding)(b).DeepCopy()
	return (*bindingAlias)(out)
}

// TestRedTeamBindingCopiesTheStampOntoThePod creates, as the superseded
// holder a and without the admission policy, a Binding of an unscheduled
// Pod that b stamped, in every form a caller can: the typed Binding, an
// unstructured one, a Go type of its own registered as v1 Binding, and a
// pods/binding subresource create. The API server copies a Binding's
// annotations onto its Pod, so a stamped Binding would overwrite b's
// stamp with a's: each must be refused and the Pod keep b's stamp.
func TestRedTeamBindingCopiesTheStampOntoThePod(t *testing.T) {
	k := clientKube(t)
	ctx := t.Context()
	scheme := runtime.NewScheme()
	require.NoError(t, clientgoscheme.AddToScheme(scheme))
	aliasScheme := runtime.NewScheme()
	aliasScheme.AddKnownTypeWithName(corev1.SchemeGroupVersion.WithKind("Binding"), &bindingAlias{})
	metav1.AddToGroupVersion(aliasScheme, corev1.SchemeGroupVersion)
	aliasClient, err := client.New(k.Env.Admin(), client.Options{Scheme: aliasScheme})
	require.NoError(t, err)

	for i, tc := range []struct {
		name  string
		inner client.Client
		write func(c *fenced.Client, pod *corev1.Pod) error
	}{
		{"typed binding", k.CRC, func(c *fenced.Client, pod *corev1.Pod) error {
			return c.Create(ctx, &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name}, Target: corev1.ObjectReference{Kind: "Node", Name: "n1"}})
		}},
		{"unstructured binding", k.CRC, func(c *fenced.Client, pod *corev1.Pod) error {
			return c.Create(ctx, &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": "v1", "kind": "Binding",
				"metadata": map[string]any{"namespace": pod.Namespace, "name": pod.Name},
				"target":   map[string]any{"kind": "Node", "name": "n1"},
			}})
		}},
		{"own Go type registered as v1 Binding", aliasClient, func(c *fenced.Client, pod *corev1.Pod) error {
			return c.Create(ctx, &bindingAlias{ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name}, Target: corev1.ObjectReference{Kind: "Node", Name: "n1"}})
		}},
		{"pods/binding subresource", k.CRC, func(c *fenced.Client, pod *corev1.Pod) error {
			return c.SubResource("binding").Create(ctx, pod, &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name}, Target: corev1.ObjectReference{Kind: "Node", Name: "n1"}})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newPodScene(t, k, fmt.Sprintf("bind%d", i))
			c, err := fenced.NewClient(tc.inner, staticHolder{Tok: s.a})
			require.NoError(t, err)
			err = tc.write(c, s.pod(t))
			t.Logf("a's binding: %v", err)
			pod := s.pod(t)
			t.Logf("pod annotations %v, node %q", pod.Annotations, pod.Spec.NodeName)
			requireStamped(t, pod.Annotations, s.b)
			require.Empty(t, pod.Spec.NodeName, "a's binding landed")
		})
	}
}

// TestRedTeamUnstructuredAnnotationsNotStrings updates, as the current
// holder, an unstructured object whose annotations hold a value that is
// not a string (a caller's bug). A plain client's update is refused by
// the API server and writes nothing; a fenced one must not instead write
// the object with the caller's other annotations, and the stored ones,
// erased.
func TestRedTeamUnstructuredAnnotationsNotStrings(t *testing.T) {
	k := clientKube(t)
	ctx := t.Context()
	tok := leaseTokens(k, t, "fence", 1)[0]
	c := k.Client(t, staticHolder{Tok: tok})
	for i, tc := range []struct {
		name string
		edit func(u *unstructured.Unstructured)
	}{
		{"a number among the annotations", func(u *unstructured.Unstructured) {
			ann := u.Object["metadata"].(map[string]any)["annotations"].(map[string]any)
			ann["n"] = int64(5)
		}},
		{"a null among the annotations (YAML `note:`)", func(u *unstructured.Unstructured) {
			ann := u.Object["metadata"].(map[string]any)["annotations"].(map[string]any)
			ann["note"] = nil
		}},
		{"annotations not a map", func(u *unstructured.Unstructured) {
			u.Object["metadata"].(map[string]any)["annotations"] = "keep"
		}},
		{"resourceVersion a number", func(u *unstructured.Unstructured) {
			u.Object["metadata"].(map[string]any)["resourceVersion"] = int64(1)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := fmt.Sprintf("u%d", i)
			require.NoError(t, c.Create(ctx, &corev1.ConfigMap{
				ObjectMeta: metav1.ObjectMeta{Namespace: k.NS, Name: name, Annotations: map[string]string{"keep": "me", "also": "me"}},
				Data:       map[string]string{"by": "0"},
			}))
			before := k.ConfigMap(t, name)
			u := &unstructured.Unstructured{}
			u.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("ConfigMap"))
			require.NoError(t, k.CRC.Get(ctx, client.ObjectKey{Namespace: k.NS, Name: name}, u))
			require.NoError(t, unstructured.SetNestedField(u.Object, tc.name, "data", "by"))
			tc.edit(u)
			plainErr := k.CRC.Update(ctx, u.DeepCopy(), client.DryRunAll)
			err := c.Update(ctx, u)
			after := k.ConfigMap(t, name)
			t.Logf("plain (dry run): %v; fenced: %v; stored annotations %v", plainErr, err, after.Annotations)
			require.Equal(t, "me", after.Annotations["keep"], "a stored annotation the caller did not touch was erased")
			require.Equal(t, "me", after.Annotations["also"], "a stored annotation the caller did not touch was erased")
			if plainErr != nil {
				require.Error(t, err, "the fenced update wrote what the API server refuses from a plain client")
				require.Equal(t, before.ResourceVersion, after.ResourceVersion)
			}
		})
	}
}

// TestRedTeamDryRunWritesNothing sends fenced writes with DryRunAll, and
// status writes the API server refuses as invalid, over an object stamped
// by an older token, so that a status write would first stamp the main
// resource: a dry run, and a refused write, must store nothing.
func TestRedTeamDryRunWritesNothing(t *testing.T) {
	k := clientKube(t)
	ctx := t.Context()
	toks := leaseTokens(k, t, "fence", 2)
	for i, tc := range []struct {
		name  string
		write func(c *fenced.Client, pod *corev1.Pod) error
	}{
		{"status update", func(c *fenced.Client, pod *corev1.Pod) error {
			pod.Status.Message = "dry"
			return c.Status().Update(ctx, pod, client.DryRunAll)
		}},
		{"status patch", func(c *fenced.Client, pod *corev1.Pod) error {
			return c.Status().Patch(ctx, pod, client.RawPatch(types.MergePatchType, []byte(`{"status":{"message":"dry"}}`)), client.DryRunAll)
		}},
		{"update", func(c *fenced.Client, pod *corev1.Pod) error {
			pod.Labels = map[string]string{"dry": "run"}
			return c.Update(ctx, pod, client.DryRunAll)
		}},
		{"patch", func(c *fenced.Client, pod *corev1.Pod) error {
			return c.Patch(ctx, pod, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"labels":{"dry":"run"}}}`)), client.DryRunAll)
		}},
		{"delete", func(c *fenced.Client, pod *corev1.Pod) error {
			return c.Delete(ctx, pod, client.DryRunAll)
		}},
		{"status update the API server refuses as invalid", func(c *fenced.Client, pod *corev1.Pod) error {
			pod.Status.PodIP = "not an IP"
			err := c.Status().Update(ctx, pod)
			if err == nil {
				return errors.New("an invalid status was accepted")
			}
			return nil
		}},
		{"status patch the API server refuses as invalid", func(c *fenced.Client, pod *corev1.Pod) error {
			err := c.Status().Patch(ctx, pod, client.RawPatch(types.MergePatchType, []byte(`{"status":{"podIP":"not an IP"}}`)))
			if err == nil {
				return errors.New("an invalid status was accepted")
			}
			return nil
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := fmt.Sprintf("dry%d", i)
			pod := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Namespace: k.NS, Name: name},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "example.invalid/none"}}},
			}
			require.NoError(t, k.Client(t, staticHolder{Tok: toks[0]}).Create(ctx, pod))
			var before corev1.Pod
			require.NoError(t, k.CRC.Get(ctx, client.ObjectKeyFromObject(pod), &before))
			err := tc.write(k.Client(t, staticHolder{Tok: toks[1]}), before.DeepCopy())
			var after corev1.Pod
			require.NoError(t, k.CRC.Get(ctx, client.ObjectKeyFromObject(pod), &after))
			t.Logf("dry run: %v; stored annotations %v", err, after.Annotations)
			require.Equal(t, before.ResourceVersion, after.ResourceVersion, "a dry run stored a write")
		})
	}
}

// TestRedTeamPatchContentTypes sends, as the current holder, patches that
// drop the stamp under content types the API server takes for a known
// patch type although they are not spelled as one (a charset parameter,
// the CBOR apply type), and multi-document YAML applies whose later
// documents null the annotations. Whatever the fenced client does with
// them, the stamp and marks must survive.
func TestRedTeamPatchContentTypes(t *testing.T) {
	mark := "{ns}.other.mark.fencer.dev/token"
	runHolderPatches(t, []patchCase{
		{"merge patch with charset", types.PatchType(string(types.MergePatchType) + "; charset=utf-8"), `{"metadata":{"annotations":null}}`},
		{"json patch with charset", types.PatchType(string(types.JSONPatchType) + ";charset=utf-8"), `[{"op":"remove","path":"/metadata/annotations"}]`},
		{"strategic patch with charset", types.PatchType(string(types.StrategicMergePatchType) + "; charset=utf-8"), `{"metadata":{"annotations":{"$patch":"replace"}}}`},
		{"apply with charset", types.PatchType(string(types.ApplyYAMLPatchType) + "; charset=utf-8"), `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"NAME","annotations":{"fencer.dev/token":"1","` + mark + `":"1"}}}`},
		{"cbor apply", types.ApplyCBORPatchType, "\xa3japiVersionbv1dkindiConfigMaphmetadata\xa1dnamedNAME"},
		{"multi-document apply", types.ApplyYAMLPatchType, "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: NAME\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: NAME\n  annotations:\n    fencer.dev/token: \"1\"\n"},
		{"apply with a leading document separator", types.ApplyYAMLPatchType, "---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: NAME\n  annotations:\n    fencer.dev/token: \"1\"\n    " + mark + ": \"1\"\n"},
		{"merge patch with a byte order mark", types.MergePatchType, "\ufeff" + `{"metadata":{"annotations":null}}`},
		{"json patch with a byte order mark", types.JSONPatchType, "\ufeff" + `[{"op":"remove","path":"/metadata/annotations/fencer.dev~1token"}]`},
	})
}

// TestRedTeamPatchMeansWhatItSays sends each patch twice: through the
// plain client to an unstamped twin, and through the fenced client, as the
// current holder, to the stamped object. Apart from the protocol
// annotations the two results must be the same: a fenced patch that
// erases what the plain one keeps loses data, and one that drops what the
// plain one writes loses the caller's write. A patch the fenced client
// refuses as documented (ErrInvalidPatch) writes nothing.
func TestRedTeamPatchMeansWhatItSays(t *testing.T) {
	k := clientKube(t)
	ctx := t.Context()
	tok := leaseTokens(k, t, "fence", 1)[0]
	fc := k.Client(t, staticHolder{Tok: tok})
	j, m, sm := types.JSONPatchType, types.MergePatchType, types.StrategicMergePatchType
	for i, tc := range []patchCase{
		{"json remove then add annotations", j, `[{"op":"remove","path":"/metadata/annotations"},{"op":"add","path":"/metadata/annotations","value":{"x":"1"}}]`},
		{"json add annotations map", j, `[{"op":"add","path":"/metadata/annotations","value":{"x":"1"}}]`},
		{"json replace annotations map", j, `[{"op":"replace","path":"/metadata/annotations","value":{"x":"1","keep":"changed"}}]`},
		{"json remove annotations then add one", j, `[{"op":"remove","path":"/metadata/annotations"},{"op":"add","path":"/metadata/annotations","value":{}},{"op":"add","path":"/metadata/annotations/y","value":"2"}]`},
		{"json copy annotations to labels", j, `[{"op":"copy","from":"/metadata/annotations/keep","path":"/metadata/labels/keep"}]`},
		{"json test then replace", j, `[{"op":"test","path":"/metadata/annotations/keep","value":"me"},{"op":"replace","path":"/metadata/annotations/keep","value":"tested"}]`},
		{"json failing test", j, `[{"op":"test","path":"/metadata/annotations/keep","value":"other"},{"op":"replace","path":"/data/a","value":"should not land"}]`},
		{"json move data to annotations", j, `[{"op":"move","from":"/data/a","path":"/metadata/annotations/moved"}]`},
		{"json remove then re-add keep", j, `[{"op":"remove","path":"/metadata/annotations"},{"op":"add","path":"/metadata/annotations","value":{"keep":"again"}}]`},
		{"merge null annotations then data", m, `{"metadata":{"annotations":null},"data":{"a":"2"}}`},
		{"merge annotations", m, `{"metadata":{"annotations":{"keep":null,"x":"1"}}}`},
		{"strategic null annotations", sm, `{"metadata":{"annotations":null}}`},
		{"strategic annotations", sm, `{"metadata":{"annotations":{"keep":null,"x":"1"}}}`},
		{"strategic retainKeys data", sm, `{"data":{"$retainKeys":["a"],"a":"3"}}`},
		{"strategic replace data", sm, `{"data":{"$patch":"replace","b":"4"}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			build := func(name string) *corev1.ConfigMap {
				return &corev1.ConfigMap{
					ObjectMeta: metav1.ObjectMeta{Namespace: k.NS, Name: name, Annotations: map[string]string{"keep": "me", "also": "me"}, Labels: map[string]string{"l": "1"}},
					Data:       map[string]string{"a": "1", "b": "1"},
				}
			}
			twin, obj := build(fmt.Sprintf("twin%d", i)), build(fmt.Sprintf("obj%d", i))
			require.NoError(t, k.CRC.Create(ctx, twin))
			require.NoError(t, fc.Create(ctx, obj))
			before := k.ConfigMap(t, obj.Name).ResourceVersion
			plainErr := k.CRC.Patch(ctx, twin, client.RawPatch(tc.typ, []byte(tc.patch)))
			fencedErr := fc.Patch(ctx, obj, client.RawPatch(tc.typ, []byte(tc.patch)))
			gotTwin, got := k.ConfigMap(t, twin.Name), k.ConfigMap(t, obj.Name)
			t.Logf("plain: %v; fenced: %v", plainErr, fencedErr)
			t.Logf("plain result: annotations %v labels %v data %v", gotTwin.Annotations, gotTwin.Labels, gotTwin.Data)
			t.Logf("fenced result: annotations %v labels %v data %v", got.Annotations, got.Labels, got.Data)
			if errors.Is(fencedErr, fenced.ErrInvalidPatch) {
				require.Equal(t, before, got.ResourceVersion, "a refused patch wrote")
				return
			}
			requireStamped(t, got.Annotations, tok)
			if plainErr != nil {
				require.Error(t, fencedErr, "the plain patch fails, the fenced one did not")
				require.Equal(t, before, got.ResourceVersion)
				return
			}
			require.NoError(t, fencedErr)
			unprotocol := func(ann map[string]string) map[string]string {
				out := map[string]string{}
				for k, v := range ann {
					if !token.IsProtocolKey(k) {
						out[k] = v
					}
				}
				return out
			}
			require.Equal(t, unprotocol(gotTwin.Annotations), unprotocol(got.Annotations), "annotations differ from the plain patch's")
			require.Equal(t, gotTwin.Labels, got.Labels, "labels differ from the plain patch's")
			require.Equal(t, gotTwin.Data, got.Data, "data differs from the plain patch's")
		})
	}
}

// TestRedTeamSubResourceBody writes Pod /status through the fenced client
// with controller-runtime's WithSubResourceBody, which makes the inner
// client send another object than the one passed. First the current holder
// b sends a body without annotations or with a's stamp (pods/status
// stores the body's annotations); then a, whose check passes because b
// writes only after a's read, sends a body without a resourceVersion
// (an unconditional PUT). The stamp must stay b's and a's write must not
// land.
func TestRedTeamSubResourceBody(t *testing.T) {
	k := clientKube(t)
	ctx := t.Context()
	for i, tc := range []struct {
		name  string
		write func(c *fenced.Client, s *podScene, pod *corev1.Pod) error
	}{
		{"status update, body without annotations", func(c *fenced.Client, _ *podScene, pod *corev1.Pod) error {
			body := pod.DeepCopy()
			body.Annotations = nil
			body.Status.Message = "body"
			return c.Status().Update(ctx, pod, client.WithSubResourceBody(body))
		}},
		{"status update, body with a's stamp", func(c *fenced.Client, s *podScene, pod *corev1.Pod) error {
			body := pod.DeepCopy()
			body.Annotations = s.a.Stamp(nil)
			body.Status.Message = "body"
			return c.Status().Update(ctx, pod, client.WithSubResourceBody(body))
		}},
		{"status merge patch from the object, body without annotations", func(c *fenced.Client, _ *podScene, pod *corev1.Pod) error {
			base := pod.DeepCopy()
			body := pod.DeepCopy()
			body.Annotations = nil
			body.Status.Message = "body"
			return c.Status().Patch(ctx, pod, client.MergeFrom(base), client.WithSubResourceBody(body))
		}},
		{"status apply, body without annotations", func(c *fenced.Client, s *podScene, pod *corev1.Pod) error {
			u := &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": "v1", "kind": "Pod",
				"metadata": map[string]any{"namespace": pod.Namespace, "name": pod.Name},
				"status":   map[string]any{"message": "cfg"},
			}}
			body := &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": "v1", "kind": "Pod",
				"metadata": map[string]any{"namespace": pod.Namespace, "name": pod.Name, "annotations": map[string]any{}},
				"status":   map[string]any{"message": "body"},
			}}
			return c.Status().Apply(ctx, client.ApplyConfigurationFromUnstructured(u), &client.SubResourceApplyOptions{SubResourceBody: client.ApplyConfigurationFromUnstructured(body)}, client.FieldOwner("red"), client.ForceOwnership)
		}},
	} {
		t.Run("current holder "+tc.name, func(t *testing.T) {
			s := newPodScene(t, k, fmt.Sprintf("body%d", i))
			err := tc.write(k.Client(t, staticHolder{Tok: s.b}), s, s.pod(t))
			pod := s.pod(t)
			t.Logf("b's write: %v; stored annotations %v, message %q", err, pod.Annotations, pod.Status.Message)
			s.requireFenced(t)
		})
	}

	t.Run("superseded holder, unconditional body, b writes after a's check", func(t *testing.T) {
		toks := leaseTokens(k, t, "fence", 2)
		a, b := toks[0], toks[1]
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: k.NS, Name: "body-late"},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "example.invalid/none"}}},
		}
		require.NoError(t, k.Client(t, staticHolder{Tok: a}).Create(ctx, pod))
		get := func() *corev1.Pod {
			var p corev1.Pod
			require.NoError(t, k.CRC.Get(ctx, client.ObjectKeyFromObject(pod), &p))
			return &p
		}
		hook := &interposingReader{Reader: k.CRC, write: func() {
			cur := get()
			cur.Status.Message = "b"
			require.NoError(t, k.Client(t, staticHolder{Tok: b}).Status().Update(ctx, cur))
		}}
		ca := k.Client(t, staticHolder{Tok: a}, fenced.WithReader(hook))
		obj := get()
		body := obj.DeepCopy()
		body.ResourceVersion = ""
		body.Status.Message = "a-late"
		err := ca.Status().Update(ctx, obj, client.WithSubResourceBody(body))
		cur := get()
		t.Logf("a's write: %v; stored annotations %v, message %q", err, cur.Annotations, cur.Status.Message)
		require.Error(t, err, "a's status write landed")
		if errors.Is(err, fenced.ErrUnsupported) {
			require.False(t, hook.once, "refused after reading")
			requireStamped(t, cur.Annotations, a)
			return
		}
		require.True(t, hook.once)
		requireStamped(t, cur.Annotations, b)
		require.Equal(t, "b", cur.Status.Message)
	})
}

// clearPreconditions is a caller's DeleteOption that drops whatever
// preconditions the options carry when it is applied.
type clearPreconditions struct{ empty bool }

func (c clearPreconditions) ApplyToDelete(o *client.DeleteOptions) {
	if c.empty {
		o.Preconditions = &metav1.Preconditions{}
		return
	}
	o.Preconditions = nil
	if o.Raw != nil {
		o.Raw.Preconditions = nil
	}
}

// TestRedTeamDeleteOptionsDropThePreconditions deletes, as holder a, with
// caller options that clear the preconditions (nil, or empty ones, or a
// Raw metav1.DeleteOptions), while b writes the object between a's check
// and a's delete. The delete must not remove b's object.
func TestRedTeamDeleteOptionsDropThePreconditions(t *testing.T) {
	k := clientKube(t)
	ctx := t.Context()
	empty := ""
	for i, tc := range []struct {
		name string
		opts []client.DeleteOption
	}{
		{"option clearing preconditions", []client.DeleteOption{clearPreconditions{}}},
		{"option setting empty preconditions", []client.DeleteOption{clearPreconditions{empty: true}}},
		{"raw options with empty preconditions", []client.DeleteOption{&client.DeleteOptions{Raw: &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{}}}}},
		{"preconditions with an empty resourceVersion", []client.DeleteOption{client.Preconditions{ResourceVersion: &empty}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			toks := leaseTokens(k, t, "fence", 2)
			a, b := toks[0], toks[1]
			name := fmt.Sprintf("del%d", i)
			obj := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: k.NS, Name: name}, Data: map[string]string{"by": "a"}}
			require.NoError(t, k.Client(t, staticHolder{Tok: a}).Create(ctx, obj))
			hook := &interposingReader{Reader: k.CRC, write: func() {
				cur := k.ConfigMap(t, name)
				cur.Data["by"] = "b"
				require.NoError(t, k.Client(t, staticHolder{Tok: b}).Update(ctx, cur))
			}}
			err := k.Client(t, staticHolder{Tok: a}, fenced.WithReader(hook)).Delete(ctx, obj.DeepCopy(), tc.opts...)
			t.Logf("a's delete: %v", err)
			require.Error(t, err, "a's delete was accepted")
			cur := &corev1.ConfigMap{}
			require.NoError(t, k.CRC.Get(ctx, client.ObjectKeyFromObject(obj), cur), "b's object was deleted")
			requireStamped(t, cur.Annotations, b)
		})
	}
}

// TestRedTeamApplyForcesOnlyProtocolKeys makes a fenced apply conflict
// both over the protocol annotations (another manager applied an older
// stamp) and over a label whose key looks like a protocol key
// (fencer.dev/token, x.mark.fencer.dev/token as labels), owned by another
// manager. The fenced client forces conflicts over protocol keys alone;
// a label is not one, so the apply must fail with a conflict and the
// other manager's label must keep its value.
func TestRedTeamApplyForcesOnlyProtocolKeys(t *testing.T) {
	k := clientKube(t)
	ctx := t.Context()
	toks := leaseTokens(k, t, "fence", 2)
	for i, label := range []string{"fencer.dev/token", "fencer.dev/lease", "x.mark.fencer.dev/token", "fencer.dev/epoch"} {
		t.Run(label, func(t *testing.T) {
			name := fmt.Sprintf("force%d", i)
			apply := func(c client.Client, manager, value string, opts ...client.PatchOption) error {
				body := `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"namespace":"` + k.NS + `","name":"` + name + `","labels":{"` + label + `":"` + value + `"}}}`
				obj := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: k.NS, Name: name}}
				return c.Patch(ctx, obj, client.RawPatch(types.ApplyYAMLPatchType, []byte(body)), append(opts, client.FieldOwner(manager))...)
			}
			// "other" owns the stamp of the older token and the label.
			require.NoError(t, apply(k.Client(t, staticHolder{Tok: toks[0]}), "other", "1"))
			err := apply(k.Client(t, staticHolder{Tok: toks[1]}), "ctrl", "2")
			cur := k.ConfigMap(t, name)
			t.Logf("ctrl's apply: %v; labels %v", err, cur.Labels)
			require.Error(t, err, "the apply forced a conflict over a label")
			require.Equal(t, "1", cur.Labels[label], "the other manager's label was overwritten")
		})
	}
}

// TestRedTeamRawStatusAndLeaseRecreate sends, with the admission policy,
// raw Pod /status writes that carry the superseded token or drop the
// stamp, and raw writes of a holder whose Lease was deleted and recreated
// (its epoch restarts, its revision does not) after the new holder wrote.
func TestRedTeamRawStatusAndLeaseRecreate(t *testing.T) {
	k := policyKube(t)
	ctx := t.Context()

	t.Run("pod status", func(t *testing.T) {
		s := newPodScene(t, k, "raw-status")
		for _, write := range []func(pod *corev1.Pod) error{
			func(pod *corev1.Pod) error {
				pod.Annotations = s.a.Stamp(map[string]string{})
				pod.Status.Message = "a-late"
				return k.CRC.Status().Update(ctx, pod)
			},
			func(pod *corev1.Pod) error {
				pod.Annotations = nil
				return k.CRC.Status().Update(ctx, pod)
			},
			func(pod *corev1.Pod) error {
				return k.CRC.Status().Patch(ctx, pod, client.RawPatch(types.JSONPatchType, []byte(`[{"op":"remove","path":"/metadata/annotations"}]`)))
			},
			func(pod *corev1.Pod) error {
				return k.CRC.Status().Patch(ctx, pod, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"annotations":{"fencer.dev/token":"`+fmt.Sprint(s.a.Revision)+`"}}}`)))
			},
			func(pod *corev1.Pod) error {
				body := `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"` + s.name + `","annotations":{"fencer.dev/token":"` + fmt.Sprint(s.a.Revision) + `"}},"status":{"message":"a-late"}}`
				return k.CRC.Status().Patch(ctx, pod, client.RawPatch(types.ApplyYAMLPatchType, []byte(body)), client.FieldOwner("raw"), client.ForceOwnership)
			},
		} {
			before := s.pod(t)
			err := write(before.DeepCopy())
			t.Logf("raw status write: %v", err)
			require.True(t, apierrors.IsForbidden(err), "not denied: %v", err)
			require.Equal(t, before.ResourceVersion, s.pod(t).ResourceVersion)
		}
		s.requireFenced(t)
	})

	t.Run("lease deleted and recreated", func(t *testing.T) {
		ea := k.Elector(t, "replica-a")
		ha := acquire(t, ea)
		a := ha.Token()
		obj := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: k.NS, Name: "recreated-lease"}, Data: map[string]string{"by": "a"}}
		require.NoError(t, k.Client(t, staticHolder{Tok: a}).Create(ctx, obj))
		require.NoError(t, k.CS.CoordinationV1().Leases(k.NS).Delete(ctx, "fence", metav1.DeleteOptions{}))
		hb := acquire(t, k.Elector(t, "replica-b"))
		b := hb.Token()
		requireGreater(t, b, a)
		t.Logf("a %v, b %v", a, b)
		cur := k.ConfigMap(t, obj.Name)
		cur.Data["by"] = "b"
		require.NoError(t, k.Client(t, hb).Update(ctx, cur))

		late := k.ConfigMap(t, obj.Name)
		late.Annotations = a.Stamp(nil)
		late.Data["by"] = "a-late"
		err := k.CRC.Update(ctx, late)
		require.True(t, apierrors.IsForbidden(err), "raw stale write not denied: %v", err)
		late = k.ConfigMap(t, obj.Name)
		late.Data["by"] = "a-late"
		require.ErrorIs(t, k.Client(t, staticHolder{Tok: a}).Update(ctx, late), token.ErrStale)
		got := k.ConfigMap(t, obj.Name)
		requireStamped(t, got.Annotations, b)
		require.Equal(t, "b", got.Data["by"])
	})
}

// TestRedTeamUnstructuredAnnotationsNotStringsOtherWrites is
// TestRedTeamUnstructuredAnnotationsNotStrings for a fenced Create and for
// UpdateFenced through a dynamic client, whose mutate leaves a number among
// the annotations: the plain writes are refused by the API server, so the
// fenced ones must not instead store the object with the caller's other
// annotations erased.
func TestRedTeamUnstructuredAnnotationsNotStringsOtherWrites(t *testing.T) {
	k := clientKube(t)
	ctx := t.Context()
	tok := leaseTokens(k, t, "fence", 1)[0]
	gvr := corev1.SchemeGroupVersion.WithResource("configmaps")

	t.Run("create", func(t *testing.T) {
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "v1", "kind": "ConfigMap",
			"metadata": map[string]any{"namespace": k.NS, "name": "create", "annotations": map[string]any{"keep": "me", "n": int64(5)}},
		}}
		plainErr := k.CRC.Create(ctx, u.DeepCopy(), client.DryRunAll)
		err := k.Client(t, staticHolder{Tok: tok}).Create(ctx, u)
		t.Logf("plain (dry run): %v; fenced: %v", plainErr, err)
		require.Error(t, plainErr)
		if err == nil {
			got := k.ConfigMap(t, "create")
			t.Logf("stored annotations %v", got.Annotations)
			require.Equal(t, "me", got.Annotations["keep"], "the caller's annotation was dropped")
		}
	})

	t.Run("UpdateFenced with a dynamic client", func(t *testing.T) {
		require.NoError(t, k.Client(t, staticHolder{Tok: tok}).Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Namespace: k.NS, Name: "dyn", Annotations: map[string]string{"keep": "me"}},
		}))
		dyn, err := dynamic.NewForConfig(k.Env.Admin())
		require.NoError(t, err)
		res := dyn.Resource(gvr).Namespace(k.NS)
		_, err = fenced.UpdateFenced(ctx, staticHolder{Tok: tok},
			func(ctx context.Context) (*unstructured.Unstructured, error) {
				return res.Get(ctx, "dyn", metav1.GetOptions{})
			},
			func(u *unstructured.Unstructured) error {
				u.Object["metadata"].(map[string]any)["annotations"].(map[string]any)["n"] = int64(5)
				return unstructured.SetNestedField(u.Object, "x", "data", "by")
			},
			func(ctx context.Context, u *unstructured.Unstructured) (*unstructured.Unstructured, error) {
				return res.Update(ctx, u, metav1.UpdateOptions{})
			})
		got := k.ConfigMap(t, "dyn")
		t.Logf("UpdateFenced: %v; stored annotations %v", err, got.Annotations)
		require.Equal(t, "me", got.Annotations["keep"], "a stored annotation the caller did not touch was erased")
	})
}

// TestRedTeamWholeObjectPatches sends controller-runtime's client.Merge
// (the whole object as a merge patch, its resourceVersion included) and
// client.Apply (the whole object as an apply): as the superseded holder a
// with its own old copy, and with b's current copy and a's stamp written
// in, and, as the current holder, with a typed Widget that lacks
// spec.extra.
func TestRedTeamWholeObjectPatches(t *testing.T) {
	k := clientKube(t)
	ctx := t.Context()
	for _, tc := range []struct {
		name  string
		patch client.Patch
		obj   func(s superseded) *corev1.ConfigMap
	}{
		{"merge of a's copy", client.Merge, func(s superseded) *corev1.ConfigMap { return s.aView.DeepCopy() }},
		{"merge of b's copy with a's stamp", client.Merge, func(s superseded) *corev1.ConfigMap {
			obj := s.current.DeepCopy()
			obj.Annotations = s.a.Stamp(nil)
			return obj
		}},
		{"merge of b's copy without resourceVersion", client.Merge, func(s superseded) *corev1.ConfigMap {
			obj := s.current.DeepCopy()
			obj.ResourceVersion = ""
			obj.ManagedFields = nil
			return obj
		}},
		{"apply of b's copy", client.Apply, func(s superseded) *corev1.ConfigMap {
			obj := s.current.DeepCopy()
			obj.ResourceVersion, obj.ManagedFields = "", nil
			obj.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"}
			return obj
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSuperseded(t, k, sanitize(tc.name))
			obj := tc.obj(s)
			obj.Data = map[string]string{"by": "a-late"}
			err := k.Client(t, staticHolder{Tok: s.a}).Patch(ctx, obj, tc.patch, client.FieldOwner("a"), client.ForceOwnership)
			t.Logf("a's patch: %v", err)
			require.Error(t, err)
			s.requireIntact(t)
			require.Equal(t, s.current.ResourceVersion, k.ConfigMap(t, s.current.Name).ResourceVersion)
		})
	}

	t.Run("merge of a typed widget by the current holder", func(t *testing.T) {
		wc := widgets(t, k)
		tok := leaseTokens(k, t, "fence", 1)[0]
		c, err := fenced.NewClient(wc, staticHolder{Tok: tok})
		require.NoError(t, err)
		newWidget(t, k, "whole")
		w := &widget{}
		require.NoError(t, wc.Get(ctx, client.ObjectKey{Namespace: k.NS, Name: "whole"}, w))
		w.Spec.Known = "k1"
		require.NoError(t, c.Patch(ctx, w, client.Merge))
		got := storedWidget(t, k, "whole")
		extra, _, _ := unstructured.NestedString(got.Object, "spec", "extra")
		require.Equal(t, "keep me", extra, "a field the Go type lacks was erased")
		requireStamped(t, got.GetAnnotations(), tok)
	})
}

// TestRedTeamUpdateCannotRecreateADeletedObject: some kinds' PUT creates
// the object when it does not exist (Lease, LimitRange: their strategies
// allow create on update), whatever resourceVersion it carries. A
// superseded holder's fenced Update whose read came before a newer
// holder's Delete, through a check that raced with the Delete or a cache
// that still shows the object, must not bring the object back. The
// fenced client sends the UID of the version it checked, which the API
// server compares with the stored object's, and there is none. The
// admission policy is installed; it cannot refuse what reaches it as a
// create.
func TestRedTeamUpdateCannotRecreateADeletedObject(t *testing.T) {
	k := policyKube(t)
	ctx := t.Context()
	newObj := func(kind, name string) client.Object {
		if kind == "lease" {
			h := "a"
			return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: k.NS, Name: name}, Spec: coordinationv1.LeaseSpec{HolderIdentity: &h}}
		}
		return &corev1.LimitRange{ObjectMeta: metav1.ObjectMeta{Namespace: k.NS, Name: name}, Spec: corev1.LimitRangeSpec{Limits: []corev1.LimitRangeItem{{Type: corev1.LimitTypeContainer, Max: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")}}}}}
	}
	for _, kind := range []string{"lease", "limitrange"} {
		for _, scene := range []string{"delete between check and write, pinned", "delete between check and write, unpinned", "lagging cache, hand-built object"} {
			name := fmt.Sprintf("%s-%d", kind, len(scene)%7+strings.Count(scene, ","))
			t.Run(kind+": "+scene, func(t *testing.T) {
				toks := leaseTokens(k, t, "fence-"+name, 2)
				a, b := toks[0], toks[1]
				obj := newObj(kind, name)
				require.NoError(t, k.Client(t, staticHolder{Tok: a}).Create(ctx, obj))
				deleteByB := func() {
					cur := newObj(kind, name)
					require.NoError(t, k.CRC.Get(ctx, client.ObjectKeyFromObject(obj), cur))
					require.NoError(t, k.Client(t, staticHolder{Tok: b}).Update(ctx, cur))
					require.NoError(t, k.Client(t, staticHolder{Tok: b}).Delete(ctx, cur))
				}
				w := obj.DeepCopyObject().(client.Object)
				w.SetUID("")
				w.SetLabels(map[string]string{"by": "a-late"})
				var ca *fenced.Client
				if scene == "lagging cache, hand-built object" {
					cached := obj.DeepCopyObject().(client.Object)
					deleteByB()
					ca = k.Client(t, staticHolder{Tok: a}, fenced.WithReader(laggingReader{cached}))
					w.SetResourceVersion("")
				} else {
					hook := &interposingReader{Reader: k.CRC, write: deleteByB}
					ca = k.Client(t, staticHolder{Tok: a}, fenced.WithReader(hook), fenced.WithAPIReader(hook))
					if strings.HasSuffix(scene, "unpinned") {
						w.SetResourceVersion("")
					}
				}
				err := ca.Update(ctx, w)
				require.Error(t, err, "the superseded holder's update after the delete reported success")
				require.True(t, apierrors.IsNotFound(k.CRC.Get(ctx, client.ObjectKeyFromObject(obj), newObj(kind, name))),
					"the superseded holder's update brought back the object the newer holder deleted")
				require.Empty(t, w.GetUID(), "the caller's object was left with the UID fencer sent")
			})
		}
	}
}
