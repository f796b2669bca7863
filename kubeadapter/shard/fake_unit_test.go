package shard

import (
	"testing"

	"k8s.io/apimachinery/pkg/runtime"

	"github.com/fencer-dev/fencer/kubeadapter/internal/leasefake"
)

// These unit tests use a fake clientset (leasefake) and a fake clock. They
// pin down exact timing decisions only; behaviour against a store is
// tested on a real kube-apiserver in package e2e (its own module).

var leasesGVR = leasefake.GVR

// fakeLeases is leasefake's clientset, whose Lease writes check and
// assign resourceVersions like the API server, with this package's
// helpers.
type fakeLeases struct{ *leasefake.Clientset }

func newFakeLeases(t *testing.T, objs ...runtime.Object) *fakeLeases {
	t.Helper()
	return &fakeLeases{leasefake.New(t, objs...)}
}
