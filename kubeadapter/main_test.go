package kubeadapter_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fencer-dev/fencer/kubeadapter"
	"github.com/fencer-dev/fencer/kubeadapter/fenced"
	"github.com/fencer-dev/fencer/kubeadapter/internal/kubetest"
	"github.com/fencer-dev/fencer/kubeadapter/kubefencertest"
	"github.com/fencer-dev/fencer/token"
)

// shared is the one kube-apiserver of this package's tests, started on
// first use and stopped by TestMain.
var shared = kubetest.Shared{Prefix: "kubeadapter-"}

func TestMain(m *testing.M) {
	os.Exit(shared.Main(m))
}

// kube is what a test needs of the API server: admin clients and a
// namespace of its own.
type kube struct {
	env *kubefencertest.APIServer
	cs  *kubernetes.Clientset
	crc client.Client
	ns  string
}

func newKube(tb testing.TB) *kube {
	tb.Helper()
	return newKubeOn(tb, shared.Env(tb))
}

// newKubeOn is newKube on env rather than the shared API server.
func newKubeOn(tb testing.TB, env *kubefencertest.APIServer) *kube {
	tb.Helper()
	cs, crc := kubetest.AdminClients(tb, env)
	return &kube{env: env, cs: cs, crc: crc, ns: kubetest.CreateNamespace(tb, cs)}
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

func (k *kube) client(tb testing.TB, h kubeadapter.Holder, opts ...fenced.Option) *fenced.Client {
	tb.Helper()
	c, err := fenced.NewClient(k.crc, h, opts...)
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

// The kube harness's holder and helpers, by their short names.
type staticHolder = kubetest.StaticHolder

var (
	acquire        = kubetest.Acquire
	requireGreater = kubetest.RequireGreater
)
