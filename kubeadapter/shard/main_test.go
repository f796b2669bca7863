package shard_test

import (
	"context"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fencer-dev/fencer/internal/testkit/kubetest"
	"github.com/fencer-dev/fencer/token"
)

// shared is the one kube-apiserver of this package's tests, started on
// first use and stopped by TestMain.
var shared = kubetest.Shared{Prefix: "shard-"}

func TestMain(m *testing.M) {
	if spec := os.Getenv(shardMemberEnv); spec != "" {
		os.Exit(shardMember(spec))
	}
	os.Exit(shared.Main(m))
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
	env := shared.Env(tb)
	cs, err := kubernetes.NewForConfig(env.Admin())
	require.NoError(tb, err)
	crc, err := client.New(env.Admin(), client.Options{Scheme: clientgoscheme.Scheme})
	require.NoError(tb, err)
	ns := kubetest.CreateNamespace(tb, cs)
	return &kube{env: env, cs: cs, crc: crc, ns: ns}
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

func requireGreater(t *testing.T, newer, older token.Token) {
	t.Helper()
	c, err := newer.Compare(older)
	require.NoError(t, err)
	require.Equal(t, 1, c, "%v is not greater than %v", newer, older)
}
