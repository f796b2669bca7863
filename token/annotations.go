package token

import (
	"errors"
	"maps"
	"regexp"
	"strconv"
	"strings"
)

// Annotation keys of the object protocol for Kubernetes objects
// (docs/protocol.md).
const (
	// AnnotationLease holds the "namespace/name" of the fence Lease whose
	// token the object currently carries.
	AnnotationLease = "fencer.dev/lease"
	// AnnotationToken holds the current token's Revision in canonical
	// decimal, so admission CEL can compare it with int().
	AnnotationToken = "fencer.dev/token"
	// AnnotationEpoch holds the current token's Epoch, for people and for
	// the live-Lease admission check.
	AnnotationEpoch = "fencer.dev/epoch"
	// MarkSuffix ends the key of a high-water mark: the annotation
	// "<namespace>.<name>" + MarkSuffix holds the greatest revision of the
	// Lease namespace/name that the object carried before another lease
	// took it over. Marks are never removed or lowered, so a takeover never
	// erases the order of the lease it replaced. See MarkKey.
	MarkSuffix = ".mark.fencer.dev/token"
)

// MaxKubeLeaseLen is the longest "namespace/name" a stamp may carry: the
// longest for which MarkKey's prefix is still a valid annotation key
// prefix (a DNS subdomain of at most 253 characters).
const MaxKubeLeaseLen = 253 - len(MarkSuffix) + len("/token")

// The formats the object protocol accepts, and the admission policy in
// deploy/admission with them (a differential test holds the two together).
var (
	namespaceRE  = `[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?`
	dnsSubdomain = `[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*`
	kubeLeaseRE  = regexp.MustCompile(`^` + namespaceRE + `/` + dnsSubdomain + `$`)
	markKeyRE    = regexp.MustCompile(`^` + namespaceRE + `\.` + dnsSubdomain + `\.mark\.fencer\.dev/token$`)
)

// ValidateKubeLease checks a lease as carried by a stamp: "namespace/name"
// where namespace is a DNS label of at most 63 characters and name a DNS
// subdomain, together at most MaxKubeLeaseLen characters. It returns a
// *MalformedError otherwise.
func ValidateKubeLease(lease string) error {
	switch {
	case lease == "":
		return malformed("lease", lease, "empty")
	case len(lease) > MaxKubeLeaseLen:
		return malformed("lease", lease, "longer than "+strconv.Itoa(MaxKubeLeaseLen)+" characters")
	case !kubeLeaseRE.MatchString(lease):
		return malformed("lease", lease, `want "namespace/name": a DNS label of at most 63 characters, "/", a DNS subdomain`)
	}
	return nil
}

// MarkKey returns the annotation key of lease's high-water mark:
// "<namespace>.<name>" + MarkSuffix. A namespace holds no dot, so the key
// names exactly one lease. lease must be valid (ValidateKubeLease).
func MarkKey(lease string) string {
	return strings.Replace(lease, "/", ".", 1) + MarkSuffix
}

// IsProtocolKey reports whether key is an annotation of the object
// protocol: the lease, token, epoch or a high-water mark. Fenced writers
// take these from the object they checked, never from the caller.
func IsProtocolKey(key string) bool {
	return key == AnnotationLease || key == AnnotationToken || key == AnnotationEpoch || strings.HasSuffix(key, MarkSuffix)
}

// Stamp writes t's stamp into annotations and returns the map, allocating
// one when annotations is nil. When annotations carry a well-formed stamp
// of another lease, that lease's token is first kept as its high-water
// mark (never lowering a mark already there); a mark of t's own lease is
// raised to t's revision. Other keys are left alone. Stamp does not check
// whether the stamp is allowed; see CheckStamp.
func (t Token) Stamp(annotations map[string]string) map[string]string {
	if annotations == nil {
		annotations = make(map[string]string, 3)
	}
	if prev, ok, err := FromAnnotations(annotations); err == nil && ok && prev.Lease != t.Lease {
		raiseMark(annotations, prev.Lease, prev.Revision)
	}
	if _, ok := annotations[MarkKey(t.Lease)]; ok {
		raiseMark(annotations, t.Lease, t.Revision)
	}
	annotations[AnnotationLease] = t.Lease
	annotations[AnnotationToken] = strconv.FormatInt(t.Revision, 10)
	annotations[AnnotationEpoch] = strconv.FormatUint(t.Epoch, 10)
	return annotations
}

