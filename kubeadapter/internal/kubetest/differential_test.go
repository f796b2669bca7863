package kubetest_test

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/fencer-dev/fencer/kubeadapter/kubefencertest"
	"github.com/fencer-dev/fencer/token"
)

// TestPolicyDifferential runs one corpus of stamps through package token
// and through the installed admission policy on the real API server, and
// requires identical verdicts:
//   - formats: an object may be created with annotations A exactly when
//     token.CheckStored(A) accepts them;
//   - order: an object stored with S may be updated to a holder's
//     Restamp of S exactly when token.CheckStamp (with takeover) lets the
//     holder write it.
func TestPolicyDifferential(t *testing.T) {
	env := kubefencertest.APIServerForTest(t)
	ctx := t.Context()
	installPolicy(t, env)
	cms := clientset(t, env.Limited()).CoreV1().ConfigMaps(kubefencertest.LimitedNamespace)
	dryRun := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}

	t.Run("formats", func(t *testing.T) {
		for i, ann := range formatCorpus() {
			lib := token.CheckStored(ann)
			_, err := cms.Create(ctx, configMap("format-"+strconv.Itoa(i), ann), dryRun)
			if err != nil && !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) {
				t.Fatalf("%v: unexpected error %v", ann, err)
			}
			require.Equal(t, lib == nil, err == nil, "annotations %v:\n  token.CheckStored: %v\n  policy: %v", ann, lib, err)
		}
	})

	t.Run("order", func(t *testing.T) {
		for i, tc := range orderCorpus() {
			require.NoError(t, token.CheckStored(tc.stored), "corpus entry %d stores a valid stamp", i)
			cm, err := cms.Create(ctx, configMap("order-"+strconv.Itoa(i), tc.stored), metav1.CreateOptions{})
			require.NoError(t, err)
			lib := token.CheckStamp(tc.held, tc.stored, true)
			cm.Annotations = tc.held.Restamp(cm.Annotations, cm.Annotations)
			_, err = cms.Update(ctx, cm, metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}})
			if err != nil && !apierrors.IsForbidden(err) {
				t.Fatalf("%d: unexpected error %v", i, err)
			}
			require.Equal(t, lib == nil, err == nil, "stored %v, held %v:\n  token.CheckStamp: %v\n  policy: %v", tc.stored, tc.held, lib, err)
		}
	})
}

// formatCorpus returns annotation maps, valid and not, covering each
// format the protocol defines.
func formatCorpus() []map[string]string {
	const lease = kubefencertest.LimitedNamespace + "/fence"
	var out []map[string]string
	stamp := func(lease, rev string) map[string]string {
		return map[string]string{token.AnnotationLease: lease, token.AnnotationToken: rev}
	}
	for _, rev := range []string{
		"1", "42", "0", "00", "01", "007", "+1", "-1", "-0", " 1", "1 ", "1 2", "1.0", "1e3", "0x10", "１",
		"", "a", strings.Repeat("9", 18), "1" + strings.Repeat("0", 17), strings.Repeat("9", 19),
		"9223372036854775807", "9223372036854775808", "9223372036854775806", "1" + strings.Repeat("0", 18),
		strings.Repeat("1", 20), strings.Repeat("1", 25), strings.Repeat("9", 30),
	} {
		out = append(out, stamp(lease, rev))
	}
	for _, l := range []string{
		"", "fence", "/fence", kubefencertest.LimitedNamespace + "/", "a/b/c", "A/b", "a/B", "a/b.c", "a/b..c", "a/.b", "a/b-",
		"a/-b", "a-/b", "a.b/c", "a_b/c", "a/b_c", " a/b", "a/b ", "a/é", strings.Repeat("n", 63) + "/x",
		strings.Repeat("n", 64) + "/x", "a/" + strings.Repeat("x", token.MaxKubeLeaseLen-2),
		"a/" + strings.Repeat("x", token.MaxKubeLeaseLen-1), "a/" + strings.Repeat("x.", 60) + "x",
	} {
		out = append(out, stamp(l, "5"))
	}
	for _, epoch := range []string{
		"0", "1", "00", "01", "-1", "+1", "", " 1", "18446744073709551615", "18446744073709551616",
		"99999999999999999999", strings.Repeat("1", 21), "1e3",
	} {
		ann := stamp(lease, "5")
		ann[token.AnnotationEpoch] = epoch
		out = append(out, ann)
	}
	out = append(out,
		map[string]string{token.AnnotationLease: lease},
		map[string]string{token.AnnotationToken: "5"},
		map[string]string{token.AnnotationEpoch: "1"},
		map[string]string{token.AnnotationEpoch: "x"},
		map[string]string{"unrelated": "x"},
	)
	for _, mark := range []struct{ key, value string }{
		{token.MarkKey(lease), "5"},
		{token.MarkKey(lease), "6"},
		{token.MarkKey(lease), "4"},
		{token.MarkKey("other/fence"), "100"},
		{token.MarkKey("other/fence"), "0"},
		{token.MarkKey("other/fence"), "0100"},
		{token.MarkKey("other/fence"), "9223372036854775808"},
		{token.MarkKey("other/fence"), ""},
		{"nodot" + token.MarkSuffix, "1"},
		{"Up.per" + token.MarkSuffix, "1"},
		{"a..b" + token.MarkSuffix, "1"},
		{strings.Repeat("n", 64) + ".x" + token.MarkSuffix, "1"},
		{token.MarkKey("a/" + strings.Repeat("x", token.MaxKubeLeaseLen-2)), "1"},
	} {
		ann := stamp(lease, "5")
		ann[mark.key] = mark.value
		out = append(out, ann, map[string]string{mark.key: mark.value})
	}
	return out
}

type orderCase struct {
	stored map[string]string
	held   token.Token
}

// orderCorpus returns stored stamps and holders' tokens: same lease below,
// at and above; takeovers from and back to a lease, with marks below, at
// and above the holder.
func orderCorpus() []orderCase {
	const (
		l = kubefencertest.LimitedNamespace + "/l"
		m = kubefencertest.LimitedNamespace + "/m"
	)
	tok := func(lease string, rev int64) token.Token { return token.Token{Lease: lease, Epoch: 3, Revision: rev} }
	var out []orderCase
	for _, held := range []int64{1, 99, 100, 101, 1 << 40, 1<<63 - 1} {
		out = append(out,
			orderCase{tok(l, 100).Stamp(nil), tok(l, held)},
			orderCase{tok(m, 100).Stamp(nil), tok(l, held)},
			orderCase{tok(m, 5).Stamp(tok(l, 100).Stamp(nil)), tok(l, held)},
			orderCase{tok(l, 200).Stamp(tok(m, 5).Stamp(tok(l, 100).Stamp(nil))), tok(m, held)},
			orderCase{map[string]string{"x": "y"}, tok(l, held)},
		)
	}
	big := tok(l, 1<<62).Stamp(nil)
	out = append(out, orderCase{big, tok(l, 1<<62-1)}, orderCase{big, tok(l, 1<<62)})
	for i := range out {
		out[i].stored["case"] = fmt.Sprint(i)
	}
	return out
}
