// Package leasefake is a test harness: client-go's fake clientset with
// Lease writes that check and assign resourceVersions like the API
// server, for the unit tests of kubeadapter and kubeadapter/shard that pin
// down exact timing decisions on a fake clock. Behaviour against a store
// is tested on a real kube-apiserver (internal/testkit/kubetest).
//
// It is imported by tests only; no production package may import it
// (internal/layout enforces it).
package leasefake

import (
	"strconv"
	"sync"
	"testing"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	k8stesting "k8s.io/client-go/testing"
)

// GVR is the resource of Leases, for the fake's object tracker.
var GVR = coordinationv1.SchemeGroupVersion.WithResource("leases")

// Clientset is a fake clientset whose Lease creates and updates assign
// resourceVersions from one counter, and whose updates are conditional on
// the resourceVersion they carry, like the API server's (the plain fake
// does neither; an update without one is unconditional, as on the API
// server). A create also sets the UID "uid-<resourceVersion>". Updates can
// be made to fail (SetFailing). What it does not do: watch bookmarks,
// list resourceVersions (a test adds a reactor for them), admission, or
// anything else of the API server.
type Clientset struct {
	*fake.Clientset
	// Mu serializes the fake's writes. A test that changes the tracker
	// itself, as another writer would, holds it and takes the next
	// resourceVersion from RV (RV++ first).
	Mu sync.Mutex
	// RV is the last resourceVersion assigned; it starts at 100.
	RV      int64
	failing bool
}

// New returns a Clientset holding objs.
func New(t testing.TB, objs ...runtime.Object) *Clientset {
	t.Helper()
	f := &Clientset{Clientset: fake.NewClientset(), RV: 100}
	tr := f.Tracker()
	for _, o := range objs {
		if err := tr.Add(o); err != nil {
			t.Fatal(err)
		}
	}
	f.PrependReactor("create", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		f.Mu.Lock()
		defer f.Mu.Unlock()
		l := a.(k8stesting.CreateAction).GetObject().(*coordinationv1.Lease).DeepCopy()
		f.RV++
		l.ResourceVersion = strconv.FormatInt(f.RV, 10)
		l.UID = types.UID("uid-" + l.ResourceVersion)
		return true, l, tr.Create(GVR, l, l.Namespace)
	})
	f.PrependReactor("update", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		f.Mu.Lock()
		defer f.Mu.Unlock()
		if f.failing {
			return true, nil, apierrors.NewServiceUnavailable("injected")
		}
		l := a.(k8stesting.UpdateAction).GetObject().(*coordinationv1.Lease).DeepCopy()
		cur, err := tr.Get(GVR, l.Namespace, l.Name)
		if err != nil {
			return true, nil, err
		}
		// Like the API server, an update without a resourceVersion is
		// unconditional.
		if l.ResourceVersion != "" && cur.(*coordinationv1.Lease).ResourceVersion != l.ResourceVersion {
			return true, nil, apierrors.NewConflict(GVR.GroupResource(), l.Name, nil)
		}
		f.RV++
		l.ResourceVersion = strconv.FormatInt(f.RV, 10)
		return true, l, tr.Update(GVR, l, l.Namespace)
	})
	return f
}

// SetFailing makes every Lease update fail with ServiceUnavailable (true)
// or not (false).
func (f *Clientset) SetFailing(v bool) {
	f.Mu.Lock()
	f.failing = v
	f.Mu.Unlock()
}

// CoordinationV1 returns the fake's Lease client, marked as one that
// cannot stream a list's initial events (as client-go's fake clientset
// is), so that a Watcher on it lists and then watches.
func (f *Clientset) CoordinationV1() coordinationv1client.CoordinationV1Interface {
	return listThenWatch{f.Clientset.CoordinationV1()}
}

type listThenWatch struct {
	coordinationv1client.CoordinationV1Interface
}

// IsWatchListSemanticsUnSupported returns true: the fake cannot stream a
// list's initial events.
func (listThenWatch) IsWatchListSemanticsUnSupported() bool { return true }
