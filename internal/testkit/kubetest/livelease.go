package kubetest

import (
	"context"
	"fmt"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/fencer-dev/fencer/deploy"
	"github.com/fencer-dev/fencer/fencertest/kubefencertest"
)

// LiveLeasePath is the opt-in live-Lease admission policy fencer ships,
// relative to the repository root (deploy.LiveLease in package deploy).
const LiveLeasePath = "deploy/admission/live-lease.yaml"

// LiveLeasePolicy is the name of the ValidatingAdmissionPolicy, and of its
// binding, in LiveLeasePath. The API server names it in the message of
// every write it denies.
const LiveLeasePolicy = "fencer.dev-live-lease"

// liveProbe names the Lease and the ConfigMap, in Namespace, with which
// InstallLiveLeasePolicy probes for enforcement.
const liveProbe = "live-lease-probe"

// InstallLiveLeasePolicy creates the objects of the repository's
// LiveLeasePath as the admin and returns once the API server enforces them.
// It probes with a Lease labelled fencer.dev/fence and a ConfigMap stamped
// with its epoch, both in Namespace and both created before the policy: a
// dry-run update of the ConfigMap with another epoch must be denied by
// LiveLeasePolicy. The probe objects are deleted before it returns, so they
// are not parameters of later writes. It returns an error if the file holds
// any kind but a ValidatingAdmissionPolicy or its binding, or if the policy
// is not enforced before ctx ends. It does not install PolicyPath.
func (e *Env) InstallLiveLeasePolicy(ctx context.Context) (err error) {
	admin, err := kubernetes.NewForConfig(e.Admin())
	if err != nil {
		return fmt.Errorf("kubetest: admin client: %w", err)
	}
	probe, err := createLiveProbe(ctx, admin)
	defer func() {
		if derr := deleteLiveProbe(ctx, admin); derr != nil && err == nil {
			err = derr
		}
	}()
	if err != nil {
		return err
	}
	if err := kubefencertest.CreatePolicies(ctx, e.Admin(), deploy.LiveLease); err != nil {
		return err
	}
	return waitLiveEnforced(ctx, admin, probe)
}

// createLiveProbe creates the probe Lease, at leaseTransitions 1, and the
// probe ConfigMap stamped with its epoch.
func createLiveProbe(ctx context.Context, admin *kubernetes.Clientset) (*corev1.ConfigMap, error) {
	transitions := int32(1)
	_, err := admin.CoordinationV1().Leases(Namespace).Create(ctx, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: liveProbe, Labels: map[string]string{"fencer.dev/fence": "true"}},
		Spec:       coordinationv1.LeaseSpec{LeaseTransitions: &transitions},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("kubetest: live-Lease probe: %w", err)
	}
	probe, err := admin.CoreV1().ConfigMaps(Namespace).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
		Name: liveProbe,
		Annotations: map[string]string{
			"fencer.dev/lease": Namespace + "/" + liveProbe, "fencer.dev/token": "1", "fencer.dev/epoch": "1",
		},
	}}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("kubetest: live-Lease probe: %w", err)
	}
	return probe, nil
}

// deleteLiveProbe deletes the probe objects that exist.
func deleteLiveProbe(ctx context.Context, admin *kubernetes.Clientset) error {
	err := admin.CoreV1().ConfigMaps(Namespace).Delete(ctx, liveProbe, metav1.DeleteOptions{})
	if err == nil || apierrors.IsNotFound(err) {
		err = admin.CoordinationV1().Leases(Namespace).Delete(ctx, liveProbe, metav1.DeleteOptions{})
	}
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("kubetest: delete live-Lease probe: %w", err)
	}
	return nil
}

// waitLiveEnforced retries a dry-run update of probe with a superseded
// epoch until LiveLeasePolicy denies it or ctx ends.
func waitLiveEnforced(ctx context.Context, admin *kubernetes.Clientset, probe *corev1.ConfigMap) error {
	stale := probe.DeepCopy()
	stale.Annotations["fencer.dev/epoch"] = "0"
	for {
		_, err := admin.CoreV1().ConfigMaps(Namespace).Update(ctx, stale, metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}})
		if apierrors.IsForbidden(err) && strings.Contains(err.Error(), LiveLeasePolicy) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kubetest: live-Lease policy not enforced: last dry-run update: %v: %w", err, ctx.Err())
		case <-time.After(pollInterval):
		}
	}
}
