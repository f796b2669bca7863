package kubefencertest

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/fencer-dev/fencer/internal/freeport"
)

// LimitedNamespace is the namespace that StartAPIServer creates and in
// which the Limited user has its rights.
const LimitedNamespace = "fencer-test"

// APIServer is a running etcd member and kube-apiserver on loopback, each a
// child process. Its methods are safe for concurrent use.
type APIServer struct {
	etcd    *etcdProc
	creds   credentials
	host    string
	logPath string

	// cmd is the kube-apiserver process; nil until it has been started.
	cmd *exec.Cmd
	// logFile receives the process's stdout and stderr.
	logFile *os.File
	// exited is closed once cmd has exited and waitErr is set.
	exited  chan struct{}
	waitErr error

	stopOnce sync.Once
}

// StartAPIServer starts etcd and kube-apiserver, both keeping their state under dir,
// and returns once the API server reports ready on /readyz and the Limited
// user's rights are in effect. The API server listens on a free loopback
// port and writes its log to dir/kube-apiserver.log.
//
// ctx bounds startup only: once StartAPIServer has returned, the APIServer runs until Stop.
// If ctx ends first, or the API server exits or does not become ready,
// everything started is stopped and the error includes the end of the API
// server's log. The error wraps ErrNoBinary when there is no kube-apiserver
// binary (see BinaryPath), and ErrNoEtcd when there is no etcd binary (see
// EtcdPath).
//
// The caller must call Stop. Should the calling process die without it, the
// kernel kills kube-apiserver and etcd too (on Linux), but dir is left
// behind.
func StartAPIServer(ctx context.Context, dir string) (*APIServer, error) {
	bin, err := BinaryPath()
	if err != nil {
		return nil, err
	}
	etcdBin, err := EtcdPath()
	if err != nil {
		return nil, err
	}
	etcd, err := startEtcd(ctx, etcdBin, filepath.Join(dir, "etcd"))
	if err != nil {
		return nil, err
	}
	e := &APIServer{etcd: etcd, exited: make(chan struct{})}
	if err := e.start(ctx, bin, dir); err != nil {
		e.Stop()
		return nil, err
	}
	return e, nil
}

// start runs kube-apiserver against e.etcd and waits until it is ready.
func (e *APIServer) start(ctx context.Context, bin, dir string) error {
	creds, files, err := writeCredentials(filepath.Join(dir, "pki"))
	if err != nil {
		return err
	}
	e.creds = creds
	ports, release, err := freeport.Take(1)
	if err != nil {
		return fmt.Errorf("kubefencertest: %w", err)
	}
	release()
	port := ports[0]
	e.host = "https://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	e.logPath = filepath.Join(dir, "kube-apiserver.log")
	e.logFile, err = os.Create(e.logPath)
	if err != nil {
		return fmt.Errorf("kubefencertest: %w", err)
	}

	cmd := exec.Command(bin,
		"--etcd-servers="+e.etcd.endpoint,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port="+strconv.Itoa(port),
		"--tls-cert-file="+files.servingCert,
		"--tls-private-key-file="+files.servingKey,
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file="+files.saPublic,
		"--service-account-signing-key-file="+files.saPrivate,
		"--token-auth-file="+files.tokens,
		"--authorization-mode=RBAC",
		"--service-cluster-ip-range=10.0.0.0/24",
		"--disable-admission-plugins=ServiceAccount",
		// Nothing here serves the kubernetes Service's endpoints, and
		// test clients are few: skip the work that exists for clusters.
		"--endpoint-reconciler-type=none",
		"--enable-priority-and-fairness=false",
		"--profiling=false",
	)
	cmd.Stdout, cmd.Stderr = e.logFile, e.logFile
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("kubefencertest: start %s: %w", bin, err)
	}
	e.cmd = cmd
	go func() {
		e.waitErr = cmd.Wait()
		close(e.exited)
	}()

	if err := e.waitReady(ctx); err != nil {
		return fmt.Errorf("kubefencertest: kube-apiserver did not become ready: %w\n%s", err, logTail("kube-apiserver", e.logPath))
	}
	if err := e.grantLimited(ctx); err != nil {
		return fmt.Errorf("kubefencertest: set up limited user: %w\n%s", err, logTail("kube-apiserver", e.logPath))
	}
	return nil
}

// waitReady polls /readyz as the admin until it answers ok, the process
// exits or ctx ends.
func (e *APIServer) waitReady(ctx context.Context) error {
	client, err := kubernetes.NewForConfig(e.Admin())
	if err != nil {
		return err
	}
	var last error
	for {
		reqCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := client.Discovery().RESTClient().Get().AbsPath("/readyz").Do(reqCtx).Raw()
		cancel()
		if err == nil {
			return nil
		}
		last = err
		if err := e.pause(ctx); err != nil {
			return fmt.Errorf("%w (last /readyz: %w)", err, last)
		}
	}
}

