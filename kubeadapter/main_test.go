package kubeadapter_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fencer-dev/fencer/internal/kubetest"
	"github.com/fencer-dev/fencer/kubeadapter"
	"github.com/fencer-dev/fencer/token"
)

// shared is the one kube-apiserver of this package's tests, started on
// first use and stopped by TestMain.
var shared struct {
	once      sync.Once
	env       *kubetest.Env
	dir       string
	err       error
	policy    sync.Once
	policyErr error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if shared.env != nil {
		shared.env.Stop()
		os.RemoveAll(shared.dir)
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// kubeEnv returns the shared API server, skipping tb when there is no
// kube-apiserver binary and neither CI nor FENCER_REQUIRE_KUBE demands it.
func kubeEnv(tb testing.TB) *kubetest.Env {
	tb.Helper()
	shared.once.Do(func() {
		if shared.dir, shared.err = os.MkdirTemp("", "kubeadapter-"); shared.err != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		shared.env, shared.err = kubetest.Start(ctx, shared.dir)
	})
	required := os.Getenv("CI") == "true" || os.Getenv(kubetest.RequireEnv) == "1"
	if errors.Is(shared.err, kubetest.ErrNoBinary) && !required {
		tb.Skipf("%v", shared.err)
	}
	require.NoError(tb, shared.err)
	return shared.env
}

// kube is what a test needs of the API server: admin clients and a
// namespace of its own.
type kube struct {
	env *kubetest.Env
	cs  *kubernetes.Clientset
	crc client.Client
	ns  string
}

func newKube(tb testing.TB) *kube {
	tb.Helper()
	return newKubeOn(tb, kubeEnv(tb))
}

// newKubeOn is newKube on env rather than the shared API server.
func newKubeOn(tb testing.TB, env *kubetest.Env) *kube {
	tb.Helper()
	cs, err := kubernetes.NewForConfig(env.Admin())
	require.NoError(tb, err)
	crc, err := client.New(env.Admin(), client.Options{Scheme: clientgoscheme.Scheme})
	require.NoError(tb, err)
	name := strings.ToLower(tb.Name())
	name = strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			return r
		}
		return '-'
	}, name)
	if len(name) > 50 {
		name = name[:50]
	}
	ns := fmt.Sprintf("%s-%d", strings.Trim(name, "-"), time.Now().UnixNano()%100000)
	_, err = cs.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	require.NoError(tb, err)
	return &kube{env: env, cs: cs, crc: crc, ns: ns}
}

// fast is a Config with short durations, so that takeovers take about 2s.
func (k *kube) fast(identity string) kubeadapter.Config {
	return kubeadapter.Config{
		Namespace: k.ns, Name: "fence", Identity: identity,
		LeaseDuration: 2 * time.Second, RenewDeadline: 1500 * time.Millisecond, RetryPeriod: 250 * time.Millisecond,
	}
}

func (k *kube) elector(tb testing.TB, identity string) *kubeadapter.Elector {
	tb.Helper()
	e, err := kubeadapter.NewElector(k.cs.CoordinationV1(), k.fast(identity))
	require.NoError(tb, err)
	return e
}

func (k *kube) client(tb testing.TB, h kubeadapter.Holder, opts ...kubeadapter.Option) *kubeadapter.Client {
	tb.Helper()
	c, err := kubeadapter.NewClient(k.crc, h, opts...)
	require.NoError(tb, err)
	return c
}

// tokens acquires and releases the Lease n times and returns the tokens,
// oldest first.
func (k *kube) tokens(tb testing.TB, n int) []token.Token {
	tb.Helper()
	e := k.elector(tb, "tokens")
	var toks []token.Token
	for range n {
		h, err := e.TryAcquire(context.Background())
		require.NoError(tb, err)
		toks = append(toks, h.Token())
		require.NoError(tb, h.Release(context.Background()))
	}
	return toks
}

func (k *kube) configMap(tb testing.TB, name string) *corev1.ConfigMap {
	tb.Helper()
	var cm corev1.ConfigMap
	require.NoError(tb, k.crc.Get(context.Background(), client.ObjectKey{Namespace: k.ns, Name: name}, &cm))
	return &cm
}

// staticHolder presents a token and never reports it lost: a holder that
// has not noticed its loss, or a test that bypasses the local check to
// show the store's.
type staticHolder struct{ tok token.Token }

func (h staticHolder) Token() token.Token       { return h.tok }
func (h staticHolder) Context() context.Context { return context.Background() }
func (h staticHolder) Err() error               { return nil }

// installPolicy installs deploy/admission/policy.yaml, once per package,
// and waits until the API server enforces it.
func installPolicy(tb testing.TB, k *kube) {
	tb.Helper()
	shared.policy.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		shared.policyErr = k.env.InstallPolicy(ctx)
	})
	require.NoError(tb, shared.policyErr)
}
