package shard_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fencer-dev/fencer/internal/kubetest"
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
	if spec := os.Getenv(shardMemberEnv); spec != "" {
		os.Exit(shardMember(spec))
	}
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
		if shared.dir, shared.err = os.MkdirTemp("", "shard-"); shared.err != nil {
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
	env := kubeEnv(tb)
	cs, err := kubernetes.NewForConfig(env.Admin())
	require.NoError(tb, err)
	crc, err := client.New(env.Admin(), client.Options{Scheme: clientgoscheme.Scheme})
	require.NoError(tb, err)
	name := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			return r
		}
		return '-'
	}, strings.ToLower(tb.Name()))
	ns := fmt.Sprintf("%s-%d", strings.Trim(name[:min(len(name), 50)], "-"), time.Now().UnixNano()%100000)
	_, err = cs.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	require.NoError(tb, err)
	return &kube{env: env, cs: cs, crc: crc, ns: ns}
}

func (k *kube) configMap(tb testing.TB, name string) *corev1.ConfigMap {
	tb.Helper()
	var cm corev1.ConfigMap
	require.NoError(tb, k.crc.Get(context.Background(), client.ObjectKey{Namespace: k.ns, Name: name}, &cm))
	return &cm
}

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

// stallable wraps a Lease client; while stalled, Lease updates hang until
// their context ends, as for a process paused or cut off from the API
// server. Reads are not stalled. Once killed, every call fails at once
// without reaching the API server, as for a process that is gone.
type stallable struct {
	coordinationv1client.LeasesGetter
	stalled atomic.Bool
	killed  atomic.Bool
}

var errKilled = errors.New("test: process killed")

func (s *stallable) Leases(ns string) coordinationv1client.LeaseInterface {
	return stalledLeases{s.LeasesGetter.Leases(ns), s}
}

type stalledLeases struct {
	coordinationv1client.LeaseInterface
	s *stallable
}

// alive fails every call once the process is killed.
func (l stalledLeases) alive() error {
	if l.s.killed.Load() {
		return errKilled
	}
	return nil
}

func (l stalledLeases) Get(ctx context.Context, name string, opts metav1.GetOptions) (*coordinationv1.Lease, error) {
	if err := l.alive(); err != nil {
		return nil, err
	}
	return l.LeaseInterface.Get(ctx, name, opts)
}

func (l stalledLeases) List(ctx context.Context, opts metav1.ListOptions) (*coordinationv1.LeaseList, error) {
	if err := l.alive(); err != nil {
		return nil, err
	}
	return l.LeaseInterface.List(ctx, opts)
}

func (l stalledLeases) Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	if err := l.alive(); err != nil {
		return nil, err
	}
	return l.LeaseInterface.Watch(ctx, opts)
}

func (l stalledLeases) Create(ctx context.Context, lease *coordinationv1.Lease, opts metav1.CreateOptions) (*coordinationv1.Lease, error) {
	if err := l.alive(); err != nil {
		return nil, err
	}
	return l.LeaseInterface.Create(ctx, lease, opts)
}

func (l stalledLeases) Update(ctx context.Context, lease *coordinationv1.Lease, opts metav1.UpdateOptions) (*coordinationv1.Lease, error) {
	if err := l.alive(); err != nil {
		return nil, err
	}
	if l.s.stalled.Load() {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return l.LeaseInterface.Update(ctx, lease, opts)
}