// grantLimited creates LimitedNamespace and the Limited user's Role and RoleBinding
// in it, then waits until the API server's authorizer has seen them.
func (e *APIServer) grantLimited(ctx context.Context) error {
	admin, err := kubernetes.NewForConfig(e.Admin())
	if err != nil {
		return err
	}
	verbs := []string{"get", "list", "watch", "create", "update", "patch", "delete"}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: LimitedNamespace}}
	if _, err := admin.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		return err
	}
	role := &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: limitedUser, Namespace: LimitedNamespace},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{coordinationv1.GroupName}, Resources: []string{"leases"}, Verbs: verbs},
			{APIGroups: []string{corev1.GroupName}, Resources: []string{"configmaps"}, Verbs: verbs},
		},
	}
	if _, err := admin.RbacV1().Roles(LimitedNamespace).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		return err
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: limitedUser, Namespace: LimitedNamespace},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: limitedUser},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: limitedUser}},
	}
	if _, err := admin.RbacV1().RoleBindings(LimitedNamespace).Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		return err
	}

	limited, err := kubernetes.NewForConfig(e.Limited())
	if err != nil {
		return err
	}
	review := &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{
		ResourceAttributes: &authorizationv1.ResourceAttributes{
			Namespace: LimitedNamespace, Verb: "delete", Group: corev1.GroupName, Resource: "configmaps",
		},
	}}
	for {
		got, err := limited.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, review, metav1.CreateOptions{})
		if err != nil {
			return err
		}
		if got.Status.Allowed {
			return nil
		}
		if err := e.pause(ctx); err != nil {
			return fmt.Errorf("%w (rights not yet in effect: %s)", err, got.Status.Reason)
		}
	}
}

// pause waits one poll interval. It fails early when ctx ends or the
// API server process exits.
func (e *APIServer) pause(ctx context.Context) error {
	t := time.NewTimer(pollInterval)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-e.exited:
		return fmt.Errorf("kube-apiserver exited: %w", e.waitErr)
	}
}

// Admin returns a new client config for an administrator in system:masters,
// which no RBAC rule restricts. It authenticates with a bearer token and
// verifies the API server's certificate. Client-side rate limiting is off
// (QPS -1). The caller may modify the returned config.
func (e *APIServer) Admin() *rest.Config { return e.config(e.creds.adminToken) }

// Limited returns a new client config for the user fencer-limited, which
// authenticates with its own bearer token. RBAC allows it exactly get, list,
// watch, create, update, patch and delete on leases (coordination.k8s.io)
// and configmaps in LimitedNamespace, plus what Kubernetes grants every
// authenticated user (discovery and self reviews). Everything else, such as
// secrets, other namespaces or cluster-scoped objects, is forbidden. Client
// side rate limiting is off. The caller may modify the returned config.
func (e *APIServer) Limited() *rest.Config { return e.config(e.creds.limitedToken) }

// Impersonate returns a new client config for the given user and groups,
// made by the admin impersonating them. The API server adds the group
// system:authenticated, so the user has what Kubernetes grants every
// authenticated user plus the rights that RBAC objects created by the caller
// give it. Use it for tests that need several distinct identities; unlike
// Limited, it does not exercise token authentication.
func (e *APIServer) Impersonate(user string, groups ...string) *rest.Config {
	cfg := e.Admin()
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: groups}
	return cfg
}

// config returns a client config that authenticates with token.
func (e *APIServer) config(token string) *rest.Config {
	return &rest.Config{
		Host:            e.host,
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAData: bytes.Clone(e.creds.caPEM)},
		QPS:             -1,
	}
}

// Stop kills kube-apiserver, waits for it to exit, and kills etcd. The API
// server is killed, not shut down gracefully: in-flight requests and watches
// end with connection errors. Stop leaves the directory given to Start in
// place. It is safe to call more than once.
func (e *APIServer) Stop() {
	e.stopOnce.Do(func() {
		if e.cmd != nil {
			// Kill fails only if the process has already exited.
			_ = e.cmd.Process.Kill()
			<-e.exited
		}
		if e.logFile != nil {
			e.logFile.Close()
		}
		if e.etcd != nil {
			e.etcd.stop()
		}
	})
}

// logTail returns the last lines of a process's log at path, for errors.
func logTail(name, path string) string {
	const maxLines, maxBytes = 30, 8 << 10
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(no %s log: %v)", name, err)
	}
	data = bytes.TrimRight(data, "\n")
	if len(data) == 0 {
		return "(" + name + " log " + path + " is empty)"
	}
	if len(data) > maxBytes {
		data = data[len(data)-maxBytes:]
	}
	lines := bytes.Split(data, []byte("\n"))
	if len(lines) > maxLines {
		lines = lines[len(lines)-maxLines:]
	}
	return name + " log (" + path + ", last lines):\n" + string(bytes.Join(lines, []byte("\n")))
}
