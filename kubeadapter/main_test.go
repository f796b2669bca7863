package kubeadapter_test

import (
	"os"
	"testing"

	"github.com/fencer-dev/fencer/kubeadapter/internal/kubetest"
)

// shared is the one kube-apiserver of this package's tests, started on
// first use and stopped by TestMain.
var shared = kubetest.Shared{Prefix: "kubeadapter-"}

func TestMain(m *testing.M) {
	os.Exit(shared.Main(m))
}

// kube is the harness's Kube: admin clients and a namespace of the
// test's own on the shared API server (newKube) or on one of the test's
// own (kubetest.LiveKube, kubetest.NewKube).
type kube = kubetest.Kube

func newKube(tb testing.TB) *kube {
	tb.Helper()
	return kubetest.NewKube(tb, shared.Env(tb))
}

// The kube harness's holder and helpers, by their short names.
type staticHolder = kubetest.StaticHolder

var (
	acquire        = kubetest.Acquire
	requireGreater = kubetest.RequireGreater
)
