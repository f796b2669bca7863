package kubeadapter

import (
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/types"

	"github.com/fencer-dev/fencer/kubeadapter/internal/leaserecord"
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
	FenceLabel = leaserecord.FenceLabel
	// FenceLabelValue is the value of FenceLabel on a fence Lease.
	FenceLabelValue = leaserecord.FenceLabelValue
)

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

// lossReason compares the Lease as read now with the acquisition ours and
// returns nil when cur is still that acquisition, or the reason sentinel
// saying why it is not. A nil cur means the Lease does not exist.
func lossReason(ours, cur *coordinationv1.Lease) error {
	switch leaserecord.Compare(ours, cur) {
	case leaserecord.Deleted:
		return ErrLeaseDeleted
	case leaserecord.Replaced:
		return ErrLeaseReplaced
	case leaserecord.Taken:
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
	return o.seen && o.at.Add(leaserecord.Duration(&o.spec)).After(now)
}

// mayAcquire decides whether identity may acquire cur, given whether the
// observed lease is live. It returns nil when the Lease is free (no
// holder), names identity itself (a previous acquisition of this Elector)
// or has expired, and a *token.HeldError otherwise.
func mayAcquire(cur *coordinationv1.Lease, identity string, live bool) error {
	holder := leaserecord.Holder(&cur.Spec)
	if holder == "" || holder == identity || !live {
		return nil
	}
	return &token.HeldError{Lease: cur.Namespace + "/" + cur.Name, Holder: holder}
}
