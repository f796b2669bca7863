package token

import (
	"errors"
	"strconv"
)

// Annotation keys of the object protocol for Kubernetes objects.
const (
	// AnnotationLease holds the "namespace/name" of the fence Lease.
	AnnotationLease = "fencer.dev/lease"
	// AnnotationToken holds the token's Revision in canonical decimal, so
	// admission CEL can compare it with int().
	AnnotationToken = "fencer.dev/token"
	// AnnotationEpoch holds the token's Epoch, for people.
	AnnotationEpoch = "fencer.dev/epoch"
)

// Stamp writes t's annotations into annotations and returns the map,
// allocating one when annotations is nil. Other keys are left alone. Stamp
// does not check whether the stamp is allowed; see CheckStamp.
func (t Token) Stamp(annotations map[string]string) map[string]string {
	if annotations == nil {
		annotations = make(map[string]string, 3)
	}
	annotations[AnnotationLease] = t.Lease
	annotations[AnnotationToken] = strconv.FormatInt(t.Revision, 10)
	annotations[AnnotationEpoch] = strconv.FormatUint(t.Epoch, 10)
	return annotations
}

// FromAnnotations reads the token stamped in annotations. It returns
// ok == false and no error when none of the fencer annotations is present.
// A partial or malformed stamp is a *MalformedError naming the annotation.
func FromAnnotations(annotations map[string]string) (t Token, ok bool, err error) {
	lease, hasLease := annotations[AnnotationLease]
	rev, hasRev := annotations[AnnotationToken]
	epoch, hasEpoch := annotations[AnnotationEpoch]
	if !hasLease && !hasRev && !hasEpoch {
		return Token{}, false, nil
	}
	if !hasLease {
		return Token{}, false, malformed(AnnotationLease, "", "missing")
	}
	if !hasRev {
		return Token{}, false, malformed(AnnotationToken, "", "missing")
	}
	if err := ValidateLease(lease); err != nil {
		return Token{}, false, relabel(err, AnnotationLease)
	}
	t = Token{Lease: lease}
	if t.Revision, err = ParseRevision(rev); err != nil {
		return Token{}, false, relabel(err, AnnotationToken)
	}
	if hasEpoch {
		if t.Epoch, err = ParseEpoch(epoch); err != nil {
			return Token{}, false, relabel(err, AnnotationEpoch)
		}
	}
	return t, true, nil
}

// CheckStamp decides whether the holder of held may stamp and write an
// object whose current annotations are existing. It is the pure decision
// of the object protocol and performs no I/O.
//
// It returns nil when the object carries no fencer stamp, or a stamp of the
// same lease whose revision is not greater than held's. It returns a
// *StaleError when the object carries a greater token of the same lease, a
// *ForeignLeaseError when it carries another lease's stamp and takeover is
// false, and a *MalformedError when the stamp is malformed. A malformed
// stamp is refused even with takeover, since it cannot be ordered.
//
// CheckStamp alone does not fence: the write must still be conditional on
// the resourceVersion that existing was read at.
func CheckStamp(held Token, existing map[string]string, takeover bool) error {
	if err := held.Validate(); err != nil {
		return err
	}
	cur, ok, err := FromAnnotations(existing)
	if err != nil || !ok {
		return err
	}
	if cur.Lease != held.Lease {
		if takeover {
			return nil
		}
		return &ForeignLeaseError{Want: held.Lease, Got: cur.Lease}
	}
	if cur.Revision > held.Revision {
		return &StaleError{Token: held, Newer: cur}
	}
	return nil
}

// relabel names the annotation key as the field of a *MalformedError.
func relabel(err error, field string) error {
	var m *MalformedError
	if errors.As(err, &m) {
		return malformed(field, m.Input, m.Reason)
	}
	return err
}
