package kubefencertest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/fencer-dev/fencer/internal/mutant"
	"github.com/fencer-dev/fencer/kubeadapter/deploy"
)

// ErrManifest reports a manifest of package deploy that holds an object
// this package does not install.
var ErrManifest = errors.New("kubefencertest: unexpected object in manifest")

// pollInterval is how often the kit probes while it waits: for etcd and the
// API server to start, and for what the installers created to be in effect.
const pollInterval = 50 * time.Millisecond

// ProbeNamespace is the namespace in which InstallPolicy creates, and then
// deletes, the ConfigMap it probes the policy with. Every API server has it.
const ProbeNamespace = "default"

// probeName names InstallPolicy's probe ConfigMap.
const probeName = "fencer-policy-probe"

// InstallPolicy creates, as cfg's user, the ValidatingAdmissionPolicy and
// binding of deploy.Policy, fencer's store-side fencing check, and returns
// once the API server enforces them: policies reach admission through an
// informer, a moment after they are created, so it retries a dry-run stale
// update of a probe ConfigMap in ProbeNamespace until it is denied, and
// deletes the probe. It returns an error if the policy already exists, if
// cfg's user may not create it, or if it is not enforced before ctx ends.
//
// cfg is any API server's: envtest's (controller-runtime's
// envtest.Environment.Config) or a cluster's. Installing the policy there
// affects every fenced object in it.
func InstallPolicy(ctx context.Context, cfg *rest.Config) error {
	cs, closeIdle, err := clientset(cfg)
	if err != nil {
		return err
	}
	defer closeIdle()
	if err := createPolicies(ctx, cs, deploy.Policy); err != nil {
		return err
	}
	return waitEnforced(ctx, cs)
}

// CreatePolicies creates, as cfg's user, the ValidatingAdmissionPolicy
// and binding objects of the manifest at path in deploy.FS, such as
// deploy.LiveLease, and returns without waiting for the API server to
// enforce them. It returns an error wrapping ErrManifest, having created
// the objects before it, if the manifest holds any other kind.
func CreatePolicies(ctx context.Context, cfg *rest.Config, path string) error {
	cs, closeIdle, err := clientset(cfg)
	if err != nil {
		return err
	}
	defer closeIdle()
	return createPolicies(ctx, cs, path)
}

// clientset returns a clientset of cfg on an HTTP client of its own, and a
// function that closes that client's idle connections, which the caller
// defers: nothing the kit opened then stays connected to an API server
// that outlives the call, so a goroutine-leak check (goleak)
// does not see the kit's connections.
func clientset(cfg *rest.Config) (kubernetes.Interface, func(), error) {
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("kubefencertest: client: %w", err)
	}
	cs, err := kubernetes.NewForConfigAndClient(cfg, hc)
	if err != nil {
		return nil, nil, fmt.Errorf("kubefencertest: client: %w", err)
	}
	return cs, func() { utilnet.CloseIdleConnectionsFor(hc.Transport) }, nil
}

// createPolicies is CreatePolicies with a clientset.
func createPolicies(ctx context.Context, cs kubernetes.Interface, path string) error {
	data, err := deploy.FS.ReadFile(path)
	if err != nil {
		return fmt.Errorf("kubefencertest: %w", err)
	}
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("kubefencertest: read %s: %w", path, err)
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		if err := createPolicy(ctx, cs, path, doc); err != nil {
			return err
		}
	}
}

// createPolicy creates the policy or binding of one YAML document.
func createPolicy(ctx context.Context, cs kubernetes.Interface, path string, doc []byte) error {
	var meta metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &meta); err != nil {
		return fmt.Errorf("kubefencertest: %s: %w", path, err)
	}
	var err error
	switch meta.Kind {
	case "ValidatingAdmissionPolicy":
		var p admissionv1.ValidatingAdmissionPolicy
		if err = yaml.UnmarshalStrict(doc, &p); err == nil {
			if mutant.On(mutant.PolicyNoMarkRule) {
				// Drop the rule that refuses a token of a lease below
				// that lease's own mark.
				n := len(p.Spec.Validations)
				p.Spec.Validations = slices.DeleteFunc(p.Spec.Validations, func(v admissionv1.Validation) bool {
					return strings.Contains(v.Expression, "int(variables.newToken) >= int(variables.new[variables.newMarkKey])")
				})
				if len(p.Spec.Validations) != n-1 {
					return fmt.Errorf("kubefencertest: mutant %s: %s has no single mark rule", mutant.PolicyNoMarkRule, path)
				}
			}
			_, err = cs.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, &p, metav1.CreateOptions{})
		}
	case "ValidatingAdmissionPolicyBinding":
		var b admissionv1.ValidatingAdmissionPolicyBinding
		if err = yaml.UnmarshalStrict(doc, &b); err == nil {
			_, err = cs.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(ctx, &b, metav1.CreateOptions{})
		}
	default:
		return fmt.Errorf("%w: %s holds kind %q", ErrManifest, path, meta.Kind)
	}
	if err != nil {
		return fmt.Errorf("kubefencertest: %s: create %s: %w", path, meta.Kind, err)
	}
	return nil
}

