package kubetest

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/fencer-dev/fencer/kubeadapter/kubefencertest"
)

// Shared is the one Env of a test package, started on first use (Env) in a
// temporary directory and stopped by Stop, which the package's TestMain
// calls after m.Run. Its zero value is ready to use. It is safe for
// concurrent use.
type Shared struct {
	// Prefix names the temporary directory; empty means "kubetest-".
	Prefix string

	once      sync.Once
	env       *kubefencertest.APIServer
	dir       string
	err       error
	policy    sync.Once
	policyErr error
}

// Env returns the shared Env, starting it on the first call (within
// kubefencertest.StartTimeout). When there is no kube-apiserver binary it skips tb,
// unless CI is "true" or FENCER_REQUIRE_KUBE is "1", which fail it, as
// kubefencertest.APIServerForTest does; any other startup error fails tb, on every call.
func (s *Shared) Env(tb testing.TB) *kubefencertest.APIServer {
	tb.Helper()
	s.once.Do(func() {
		prefix := s.Prefix
		if prefix == "" {
			prefix = "kubetest-"
		}
		if s.dir, s.err = os.MkdirTemp("", prefix); s.err != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), kubefencertest.StartTimeout)
		defer cancel()
		s.env, s.err = kubefencertest.StartAPIServer(ctx, s.dir)
	})
	kubefencertest.SkipIfNoBinaries(tb, s.err)
	if s.err != nil {
		tb.Fatal(s.err)
	}
	return s.env
}

// InstallPolicy installs deploy/admission/policy.yaml on the shared Env,
// once however many tests call it, and waits until the API server
// enforces it (within a minute). It fails tb, on every call, when that
// did not succeed.
func (s *Shared) InstallPolicy(tb testing.TB) {
	tb.Helper()
	env := s.Env(tb)
	s.policy.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		s.policyErr = kubefencertest.InstallPolicy(ctx, env.Admin())
	})
	if s.policyErr != nil {
		tb.Fatal(s.policyErr)
	}
}

// Stop stops the shared Env, if it was started, and removes its
// directory. It does nothing otherwise.
func (s *Shared) Stop() {
	if s.env != nil {
		s.env.Stop()
	}
	if s.dir != "" {
		os.RemoveAll(s.dir)
	}
}

// Main runs the tests of m, then stops the shared Env (Stop) and, when
// the tests passed, checks that no goroutine outlives them (goleak),
// failing the run if one does. It returns the exit code for os.Exit.
func (s *Shared) Main(m *testing.M) int {
	code := m.Run()
	s.Stop()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	return code
}

// CreateNamespace creates, through cs, a namespace named after tb (its
// name in lower case, with every other character than a letter or a
// digit made "-", cut to 50 characters, and a number so that reruns do
// not collide), and returns its name. It fails tb when the create fails.
// Nothing deletes it: an Env has no controller that would finish the
// deletion.
func CreateNamespace(tb testing.TB, cs kubernetes.Interface) string {
	tb.Helper()
	name := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			return r
		}
		return '-'
	}, strings.ToLower(tb.Name()))
	ns := fmt.Sprintf("%s-%d", strings.Trim(name[:min(len(name), 50)], "-"), time.Now().UnixNano()%100000)
	if _, err := cs.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		tb.Fatalf("create namespace %s: %v", ns, err)
	}
	return ns
}
