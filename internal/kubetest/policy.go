package kubetest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"
)

// PolicyPath is the admission policy fencer ships, relative to the
// repository root.
const PolicyPath = "deploy/admission/policy.yaml"

// InstallPolicy creates the objects of the repository's PolicyPath as the
// admin and returns once the API server enforces them (policies reach the
// admission plugin through an informer, a moment after they are created),
// probing with a dry-run stale update of a ConfigMap in Namespace. It
// returns an error if the file holds any other kind, or if the policy is
// not enforced before ctx ends.
func (e *Env) InstallPolicy(ctx context.Context) error {
	admin, err := kubernetes.NewForConfig(e.Admin())
	if err != nil {
		return fmt.Errorf("kubetest: admin client: %w", err)
	}
	if err := installFile(ctx, admin, PolicyPath); err != nil {
		return err
	}
	return waitEnforced(ctx, admin)
}

// installFile creates, as admin, the ValidatingAdmissionPolicy and binding
// objects of the repository file path. It returns an error for any other
// kind.
func installFile(ctx context.Context, admin *kubernetes.Clientset, path string) error {
	root, err := repoRoot()
	if err != nil {
		return err
	}
	data, err := os.ReadFile(filepath.Join(root, path))
	if err != nil {
		return fmt.Errorf("kubetest: read %s: %w", path, err)
	}
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("kubetest: read %s: %w", path, err)
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		if err := createPolicyObject(ctx, admin, doc); err != nil {
			return err
		}
	}
}

func createPolicyObject(ctx context.Context, admin *kubernetes.Clientset, doc []byte) error {
	var meta metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &meta); err != nil {
		return fmt.Errorf("kubetest: policy document: %w", err)
	}
	var err error
	switch meta.Kind {
	case "ValidatingAdmissionPolicy":
		var p admissionv1.ValidatingAdmissionPolicy
		if err = yaml.UnmarshalStrict(doc, &p); err == nil {
			_, err = admin.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, &p, metav1.CreateOptions{})
		}
	case "ValidatingAdmissionPolicyBinding":
		var b admissionv1.ValidatingAdmissionPolicyBinding
		if err = yaml.UnmarshalStrict(doc, &b); err == nil {
			_, err = admin.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(ctx, &b, metav1.CreateOptions{})
		}
	default:
		err = fmt.Errorf("unexpected kind %q", meta.Kind)
	}
	if err != nil {
		return fmt.Errorf("kubetest: install %s: %w", meta.Kind, err)
	}
	return nil
}

// waitEnforced retries a dry-run stale update of a probe object until the
// policy denies it or ctx ends.
func waitEnforced(ctx context.Context, admin *kubernetes.Clientset) error {
	cms := admin.CoreV1().ConfigMaps(Namespace)
	probe, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
		Name:        "policy-probe",
		Annotations: map[string]string{"fencer.dev/lease": Namespace + "/probe", "fencer.dev/token": "5"},
	}}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("kubetest: policy probe: %w", err)
	}
	probe.Annotations["fencer.dev/token"] = "4"
	for {
		_, err := cms.Update(ctx, probe, metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}})
		if apierrors.IsForbidden(err) && strings.Contains(err.Error(), "stale fencing token") {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kubetest: policy not enforced: last dry-run update: %v: %w", err, ctx.Err())
		case <-time.After(pollInterval):
		}
	}
}