// raiseMark sets lease's mark in annotations to rev unless it already holds
// a greater well-formed one.
func raiseMark(annotations map[string]string, lease string, rev int64) {
	key := MarkKey(lease)
	if cur, err := ParseRevision(annotations[key]); err == nil && cur >= rev {
		return
	}
	annotations[key] = strconv.FormatInt(rev, 10)
}

// Restamp returns the annotations a fenced writer sends over an object
// whose stored annotations are stored: the caller's annotations without
// any protocol key (IsProtocolKey), the protocol keys exactly as stored,
// then t's Stamp. So a caller's object, whatever it carries, can neither
// lower nor drop a stamp or a mark. Neither map is modified.
func (t Token) Restamp(annotations, stored map[string]string) map[string]string {
	out := make(map[string]string, len(annotations)+3)
	for k, v := range annotations {
		if !IsProtocolKey(k) {
			out[k] = v
		}
	}
	maps.Copy(out, protocolKeys(stored))
	return t.Stamp(out)
}

func protocolKeys(annotations map[string]string) map[string]string {
	out := make(map[string]string, 3)
	for k, v := range annotations {
		if IsProtocolKey(k) {
			out[k] = v
		}
	}
	return out
}

// FromAnnotations reads the token stamped in annotations. It returns
// ok == false and no error when none of the lease, token and epoch
// annotations is present. A partial or malformed stamp is a
// *MalformedError naming the annotation. Marks are not read; see Marks.
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
	if err := ValidateKubeLease(lease); err != nil {
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

// Marks reads the high-water marks in annotations, keyed by MarkKey. A
// key that ends in MarkSuffix but names no lease, or a value that is not a
// canonical revision, is a *MalformedError naming the key.
func Marks(annotations map[string]string) (map[string]int64, error) {
	var marks map[string]int64
	for k, v := range annotations {
		if !strings.HasSuffix(k, MarkSuffix) {
			continue
		}
		if len(k) > MaxKubeLeaseLen+len(MarkSuffix) || !markKeyRE.MatchString(k) {
			return nil, malformed(k, k, `want "<namespace>.<name>`+MarkSuffix+`"`)
		}
		rev, err := ParseRevision(v)
		if err != nil {
			return nil, relabel(err, k)
		}
		if marks == nil {
			marks = make(map[string]int64)
		}
		marks[k] = rev
	}
	return marks, nil
}

// CheckStored reports whether annotations are what the object protocol
// lets an object store, whoever writes it: no stamp or a well-formed one,
// well-formed marks, and a current token not below its own lease's mark.
// It returns a *MalformedError or a *StaleError otherwise. The admission
// policy in deploy/admission refuses to store exactly what CheckStored
// refuses.
func CheckStored(annotations map[string]string) error {
	cur, ok, err := FromAnnotations(annotations)
	if err != nil {
		return err
	}
	marks, err := Marks(annotations)
	if err != nil || !ok {
		return err
	}
	if mark := marks[MarkKey(cur.Lease)]; mark > cur.Revision {
		return &StaleError{Token: cur, Newer: Token{Lease: cur.Lease, Revision: mark}}
	}
	return nil
}

// CheckStamp decides whether the holder of held may stamp and write an
// object whose current annotations are existing. It is the pure decision
// of the object protocol and performs no I/O.
//
// It returns a *StaleError when the object carries a greater revision of
// held's lease, as its current stamp or as that lease's high-water mark,
// even with takeover: a takeover never reorders a lease's tokens. It
// returns a *ForeignLeaseError when the object carries another lease's
// stamp and takeover is false, and a *MalformedError when held, the stamp
// or any mark is malformed, even with takeover, since such a stamp cannot
// be ordered. Otherwise (no stamp, or a stamp the holder may replace) it
// returns nil.
//
// CheckStamp alone does not fence: the write must still be conditional on
// the resourceVersion that existing was read at, and must carry the
// protocol keys of existing (Restamp).
func CheckStamp(held Token, existing map[string]string, takeover bool) error {
	if err := held.Validate(); err != nil {
		return err
	}
	if err := ValidateKubeLease(held.Lease); err != nil {
		return err
	}
	cur, ok, err := FromAnnotations(existing)
	if err != nil {
		return err
	}
	marks, err := Marks(existing)
	if err != nil {
		return err
	}
	newer := Token{Lease: held.Lease, Revision: marks[MarkKey(held.Lease)]}
	if ok && cur.Lease == held.Lease && cur.Revision > newer.Revision {
		newer = cur
	}
	if newer.Revision > held.Revision {
		return &StaleError{Token: held, Newer: newer}
	}
	if ok && cur.Lease != held.Lease && !takeover {
		return &ForeignLeaseError{Want: held.Lease, Got: cur.Lease}
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
