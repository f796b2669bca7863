package kubeadapter

import (
	"maps"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/fencer-dev/fencer/token"
)

// This file holds the pure part of the elector: what a Lease record means
// and what an acquisition writes. It performs no I/O and reads no clock.

// The label that marks a Lease as a fence.
const (
	// FenceLabel is the key of the label that an Elector sets, with value
	// FenceLabelValue, on the Lease in the write that creates or acquires
	// it, whatever labels the Lease had before. The live-Lease admission
	// policy (deploy/admission/live-lease.yaml) takes the Leases that carry
	// this label as its parameters; a Lease without it is never consulted.
	FenceLabel = "fencer.dev/fence"
	// FenceLabelValue is the value of FenceLabel on a fence Lease.
	FenceLabelValue = "true"
)

// fenceLabels returns a copy of labels with the labels of extra and
// FenceLabel=FenceLabelValue set, so that a map shared with the caller or
// a cache is never written to.
func fenceLabels(labels, extra map[string]string) map[string]string {
	out := maps.Clone(labels)
	if out == nil {
		out = make(map[string]string, 1+len(extra))
	}
	maps.Copy(out, extra)
	out[FenceLabel] = FenceLabelValue
	return out
}

// TokenOf returns the token that lease carries: Lease "namespace/name",
// Epoch leaseTransitions and Revision the object's resourceVersion, parsed
// as a decimal integer (Kubernetes 1.35 and later let clients compare
// resourceVersions as integers). It is the acquisition token only when
// lease is the object returned by the acquiring write; TokenOf does not
// check who holds the Lease.
func TokenOf(lease *coordinationv1.Lease) (token.Token, error) {
	rev, err := token.ParseRevision(lease.ResourceVersion)
	if err != nil {
		return token.Token{}, err
	}
	t := token.Token{Lease: lease.Namespace + "/" + lease.Name, Revision: rev}
	if n := lease.Spec.LeaseTransitions; n != nil && *n > 0 {
		t.Epoch = uint64(*n)
	}
	return t, nil
}

// holderOf returns the holderIdentity of spec, or "".
func holderOf(spec *coordinationv1.LeaseSpec) string {
	if spec.HolderIdentity == nil {
		return ""
	}
	return *spec.HolderIdentity
}

// transitionsOf returns the leaseTransitions of spec, or 0.
func transitionsOf(spec *coordinationv1.LeaseSpec) int32 {
	if spec.LeaseTransitions == nil {
		return 0
	}
	return *spec.LeaseTransitions
}

// durationOf returns the leaseDurationSeconds of spec as a duration, or 0.
func durationOf(spec *coordinationv1.LeaseSpec) time.Duration {
	if spec.LeaseDurationSeconds == nil {
		return 0
	}
	return time.Duration(*spec.LeaseDurationSeconds) * time.Second
}

// acquiredSpec returns the record an acquisition by identity writes over
// old (nil when the Lease does not exist yet). It keeps old's other fields,
// names identity as holder, sets both timestamps to now and counts the
// acquisition in leaseTransitions: 0 on create, as client-go does, and
// old+1 on every acquisition of an existing Lease, even by the identity
// already named. An overflowing count is rejected by the API server's
// validation rather than wrapped silently.
func acquiredSpec(old *coordinationv1.LeaseSpec, identity string, d time.Duration, now time.Time) coordinationv1.LeaseSpec {
	var spec coordinationv1.LeaseSpec
	var transitions int32
	if old != nil {
		spec = *old.DeepCopy()
		transitions = transitionsOf(old) + 1
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

// releasedSpec returns the record a release writes over held: no holder,
// the acquisition count kept, and the one-second duration that client-go
// writes on release.
func releasedSpec(held *coordinationv1.LeaseSpec, now time.Time) coordinationv1.LeaseSpec {
	spec := *held.DeepCopy()
	empty, one := "", int32(1)
	t := metav1.NewMicroTime(now)
	spec.HolderIdentity = &empty
	spec.LeaseDurationSeconds = &one
	spec.AcquireTime = &t
	spec.RenewTime = t.DeepCopy()
	return spec
}

// lossReason compares the Lease as read now with the acquisition ours and
// returns nil when cur is still that acquisition, or the reason sentinel
// saying why it is not. A nil cur means the Lease does not exist.
func lossReason(ours, cur *coordinationv1.Lease) error {
	switch {
	case cur == nil:
		return ErrLeaseDeleted
	case cur.UID != ours.UID:
		return ErrLeaseReplaced
	case holderOf(&cur.Spec) != holderOf(&ours.Spec) || transitionsOf(&cur.Spec) != transitionsOf(&ours.Spec):
		return ErrLeaseTaken
	}
	return nil
}

// observation is what a candidate last saw of the Lease and when, on its
// own clock. Expiry is judged from the local time a change was observed,
// as client-go does, never from the timestamps in the record, so neither
// clock skew nor a renewTime in the future extends a holder's lease.
type observation struct {
	uid  types.UID
	spec coordinationv1.LeaseSpec
	at   time.Time
	seen bool
}

// observe records cur as seen at now. The observation time moves only when
// the record differs from the one seen before (another UID or another
// spec).
func (o *observation) observe(cur *coordinationv1.Lease, now time.Time) {
	if o.seen && o.uid == cur.UID && apiequality.Semantic.DeepEqual(o.spec, cur.Spec) {
		return
	}
	*o = observation{uid: cur.UID, spec: *cur.Spec.DeepCopy(), at: now, seen: true}
}

// live reports whether the observed holder's lease is still running at
// now: less than its leaseDurationSeconds has passed since the record last
// changed.
func (o *observation) live(now time.Time) bool {
	return o.seen && o.at.Add(durationOf(&o.spec)).After(now)
}

// mayAcquire decides whether identity may acquire cur, given whether the
// observed lease is live. It returns nil when the Lease is free (no
// holder), names identity itself (a previous acquisition of this Elector)
// or has expired, and a *token.HeldError otherwise.
func mayAcquire(cur *coordinationv1.Lease, identity string, live bool) error {
	holder := holderOf(&cur.Spec)
	if holder == "" || holder == identity || !live {
		return nil
	}
	return &token.HeldError{Lease: cur.Namespace + "/" + cur.Name, Holder: holder}
}
