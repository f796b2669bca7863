// Package leaserecord holds the pure functions over coordination.k8s.io/v1
// Lease records that kubeadapter (the Elector, Held and Watcher) and
// kubeadapter/shard (the Sharder and View) share: who a record names, what
// an acquisition and a release write, and whether a record read now is
// still a given acquisition. It performs no I/O and reads no clock.
//
// It owns no policy: callers decide what a change means (kubeadapter maps
// a Change to its reason sentinels). It may import only the Kubernetes API
// types.
package leaserecord

import (
	"maps"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The label that marks a Lease as a fence (kubeadapter.FenceLabel).
const (
	FenceLabel      = "fencer.dev/fence"
	FenceLabelValue = "true"
)

// FenceLabels returns a copy of labels with the labels of extra and
// FenceLabel=FenceLabelValue set, so that a map shared with the caller or
// a cache is never written to.
func FenceLabels(labels, extra map[string]string) map[string]string {
	out := maps.Clone(labels)
	if out == nil {
		out = make(map[string]string, 1+len(extra))
	}
	maps.Copy(out, extra)
	out[FenceLabel] = FenceLabelValue
	return out
}

// Holder returns the holderIdentity of spec, or "".
func Holder(spec *coordinationv1.LeaseSpec) string {
	if spec.HolderIdentity == nil {
		return ""
	}
	return *spec.HolderIdentity
}

// Transitions returns the leaseTransitions of spec, or 0.
func Transitions(spec *coordinationv1.LeaseSpec) int32 {
	if spec.LeaseTransitions == nil {
		return 0
	}
	return *spec.LeaseTransitions
}

// Duration returns the leaseDurationSeconds of spec as a duration, or 0.
func Duration(spec *coordinationv1.LeaseSpec) time.Duration {
	if spec.LeaseDurationSeconds == nil {
		return 0
	}
	return time.Duration(*spec.LeaseDurationSeconds) * time.Second
}

// Acquired returns the record an acquisition by identity writes over
// old (nil when the Lease does not exist yet). It keeps old's other fields,
// names identity as holder, sets both timestamps to now and counts the
// acquisition in leaseTransitions: 0 on create, as client-go does, and
// old+1 on every acquisition of an existing Lease, even by the identity
// already named. An overflowing count is rejected by the API server's
// validation rather than wrapped silently.
func Acquired(old *coordinationv1.LeaseSpec, identity string, d time.Duration, now time.Time) coordinationv1.LeaseSpec {
	var spec coordinationv1.LeaseSpec
	var transitions int32
	if old != nil {
		spec = *old.DeepCopy()
		transitions = Transitions(old) + 1
	}
	seconds := int32(d / time.Second)
	t := metav1.NewMicroTime(now)
	spec.HolderIdentity = &identity
	spec.LeaseDurationSeconds = &seconds
	spec.AcquireTime = &t
	spec.RenewTime = t.DeepCopy()
	spec.LeaseTransitions = &transitions
	return spec
}

// Released returns the record a release writes over held: no holder,
// the acquisition count kept, and the one-second duration that client-go
// writes on release.
func Released(held *coordinationv1.LeaseSpec, now time.Time) coordinationv1.LeaseSpec {
	spec := *held.DeepCopy()
	empty, one := "", int32(1)
	t := metav1.NewMicroTime(now)
	spec.HolderIdentity = &empty
	spec.LeaseDurationSeconds = &one
	spec.AcquireTime = &t
	spec.RenewTime = t.DeepCopy()
	return spec
}

// Change says how a Lease read now differs from an acquisition.
type Change int

// The values of Change, in the order Compare checks them.
const (
	// Same: the record is still the acquisition (renewals and other
	// fields may differ).
	Same Change = iota
	// Deleted: the Lease does not exist.
	Deleted
	// Replaced: the Lease was deleted and recreated (another UID).
	Replaced
	// Taken: the record names another holder or another acquisition
	// (another holderIdentity, including none, or leaseTransitions).
	Taken
)

// Compare compares the Lease as read now, cur (nil when it does not
// exist), with the acquisition ours.
func Compare(ours, cur *coordinationv1.Lease) Change {
	switch {
	case cur == nil:
		return Deleted
	case cur.UID != ours.UID:
		return Replaced
	case Holder(&cur.Spec) != Holder(&ours.Spec) || Transitions(&cur.Spec) != Transitions(&ours.Spec):
		return Taken
	}
	return Same
}
