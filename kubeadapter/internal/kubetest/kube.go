package kubetest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fencer-dev/fencer/kubeadapter"
	"github.com/fencer-dev/fencer/kubeadapter/fenced"
	"github.com/fencer-dev/fencer/kubeadapter/kubefencertest"
	"github.com/fencer-dev/fencer/token"
)

// Kube is what a test needs of an API server: its admin clients and a
// namespace of the test's own.
type Kube struct {
	Env *kubefencertest.APIServer
	CS  *kubernetes.Clientset
	CRC client.Client
	NS  string
}

// NewKube returns a Kube on env, with a new namespace.
func NewKube(tb testing.TB, env *kubefencertest.APIServer) *Kube {
	tb.Helper()
	cs, crc := AdminClients(tb, env)
	return &Kube{Env: env, CS: cs, CRC: crc, NS: CreateNamespace(tb, cs)}
}

// LiveKube is a Kube on an API server of its own, for a test that installs
// the live-Lease policy (InstallLiveLease): on a shared API server it
// would change what the other tests see.
func LiveKube(tb testing.TB) *Kube {
	tb.Helper()
	return NewKube(tb, kubefencertest.APIServerForTest(tb))
}

// InstallLiveLease installs the live-Lease admission policy on k's API
// server and waits until it is enforced.
func (k *Kube) InstallLiveLease(tb testing.TB) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(tb, kubefencertest.InstallLiveLeasePolicy(ctx, k.Env.Admin()))
}

// Fast is a Config of the Lease "fence" in k's namespace with short
// durations, so that takeovers take about 2s.
func (k *Kube) Fast(identity string) kubeadapter.Config {
	return kubeadapter.Config{
		Namespace: k.NS, Name: "fence", Identity: identity,
		LeaseDuration: 2 * time.Second, RenewDeadline: 1500 * time.Millisecond, RetryPeriod: 250 * time.Millisecond,
	}
}

// Elector returns an Elector of Fast(identity) on the admin clientset.
func (k *Kube) Elector(tb testing.TB, identity string) *kubeadapter.Elector {
	tb.Helper()
	e, err := kubeadapter.NewElector(k.CS.CoordinationV1(), k.Fast(identity))
	require.NoError(tb, err)
	return e
}

// Client returns a fenced client of h on the admin controller-runtime
// client.
func (k *Kube) Client(tb testing.TB, h fenced.Holder, opts ...fenced.Option) *fenced.Client {
	tb.Helper()
	c, err := fenced.NewClient(k.CRC, h, opts...)
	require.NoError(tb, err)
	return c
}

// Tokens acquires and releases the Lease n times and returns the tokens,
// oldest first.
func (k *Kube) Tokens(tb testing.TB, n int) []token.Token {
	tb.Helper()
	e := k.Elector(tb, "tokens")
	var toks []token.Token
	for range n {
		h, err := e.TryAcquire(context.Background())
		require.NoError(tb, err)
		toks = append(toks, h.Token())
		require.NoError(tb, h.Release(context.Background()))
	}
	return toks
}

// ConfigMap reads the ConfigMap name of k's namespace.
func (k *Kube) ConfigMap(tb testing.TB, name string) *corev1.ConfigMap {
	tb.Helper()
	var cm corev1.ConfigMap
	require.NoError(tb, k.CRC.Get(context.Background(), client.ObjectKey{Namespace: k.NS, Name: name}, &cm))
	return &cm
}
