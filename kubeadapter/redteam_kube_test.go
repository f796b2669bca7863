package kubeadapter_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fencer-dev/fencer/internal/kubetest"
	"github.com/fencer-dev/fencer/kubeadapter"
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
	require.NoError(t, k.crc.List(t.Context(), &vaps))
	if len(vaps.Items) == 0 {
		return k
	}
	return newKubeOn(t, kubetest.StartForTest(t))
}

// leaseTokens acquires and releases the Lease name of k's namespace n
// times and returns the tokens, oldest first.
func (k *kube) leaseTokens(t *testing.T, name string, n int) []token.Token {
	t.Helper()
	cfg := k.fast("red-" + name)
	cfg.Name = name
	e, err := kubeadapter.NewElector(k.cs.CoordinationV1(), cfg)
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
	ctx := t.Context()
	fence := k.leaseTokens(t, "fence", 2)
	other := k.leaseTokens(t, "other", 2)
	s := &hopScene{k: k, a: fence[0], b: fence[1], m0: other[0], m: other[1], name: name}
	obj := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: k.ns, Name: name, Annotations: map[string]string{"keep": "me"}},
		Data:       map[string]string{"by": "m", "extra": "keep me"},
	}
	require.NoError(t, k.client(t, staticHolder{s.m}).Create(ctx, obj))
	obj.Data["by"] = "b"
	require.NoError(t, k.client(t, staticHolder{s.b}, kubeadapter.WithTakeover()).Update(ctx, obj))
	s.wantAnnot = map[string]string{
		token.AnnotationLease:    s.b.Lease,
		token.AnnotationToken:    fmt.Sprint(s.b.Revision),
		token.MarkKey(s.m.Lease): fmt.Sprint(s.m.Revision),
		token.AnnotationEpoch:    fmt.Sprint(s.b.Epoch),
	}
	s.requireFenced(t)
	return s
}

// requireFenced checks that the object still carries b's stamp and m's
// mark, and that the superseded holders of both leases are still refused.
func (s *hopScene) requireFenced(t *testing.T) {
	t.Helper()
	ctx := t.Context()
	cur := s.k.configMap(t, s.name)
	for key, want := range s.wantAnnot {
		require.Equal(t, want, cur.Annotations[key], "protocol annotation %s after the write; annotations %v", key, cur.Annotations)
	}
	for _, stale := range []struct {
		tok  token.Token
		opts []kubeadapter.Option
	}{{s.a, nil}, {s.a, []kubeadapter.Option{kubeadapter.WithTakeover()}}, {s.m0, []kubeadapter.Option{kubeadapter.WithTakeover()}}} {
		late := cur.DeepCopy()
		late.Data["by"] = "late " + stale.tok.String()
		err := s.k.client(t, staticHolder{stale.tok}, stale.opts...).Update(ctx, late)
		require.ErrorIs(t, err, token.ErrStale, "superseded holder %v (takeover %v) was not refused: %v", stale.tok, len(stale.opts) > 0, err)
	}
	after := s.k.configMap(t, s.name)
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
			obj := s.k.configMap(t, s.name)
			err := k.client(t, staticHolder{s.b}).Patch(t.Context(), obj, client.RawPatch(tc.typ, []byte(strings.ReplaceAll(tc.patch, "{ns}", k.ns))))
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
