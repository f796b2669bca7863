package kubetest

import (
	"context"
	"errors"
	"sync/atomic"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
)

// ErrKilled is what every call of a killed Stallable returns.
var ErrKilled = errors.New("kubetest: process killed")

// Stallable wraps a Lease client as a process's link to the API server.
// While Stalled is set, Lease updates hang until their context ends, as
// for a process paused or cut off from the API server; reads are not
// stalled. Once Killed is set, every call (get, list, watch, create,
// update) fails at once with ErrKilled without reaching the API server,
// as for a process that is gone. Other calls pass through.
type Stallable struct {
	coordinationv1client.LeasesGetter
	Stalled atomic.Bool
	Killed  atomic.Bool
}

// Leases returns the namespace's Lease client, stalled and killed with s.
func (s *Stallable) Leases(ns string) coordinationv1client.LeaseInterface {
	return stalledLeases{s.LeasesGetter.Leases(ns), s}
}

type stalledLeases struct {
	coordinationv1client.LeaseInterface
	s *Stallable
}

// alive fails every call once the process is killed.
func (l stalledLeases) alive() error {
	if l.s.Killed.Load() {
		return ErrKilled
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
	if l.s.Stalled.Load() {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return l.LeaseInterface.Update(ctx, lease, opts)
}
