package shard

import (
	"strconv"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	k8stesting "k8s.io/client-go/testing"
)

// These unit tests use client-go's fake clientset and a fake clock. They
// pin down exact timing decisions only; behaviour against a store is
// tested on a real kube-apiserver in the *_kube_test.go files.

var leasesGVR = coordinationv1.SchemeGroupVersion.WithResource("leases")

// fakeLeases is a fake clientset whose Lease writes check and assign
// resourceVersions like the API server (the plain fake does neither; an
// update without one is unconditional, as on the API server).
type fakeLeases struct {
	*fake.Clientset
	mu      sync.Mutex
	rv      int64
	failing bool
}

func (f *fakeLeases) setFailing(v bool) {
	f.mu.Lock()
	f.failing = v
	f.mu.Unlock()
}

// CoordinationV1 returns the fake's Lease client, marked as one that
// cannot stream a list's initial events (as client-go's fake clientset
// is), so that a Watcher on it lists and then watches.
func (f *fakeLeases) CoordinationV1() coordinationv1client.CoordinationV1Interface {
	return listThenWatch{f.Clientset.CoordinationV1()}
}

type listThenWatch struct {
	coordinationv1client.CoordinationV1Interface
}

func (listThenWatch) IsWatchListSemanticsUnSupported() bool { return true }

func newFakeLeases(t *testing.T, objs ...runtime.Object) *fakeLeases {
	t.Helper()
	f := &fakeLeases{Clientset: fake.NewClientset(), rv: 100}
	tr := f.Tracker()
	for _, o := range objs {
		require.NoError(t, tr.Add(o))
	}
	f.PrependReactor("create", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		f.mu.Lock()
		defer f.mu.Unlock()
		l := a.(k8stesting.CreateAction).GetObject().(*coordinationv1.Lease).DeepCopy()
		f.rv++
		l.ResourceVersion = strconv.FormatInt(f.rv, 10)
		l.UID = types.UID("uid-" + l.ResourceVersion)
		return true, l, tr.Create(leasesGVR, l, l.Namespace)
	})
	f.PrependReactor("update", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.failing {
			return true, nil, apierrors.NewServiceUnavailable("injected")
		}
		l := a.(k8stesting.UpdateAction).GetObject().(*coordinationv1.Lease).DeepCopy()
		cur, err := tr.Get(leasesGVR, l.Namespace, l.Name)
		if err != nil {
			return true, nil, err
		}
		if l.ResourceVersion != "" && cur.(*coordinationv1.Lease).ResourceVersion != l.ResourceVersion {
			return true, nil, apierrors.NewConflict(leasesGVR.GroupResource(), l.Name, nil)
		}
		f.rv++
		l.ResourceVersion = strconv.FormatInt(f.rv, 10)
		return true, l, tr.Update(leasesGVR, l, l.Namespace)
	})
	return f
}
