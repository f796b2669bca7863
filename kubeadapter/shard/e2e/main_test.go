package e2e_test

import (
	"context"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fencer-dev/fencer/kubeadapter/internal/kubetest"
	"github.com/fencer-dev/fencer/kubeadapter/kubefencertest"
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
	env *kubefencertest.APIServer
	cs  *kubernetes.Clientset
	crc client.Client
	ns  string
}

func newKube(tb testing.TB) *kube {
	tb.Helper()
	env := shared.Env(tb)
	cs, crc := kubetest.AdminClients(tb, env)
	return &kube{env: env, cs: cs, crc: crc, ns: kubetest.CreateNamespace(tb, cs)}
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
