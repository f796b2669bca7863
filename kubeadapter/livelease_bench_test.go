package kubeadapter_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/fencer-dev/fencer/kubeadapter"
	"github.com/fencer-dev/fencer/kubeadapter/internal/kubetest"
	"github.com/fencer-dev/fencer/kubeadapter/kubefencertest"
)

// liveLagWait bounds how long BenchmarkLiveLeaseLag waits for one refusal.
const liveLagWait = 10 * time.Second

// BenchmarkLiveLeaseLag measures how promptly the live-Lease policy
// refuses a superseded holder. Each iteration releases the Lease and
// acquires it again with an Elector, so that leaseTransitions moves by one,
// then sends dry-run updates of an object stamped with the previous epoch,
// back to back, until the API server refuses one. The lag runs from the
// return of the acquiring write to the return of the first refused update;
// it is reported as p50, p99 and max, with the stale updates admitted in
// the meantime and the mean time of one dry-run update, which bounds the
// resolution. The object is then stamped with the new epoch.
func BenchmarkLiveLeaseLag(b *testing.B) {
	k := kubetest.LiveKube(b)
	k.InstallLiveLease(b)
	ctx := context.Background()
	e := k.Elector(b, "lag")
	h, err := e.TryAcquire(ctx)
	require.NoError(b, err)
	cms := k.CS.CoreV1().ConfigMaps(k.NS)
	o, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "o", Annotations: h.Token().Stamp(nil)}}, metav1.CreateOptions{})
	require.NoError(b, err)

	dry := metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}}
	var lags, admitted []float64
	var polls int
	var pollTime time.Duration
	for b.Loop() {
		require.NoError(b, h.Release(ctx))
		h, err = e.TryAcquire(ctx)
		require.NoError(b, err)
		acquired := time.Now()
		for n := 0; ; n++ {
			start := time.Now()
			_, err := cms.Update(ctx, o, dry)
			pollTime += time.Since(start)
			polls++
			if apierrors.IsForbidden(err) {
				lags = append(lags, ms(time.Since(acquired)))
				admitted = append(admitted, float64(n))
				break
			}
			require.NoError(b, err)
			if time.Since(acquired) > liveLagWait {
				b.Fatalf("stale update still admitted %v after the acquisition", liveLagWait)
			}
		}
		o.Annotations = h.Token().Stamp(o.Annotations)
		o, err = cms.Update(ctx, o, metav1.UpdateOptions{})
		require.NoError(b, err)
	}
	require.NoError(b, h.Release(ctx))
	b.ReportMetric(percentile(lags, 50), "lag-p50-ms")
	b.ReportMetric(percentile(lags, 99), "lag-p99-ms")
	b.ReportMetric(slices.Max(lags), "lag-max-ms")
	b.ReportMetric(percentile(admitted, 50), "admitted-p50")
	b.ReportMetric(slices.Max(admitted), "admitted-max")
	b.ReportMetric(ms(pollTime)/float64(polls), "poll-ms")
}

// liveUnbound is the namespace that BenchmarkLiveLeaseUpdate and
// BenchmarkLiveLeaseBindingPerLease keep out of the live-Lease policy's
// matchConstraints: its updates are the plain baseline, run on the same API
// server as the policy's, and no policy or binding work is done for them.
const liveUnbound = "unbound"

// liveTimeout bounds the setup of a live-Lease benchmark, including the
// creation of 10,000 Leases or bindings.
const liveTimeout = 5 * time.Minute

// BenchmarkLiveLeaseUpdate measures the cost of the live-Lease policy, as
// shipped but for liveUnbound left out of its matchConstraints, per UPDATE of a ConfigMap in a namespace holding 1, 100 or
// 10,000 labelled Leases. Three updates are interleaved on the same API
// server: plain (an object in liveUnbound, which the policy does not
// match), unstamped (the binding collects every labelled Lease of the
// namespace, and the matchConditions skip the object once per Lease) and
// stamped (the policy is evaluated once per Lease, and passes). The ratios
// to plain are reported. 10,000 Leases take a while to create, which is
// why this is a benchmark and not a test.
func BenchmarkLiveLeaseUpdate(b *testing.B) {
	k, plain := liveBench(b)
	for _, n := range []int{1, 100, 10000} {
		b.Run("leases="+strconv.Itoa(n), func(b *testing.B) {
			ns := fmt.Sprintf("leases-%d", n)
			createLabelledLeases(b, k, ns, n)
			unstamped := liveObject(b, k, ns, "")
			stamped := liveObject(b, k, ns, ns+"/lease-"+strconv.Itoa(n-1))
			waitLiveDenial(b, k, stamped)
			t := updateArms(b, k, plain, unstamped, stamped)
			reportArms(b, t[0], map[string]time.Duration{"unstamped": t[1], "stamped": t[2]})
		})
	}
}