// waitEnforced retries a dry-run stale update of a probe ConfigMap until
// the policy denies it or ctx ends, and deletes the probe.
func waitEnforced(ctx context.Context, cs kubernetes.Interface) (err error) {
	cms := cs.CoreV1().ConfigMaps(ProbeNamespace)
	probe, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
		Name:        probeName,
		Annotations: map[string]string{"fencer.dev/lease": ProbeNamespace + "/" + probeName, "fencer.dev/token": "5"},
	}}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("kubefencertest: policy probe: %w", err)
	}
	defer func() {
		if derr := cms.Delete(context.WithoutCancel(ctx), probeName, metav1.DeleteOptions{}); derr != nil && err == nil {
			err = fmt.Errorf("kubefencertest: delete policy probe: %w", derr)
		}
	}()
	probe.Annotations["fencer.dev/token"] = "4"
	return waitDenied(ctx, cs, probe, "stale fencing token")
}

// RoleName names the Role and RoleBinding InstallRole creates.
const RoleName = "fencer"

// InstallRole creates, as cfg's user, the Role of deploy.Role (the rights
// fencer's Kubernetes library needs on Leases) in namespace, and a
// RoleBinding, both named RoleName, that grants it to subjects; then it
// returns once the API server's authorizer lets every User and
// ServiceAccount subject update Leases in namespace. Group subjects are
// bound but not waited for. It returns an error if the objects exist, or
// if the rights are not in effect before ctx ends.
//
// The Role covers fencer's Leases only: grant the objects a controller
// guards in a Role of their own, as without fencer.
func InstallRole(ctx context.Context, cfg *rest.Config, namespace string, subjects ...rbacv1.Subject) error {
	cs, closeIdle, err := clientset(cfg)
	if err != nil {
		return err
	}
	defer closeIdle()
	data, err := deploy.FS.ReadFile(deploy.Role)
	if err != nil {
		return fmt.Errorf("kubefencertest: %w", err)
	}
	var role rbacv1.Role
	if err := yaml.UnmarshalStrict(data, &role); err != nil {
		return fmt.Errorf("kubefencertest: %s: %w", deploy.Role, err)
	}
	if role.Kind != "Role" {
		return fmt.Errorf("%w: %s holds kind %q", ErrManifest, deploy.Role, role.Kind)
	}
	role.Name, role.Namespace = RoleName, namespace
	if _, err := cs.RbacV1().Roles(namespace).Create(ctx, &role, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("kubefencertest: create Role: %w", err)
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: RoleName, Namespace: namespace},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: RoleName},
		Subjects:   subjects,
	}
	if _, err := cs.RbacV1().RoleBindings(namespace).Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("kubefencertest: create RoleBinding: %w", err)
	}
	for _, s := range subjects {
		user := s.Name
		switch s.Kind {
		case rbacv1.UserKind:
		case rbacv1.ServiceAccountKind:
			user = "system:serviceaccount:" + s.Namespace + ":" + s.Name
		default:
			continue
		}
		review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: user,
			ResourceAttributes: &authorizationv1.ResourceAttributes{
				Namespace: namespace, Verb: "update", Group: coordinationv1.GroupName, Resource: "leases",
			},
		}}
		err := poll(ctx, "rights of "+user+" not in effect", func() (bool, error) {
			got, err := cs.AuthorizationV1().SubjectAccessReviews().Create(ctx, review, metav1.CreateOptions{})
			if err != nil {
				return false, err
			}
			return got.Status.Allowed, nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// poll calls try every pollInterval until it reports done or ctx ends; the
// error then says what and wraps ctx's, with try's last error.
func poll(ctx context.Context, what string, try func() (bool, error)) error {
	for {
		done, err := try()
		if done {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kubefencertest: %s (last: %v): %w", what, err, ctx.Err())
		case <-time.After(pollInterval):
		}
	}
}
