package kubefencertest

import (
	"context"
	"fmt"
	"strings"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/fencer-dev/fencer/kubeadapter/deploy"
)

// WaitEnforced returns once the API server enforces a validating
// admission policy just created: policies, and the parameters they read,
// reach admission through informers a moment after they are written. It
// retries dry-run updates, which change nothing, until the update of
// denied is refused as Forbidden with reason in its message (any Forbidden
// when reason is "") and the update of each of admitted is accepted (so
// that a policy that denies too much is not taken as enforced), and
// returns an error if that has not happened when ctx ends. Each object is
// sent as it is, resourceVersion included, as cfg's user.
func WaitEnforced(ctx context.Context, cfg *rest.Config, denied *corev1.ConfigMap, reason string, admitted ...*corev1.ConfigMap) error {
	cs, closeIdle, err := clientset(cfg)
	if err != nil {
		return err
	}
	defer closeIdle()
	return waitDenied(ctx, cs, denied, reason, admitted...)
}

func waitDenied(ctx context.Context, cs kubernetes.Interface, denied *corev1.ConfigMap, reason string, admitted ...*corev1.ConfigMap) error {
	dry := metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}}
	return poll(ctx, fmt.Sprintf("policy not enforced on %s/%s", denied.Namespace, denied.Name), func() (bool, error) {
		for _, a := range admitted {
			if _, err := cs.CoreV1().ConfigMaps(a.Namespace).Update(ctx, a, dry); err != nil {
				return false, fmt.Errorf("update of %s/%s refused: %w", a.Namespace, a.Name, err)
			}
		}
		_, err := cs.CoreV1().ConfigMaps(denied.Namespace).Update(ctx, denied, dry)
		return apierrors.IsForbidden(err) && strings.Contains(err.Error(), reason), err
	})
}

// LiveLeasePolicy is the name of the ValidatingAdmissionPolicy, and of its
// binding, in deploy.LiveLease. The API server names it in the message of
// every write it denies.
const LiveLeasePolicy = "fencer.dev-live-lease"

// liveProbe names the Lease and the ConfigMap, in ProbeNamespace, with
// which InstallLiveLeasePolicy probes for enforcement.
const liveProbe = "fencer-live-lease-probe"

// InstallLiveLeasePolicy creates, as cfg's user, the opt-in live-Lease
// policy and binding of deploy.LiveLease, and returns once the API server
// enforces them. It probes with a Lease labelled fencer.dev/fence and a
// ConfigMap stamped with its epoch, both in ProbeNamespace and both
// created before the policy: a dry-run update of the ConfigMap with
// another epoch must be denied by LiveLeasePolicy (WaitEnforced). The
// probe objects are deleted before it returns, so they are not parameters
// of later writes. It returns an error if the objects exist, if the
// manifest holds any kind but a ValidatingAdmissionPolicy or its binding,
// or if the policy is not enforced before ctx ends. It does not install
// deploy.Policy.
func InstallLiveLeasePolicy(ctx context.Context, cfg *rest.Config) (err error) {
	cs, closeIdle, err := clientset(cfg)
	if err != nil {
		return err
	}
	defer closeIdle()
	probe, err := createLiveProbe(ctx, cs)
	defer func() {
		if derr := deleteLiveProbe(context.WithoutCancel(ctx), cs); derr != nil && err == nil {
			err = derr
		}
	}()
	if err != nil {
		return err
	}
	if err := createPolicies(ctx, cs, deploy.LiveLease); err != nil {
		return err
	}
	stale := probe.DeepCopy()
	stale.Annotations["fencer.dev/epoch"] = "0"
	return waitDenied(ctx, cs, stale, LiveLeasePolicy)
}

// createLiveProbe creates the probe Lease, at leaseTransitions 1, and the
// probe ConfigMap stamped with its epoch.
func createLiveProbe(ctx context.Context, cs kubernetes.Interface) (*corev1.ConfigMap, error) {
	transitions := int32(1)
	_, err := cs.CoordinationV1().Leases(ProbeNamespace).Create(ctx, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: liveProbe, Labels: map[string]string{"fencer.dev/fence": "true"}},
		Spec:       coordinationv1.LeaseSpec{LeaseTransitions: &transitions},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("kubefencertest: live-Lease probe: %w", err)
	}
	probe, err := cs.CoreV1().ConfigMaps(ProbeNamespace).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
		Name: liveProbe,
		Annotations: map[string]string{
			"fencer.dev/lease": ProbeNamespace + "/" + liveProbe, "fencer.dev/token": "1", "fencer.dev/epoch": "1",
		},
	}}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("kubefencertest: live-Lease probe: %w", err)
	}
	return probe, nil
}

// deleteLiveProbe deletes the probe objects that exist.
func deleteLiveProbe(ctx context.Context, cs kubernetes.Interface) error {
	err := cs.CoreV1().ConfigMaps(ProbeNamespace).Delete(ctx, liveProbe, metav1.DeleteOptions{})
	if err == nil || apierrors.IsNotFound(err) {
		err = cs.CoordinationV1().Leases(ProbeNamespace).Delete(ctx, liveProbe, metav1.DeleteOptions{})
	}
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("kubefencertest: delete live-Lease probe: %w", err)
	}
	return nil
}