// BenchmarkLiveLeaseBindingPerLease measures the alternative to the
// shipped selector binding: one binding per Lease, with paramRef.name and
// an objectSelector on a label (fencer.dev/fence-lease) that the writer
// would have to stamp. With 100, 1,000 and 10,000 Leases, each with its
// binding, it interleaves plain updates (liveUnbound), updates of a stamped
// object without the label (every binding's objectSelector is checked,
// none matches, nothing is evaluated) and of a stamped, labelled object
// (one binding matches, one evaluation), and reports the ratios to plain.
func BenchmarkLiveLeaseBindingPerLease(b *testing.B) {
	k, plain := liveBench(b)
	ctx, cancel := context.WithTimeout(context.Background(), liveTimeout)
	defer cancel()
	bindings := k.CS.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings()
	require.NoError(b, bindings.Delete(ctx, kubefencertest.LiveLeasePolicy, metav1.DeleteOptions{}))

	created := 0
	for _, n := range []int{100, 1000, 10000} {
		b.Run("leases="+strconv.Itoa(n), func(b *testing.B) {
			ns := fmt.Sprintf("leases-%d", n)
			createLabelledLeases(b, k, ns, n)
			start := time.Now()
			allow := admissionv1.AllowAction
			inParallel(b, created, n, func(i int) error {
				name := "lease-" + strconv.Itoa(i)
				_, err := bindings.Create(ctx, &admissionv1.ValidatingAdmissionPolicyBinding{
					ObjectMeta: metav1.ObjectMeta{Name: kubefencertest.LiveLeasePolicy + "-" + name},
					Spec: admissionv1.ValidatingAdmissionPolicyBindingSpec{
						PolicyName:        kubefencertest.LiveLeasePolicy,
						ValidationActions: []admissionv1.ValidationAction{admissionv1.Deny},
						ParamRef:          &admissionv1.ParamRef{Name: name, ParameterNotFoundAction: &allow},
						MatchResources: &admissionv1.MatchResources{
							ObjectSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"fencer.dev/fence-lease": name}},
						},
					},
				}, metav1.CreateOptions{})
				return err
			})
			b.Logf("bindings %d to %d created in %v", created, n-1, time.Since(start).Round(time.Millisecond))
			created = max(created, n)
			last := "lease-" + strconv.Itoa(n-1)
			unlabelled := liveObject(b, k, ns, ns+"/"+last)
			stamped := liveObject(b, k, ns, ns+"/"+last)
			stamped.Labels = map[string]string{"fencer.dev/fence-lease": last}
			stamped, err := k.CS.CoreV1().ConfigMaps(ns).Update(ctx, stamped, metav1.UpdateOptions{})
			require.NoError(b, err)
			waitLiveDenial(b, k, stamped)
			t := updateArms(b, k, plain, unlabelled, stamped)
			reportArms(b, t[0], map[string]time.Duration{"unlabelled": t[1], "stamped": t[2]})
		})
	}
}

// liveBench starts an API server with the live-Lease policy installed,
// keeps liveUnbound out of the policy's matchConstraints, and returns the
// plain baseline's object there.
func liveBench(b *testing.B) (*kube, *corev1.ConfigMap) {
	b.Helper()
	k := kubetest.LiveKube(b)
	k.InstallLiveLease(b)
	ctx := context.Background()
	policies := k.CS.AdmissionregistrationV1().ValidatingAdmissionPolicies()
	p, err := policies.Get(ctx, kubefencertest.LiveLeasePolicy, metav1.GetOptions{})
	require.NoError(b, err)
	p.Spec.MatchConstraints.NamespaceSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
		{Key: corev1.LabelMetadataName, Operator: metav1.LabelSelectorOpNotIn, Values: []string{liveUnbound}},
	}}
	_, err = policies.Update(ctx, p, metav1.UpdateOptions{})
	require.NoError(b, err)
	createNamespace(b, k, liveUnbound)
	waitUnbound(b, k)
	return k, liveObject(b, k, liveUnbound, liveUnbound+"/lease-0")
}

// createNamespace creates namespace ns and reports whether it did; false
// means it existed already.
func createNamespace(b *testing.B, k *kube, ns string) bool {
	b.Helper()
	_, err := k.CS.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return false
	}
	require.NoError(b, err)
	return true
}

