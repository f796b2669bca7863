package kubeadapter_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/fencer-dev/fencer/kubeadapter"
	"github.com/fencer-dev/fencer/kubeadapter/deploy"
	"github.com/fencer-dev/fencer/kubeadapter/internal/kubetest"
	"github.com/fencer-dev/fencer/kubeadapter/kubefencertest"
)

// Labels of the namespaces that BenchmarkPolicyCost binds each policy to.
const (
	policyBenchLabel    = "fencer-bench/policy"
	liveLeaseBenchLabel = "fencer-bench/live-lease"
)

// policyBenchObjects is how many ConfigMaps each arm of BenchmarkPolicyCost
// updates round robin.
const policyBenchObjects = 8

// BenchmarkPolicyCost measures what the admission policies cost a plain
// update, on an API server of its own. It installs deploy/admission/
// policy.yaml bound to namespaces labelled policyBenchLabel, and
// deploy/admission/live-lease.yaml bound to namespaces labelled
// liveLeaseBenchLabel, and interleaves, in a rotating order, client.Update
// of fenced ConfigMaps (stamped by a holder of a Lease in their namespace,
// each update carrying the resourceVersion of the last) in three
// namespaces:
//
//   - plain: no binding matches;
//   - policy: policy.yaml is evaluated;
//   - live-lease: policy.yaml and the live-Lease check are evaluated, with
//     the one labelled Lease of the namespace as parameter.
//
// Time per update of each arm and the ratios policy/plain and
// live-lease/plain are reported.
func BenchmarkPolicyCost(b *testing.B) {
	k := kubetest.NewKube(b, kubefencertest.APIServerForTest(b))
	ctx := context.Background()
	arms := []struct {
		ns     string
		labels map[string]string
		objs   []*corev1.ConfigMap
		d      time.Duration
	}{
		{ns: "plain"},
		{ns: "policy", labels: map[string]string{policyBenchLabel: "on"}},
		{ns: "live-lease", labels: map[string]string{policyBenchLabel: "on", liveLeaseBenchLabel: "on"}},
	}
	for a := range arms {
		arm := &arms[a]
		_, err := k.CS.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: arm.ns, Labels: arm.labels}}, metav1.CreateOptions{})
		require.NoError(b, err)
		e, err := kubeadapter.NewElector(k.CS.CoordinationV1(), kubeadapter.DefaultConfig(arm.ns, "fence", "bench"))
		require.NoError(b, err)
		h, err := e.TryAcquire(ctx)
		require.NoError(b, err)
		defer h.Release(ctx)
		fenced := k.Client(b, h)
		for i := range policyBenchObjects {
			o := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: arm.ns, Name: "bench-" + strconv.Itoa(i)}, Data: map[string]string{"n": "0"}}
			require.NoError(b, fenced.Create(ctx, o))
			arm.objs = append(arm.objs, o)
		}
	}
	installBoundPolicy(b, k, deploy.Policy, policyBenchLabel)
	installBoundPolicy(b, k, deploy.LiveLease, liveLeaseBenchLabel)
	waitEnforced(b, k, arms[1].objs[0], "fencer.dev/token", "1")
	epoch, err := strconv.ParseUint(arms[2].objs[0].Annotations["fencer.dev/epoch"], 10, 64)
	require.NoError(b, err)
	waitEnforced(b, k, arms[2].objs[0], "fencer.dev/epoch", strconv.FormatUint(epoch+1, 10))

	for i := 0; b.Loop(); i++ {
		for j := range arms {
			arm := &arms[(i+j)%len(arms)]
			obj := arm.objs[i%policyBenchObjects]
			obj.Data["n"] = strconv.Itoa(i)
			start := time.Now()
			if err := k.CRC.Update(ctx, obj); err != nil {
				b.Fatal(err)
			}
			arm.d += time.Since(start)
		}
	}
	n := float64(b.N)
	plain := arms[0].d
	b.ReportMetric(float64(plain.Nanoseconds())/n, "plain-ns/update")
	for _, arm := range arms[1:] {
		b.ReportMetric(float64(arm.d.Nanoseconds())/n, arm.ns+"-ns/update")
		b.ReportMetric(float64(arm.d)/float64(plain), arm.ns+"/plain")
	}
}

// installBoundPolicy creates the policy and binding of the repository file
// path, with the binding's matchResources replaced by a namespaceSelector
// on label = "on".
func installBoundPolicy(b *testing.B, k *kube, path, label string) {
	b.Helper()
	ctx := context.Background()
	data, err := deploy.FS.ReadFile(path)
	require.NoError(b, err)
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return
		}
		require.NoError(b, err)
		var meta metav1.TypeMeta
		require.NoError(b, yaml.Unmarshal(doc, &meta))
		switch meta.Kind {
		case "ValidatingAdmissionPolicy":
			var p admissionv1.ValidatingAdmissionPolicy
			require.NoError(b, yaml.UnmarshalStrict(doc, &p))
			_, err = k.CS.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, &p, metav1.CreateOptions{})
		case "ValidatingAdmissionPolicyBinding":
			var pb admissionv1.ValidatingAdmissionPolicyBinding
			require.NoError(b, yaml.UnmarshalStrict(doc, &pb))
			pb.Spec.MatchResources = &admissionv1.MatchResources{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{label: "on"}}}
			_, err = k.CS.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(ctx, &pb, metav1.CreateOptions{})
		default:
			b.Fatalf("%s: unexpected kind %q", path, meta.Kind)
		}
		require.NoError(b, err, path)
	}
}

// waitEnforced waits until the API server admits a dry-run update of obj
// unchanged and denies one with annotation key set to value: the policy
// that forbids the second is enforced, and its parameters, if any, are in
// the API server's cache (kubefencertest.WaitEnforced).
func waitEnforced(b *testing.B, k *kube, obj *corev1.ConfigMap, key, value string) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	bad := obj.DeepCopy()
	bad.Annotations[key] = value
	require.NoError(b, kubefencertest.WaitEnforced(ctx, k.Env.Admin(), bad, "", obj))
}
