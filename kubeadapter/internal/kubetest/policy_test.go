package kubetest_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/fencer-dev/fencer/kubeadapter/kubefencertest"
	"github.com/fencer-dev/fencer/token"
)

const (
	leaseKey = "fencer.dev/lease"
	tokenKey = "fencer.dev/token"
	epochKey = "fencer.dev/epoch"
	fence    = kubefencertest.LimitedNamespace + "/fence"
	other    = kubefencertest.LimitedNamespace + "/other"
)

// TestAdmissionPolicy installs deploy/admission/policy.yaml and checks what
// it lets through, writing as the Limited user: the policy binds every
// writer, not only fencer's library.
func TestAdmissionPolicy(t *testing.T) {
	env := kubefencertest.APIServerForTest(t)
	ctx := t.Context()
	installPolicy(t, env)
	cms := clientset(t, env.Limited()).CoreV1().ConfigMaps(kubefencertest.LimitedNamespace)

	_, err := cms.Create(ctx, configMap("guarded", fenced(fence, "10")), metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = cms.Create(ctx, configMap("unguarded", nil), metav1.CreateOptions{})
	require.NoError(t, err)

	// The cases run in order, on one object: an allowed update changes the
	// state that later cases start from.
	for _, tc := range []struct {
		name        string
		object      string
		annotations map[string]string // the update's annotations; nil removes them all
		wantReason  metav1.StatusReason
		wantMessage string
	}{
		{name: "greater token", object: "guarded", annotations: fenced(fence, "11")},
		{name: "smaller token", object: "guarded", annotations: fenced(fence, "10"),
			wantReason: metav1.StatusReasonForbidden, wantMessage: "stale fencing token"},
		{name: "same token", object: "guarded", annotations: fenced(fence, "11")},
		{name: "numerically greater, lexically smaller", object: "guarded", annotations: fenced(fence, "100")},
		{name: "numerically smaller, lexically greater", object: "guarded", annotations: fenced(fence, "99"),
			wantReason: metav1.StatusReasonForbidden, wantMessage: "stale fencing token"},
		{name: "remove token", object: "guarded", annotations: map[string]string{leaseKey: fence},
			wantReason: metav1.StatusReasonForbidden, wantMessage: "must not be removed"},
		{name: "remove lease", object: "guarded", annotations: map[string]string{tokenKey: "200"},
			wantReason: metav1.StatusReasonForbidden, wantMessage: "must not be removed"},
		{name: "remove all annotations", object: "guarded", annotations: nil,
			wantReason: metav1.StatusReasonForbidden, wantMessage: "must not be removed"},
		{name: "malformed token", object: "guarded", annotations: fenced(fence, "12abc"),
			wantReason: metav1.StatusReasonInvalid, wantMessage: "malformed fencer stamp"},
		{name: "leading zero", object: "guarded", annotations: fenced(fence, "0100"),
			wantReason: metav1.StatusReasonInvalid, wantMessage: "malformed fencer stamp"},
		{name: "negative token", object: "guarded", annotations: fenced(fence, "-1"),
			wantReason: metav1.StatusReasonInvalid, wantMessage: "malformed fencer stamp"},
		{name: "token overflowing int64", object: "guarded", annotations: fenced(fence, "99999999999999999999"),
			wantReason: metav1.StatusReasonInvalid, wantMessage: "malformed fencer stamp"},
		{name: "empty token", object: "guarded", annotations: fenced(fence, ""),
			wantReason: metav1.StatusReasonInvalid, wantMessage: "malformed fencer stamp"},
		{name: "malformed epoch", object: "guarded", annotations: withKey(fenced(fence, "100"), epochKey, "07"),
			wantReason: metav1.StatusReasonInvalid, wantMessage: "malformed fencer stamp"},
		{name: "takeover dropping the old lease's token", object: "guarded", annotations: fenced(other, "1"),
			wantReason: metav1.StatusReasonForbidden, wantMessage: "must keep its token 100 as annotation " + token.MarkKey(fence)},
		{name: "takeover lowering the old lease's token", object: "guarded", annotations: withKey(fenced(other, "1"), token.MarkKey(fence), "99"),
			wantReason: metav1.StatusReasonForbidden, wantMessage: "must keep its token 100"},
		{name: "takeover keeping the old lease's token", object: "guarded", annotations: withKey(fenced(other, "1"), token.MarkKey(fence), "100")},
		{name: "same token after takeover", object: "guarded", annotations: withKey(fenced(other, "1"), token.MarkKey(fence), "100")},
		{name: "hop back with an old token", object: "guarded", annotations: withKey(withKey(fenced(fence, "1"), token.MarkKey(fence), "100"), token.MarkKey(other), "1"),
			wantReason: metav1.StatusReasonForbidden, wantMessage: "stale fencing token 1 for lease " + fence},
		{name: "hop back dropping the mark", object: "guarded", annotations: withKey(fenced(fence, "1"), token.MarkKey(other), "1"),
			wantReason: metav1.StatusReasonForbidden, wantMessage: "must not be removed or lowered"},
		{name: "hop back with the newest token", object: "guarded", annotations: withKey(withKey(fenced(fence, "100"), token.MarkKey(fence), "100"), token.MarkKey(other), "1")},
		{name: "mark of the lease taken over is kept", object: "guarded", annotations: withKey(fenced(fence, "101"), token.MarkKey(fence), "101"),
			wantReason: metav1.StatusReasonForbidden, wantMessage: "must not be removed or lowered"},
		{name: "unfenced object", object: "unguarded", annotations: map[string]string{"team": "a"}},
		{name: "unfenced object gains a malformed token", object: "unguarded", annotations: fenced(fence, "x"),
			wantReason: metav1.StatusReasonInvalid, wantMessage: "malformed fencer stamp"},
		{name: "unfenced object gains a malformed mark", object: "unguarded", annotations: map[string]string{token.MarkKey(fence): "x"},
			wantReason: metav1.StatusReasonInvalid, wantMessage: "malformed fencer mark"},
		{name: "unfenced object gains a stamp", object: "unguarded", annotations: fenced(fence, "1")},
		{name: "stale after stamping", object: "unguarded", annotations: fenced(fence, "0"),
			wantReason: metav1.StatusReasonInvalid, wantMessage: "malformed fencer stamp"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cm, err := cms.Get(ctx, tc.object, metav1.GetOptions{})
			require.NoError(t, err)
			cm.Annotations = tc.annotations
			cm.Data["touched"] = tc.name
			_, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
			if tc.wantReason == "" {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			require.Equal(t, tc.wantReason, apierrors.ReasonForError(err), "error: %v", err)
			require.ErrorContains(t, err, tc.wantMessage)
		})
	}
}

// installPolicy installs the shipped policy and waits until it is
// enforced.
func installPolicy(t *testing.T, env *kubefencertest.APIServer) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	start := time.Now()
	require.NoError(t, kubefencertest.InstallPolicy(ctx, env.Admin()))
	t.Logf("policy enforced after %v", time.Since(start).Round(time.Millisecond))
}

// withKey returns ann with key set to value.
func withKey(ann map[string]string, key, value string) map[string]string {
	ann[key] = value
	return ann
}

func fenced(lease, token string) map[string]string {
	return map[string]string{leaseKey: lease, tokenKey: token}
}