// createLabelledLeases creates namespace ns and Leases lease-0 to
// lease-(n-1) in it, labelled as an Elector labels them and at
// leaseTransitions 1, eight at a time. It does nothing when ns exists,
// which it takes for an earlier run's.
func createLabelledLeases(b *testing.B, k *kube, ns string, n int) {
	b.Helper()
	if !createNamespace(b, k, ns) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), liveTimeout)
	defer cancel()
	start := time.Now()
	leases := k.CS.CoordinationV1().Leases(ns)
	one := int32(1)
	inParallel(b, 0, n, func(i int) error {
		_, err := leases.Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{
				Name:   "lease-" + strconv.Itoa(i),
				Labels: map[string]string{kubeadapter.FenceLabel: kubeadapter.FenceLabelValue},
			},
			Spec: coordinationv1.LeaseSpec{LeaseTransitions: &one},
		}, metav1.CreateOptions{})
		return err
	})
	b.Logf("%d Leases created in %s in %v", n, ns, time.Since(start).Round(time.Millisecond))
}

// inParallel calls create for each i in [from, to), eight calls at a time,
// and fails b with the first error.
func inParallel(b *testing.B, from, to int, create func(i int) error) {
	b.Helper()
	const workers = 8
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := from + w; i < to && errs[w] == nil; i += workers {
				errs[w] = create(i)
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(b, err)
	}
}

// liveObject creates a ConfigMap in ns, stamped with epoch 1 of lease
// unless lease is empty.
func liveObject(b *testing.B, k *kube, ns, lease string) *corev1.ConfigMap {
	b.Helper()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{GenerateName: "o-", Namespace: ns}, Data: map[string]string{"n": "0"}}
	if lease != "" {
		cm.Annotations = map[string]string{"fencer.dev/lease": lease, "fencer.dev/token": "1", "fencer.dev/epoch": "1"}
	}
	cm, err := k.CS.CoreV1().ConfigMaps(ns).Create(context.Background(), cm, metav1.CreateOptions{})
	require.NoError(b, err)
	return cm
}

// waitUnbound waits until the policy leaves liveUnbound out: a dry-run
// create there, stamped with a superseded epoch of a labelled Lease, must
// pass. The Lease is deleted afterwards.
func waitUnbound(b *testing.B, k *kube) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	one := int32(1)
	_, err := k.CS.CoordinationV1().Leases(liveUnbound).Create(ctx, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "probe", Labels: map[string]string{kubeadapter.FenceLabel: kubeadapter.FenceLabelValue}},
		Spec:       coordinationv1.LeaseSpec{LeaseTransitions: &one},
	}, metav1.CreateOptions{})
	require.NoError(b, err)
	probe := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "probe", Annotations: map[string]string{
		"fencer.dev/lease": liveUnbound + "/probe", "fencer.dev/token": "1", "fencer.dev/epoch": "0",
	}}}
	for {
		_, err := k.CS.CoreV1().ConfigMaps(liveUnbound).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err == nil {
			break
		}
		require.True(b, apierrors.IsForbidden(err), "probe: %v", err)
		select {
		case <-ctx.Done():
			b.Fatalf("policy still matches %s: %v", liveUnbound, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
	require.NoError(b, k.CS.CoordinationV1().Leases(liveUnbound).Delete(ctx, "probe", metav1.DeleteOptions{}))
}

// waitLiveDenial waits until a dry-run update of obj with epoch 0 is
// denied: the bindings that match obj are enforced.
func waitLiveDenial(b *testing.B, k *kube, obj *corev1.ConfigMap) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	stale := obj.DeepCopy()
	stale.Annotations["fencer.dev/epoch"] = "0"
	for {
		_, err := k.CS.CoreV1().ConfigMaps(obj.Namespace).Update(ctx, stale, metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}})
		if apierrors.IsForbidden(err) {
			return
		}
		select {
		case <-ctx.Done():
			b.Fatalf("bindings not enforced on %s/%s: last dry-run update: %v", obj.Namespace, obj.Name, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// updateArms updates the objects in turn, b.N times each, leaving in each
// the object as last written, and returns the time each object's updates
// took in all.
func updateArms(b *testing.B, k *kube, objs ...*corev1.ConfigMap) []time.Duration {
	b.Helper()
	ctx := context.Background()
	times := make([]time.Duration, len(objs))
	for i := 0; b.Loop(); i++ {
		for j, o := range objs {
			o.Data["n"] = strconv.Itoa(i)
			start := time.Now()
			got, err := k.CS.CoreV1().ConfigMaps(o.Namespace).Update(ctx, o, metav1.UpdateOptions{})
			times[j] += time.Since(start)
			if err != nil {
				b.Fatal(err)
			}
			*o = *got
		}
	}
	return times
}

// reportArms reports the time per update of plain and of each arm, and
// each arm's ratio to plain.
func reportArms(b *testing.B, plain time.Duration, arms map[string]time.Duration) {
	n := float64(b.N)
	b.ReportMetric(float64(plain.Nanoseconds())/n, "plain-ns/update")
	for name, d := range arms {
		b.ReportMetric(float64(d.Nanoseconds())/n, name+"-ns/update")
		b.ReportMetric(float64(d)/float64(plain), name+"/plain")
	}
}
