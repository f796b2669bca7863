package token

import (
	"cmp"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MaxLeaseLen is the longest lease name a Token may carry, in bytes.
const MaxLeaseLen = 512

// Token is a fencing token: one acquisition of one lease. The zero Token is
// "no token" and is never valid for a write.
type Token struct {
	// Lease identifies the lease: "namespace/name" for a Kubernetes Lease,
	// the lease name for the etcd store.
	Lease string
	// Epoch counts acquisitions of the lease. Informational: order is
	// decided by Revision.
	Epoch uint64
	// Revision is the store revision of the acquiring write. It strictly
	// increases with each acquisition of the lease.
	Revision int64
}

// IsZero reports whether t is the zero Token.
func (t Token) IsZero() bool { return t == Token{} }

// Validate reports whether t could have been issued: a non-empty printable
// lease of at most MaxLeaseLen bytes and a positive revision. It returns a
// *MalformedError otherwise.
func (t Token) Validate() error {
	if err := ValidateLease(t.Lease); err != nil {
		return err
	}
	if t.Revision <= 0 {
		return malformed("revision", strconv.FormatInt(t.Revision, 10), "must be positive")
	}
	return nil
}

// ValidateLease checks a lease name as carried by a Token: non-empty, at
// most MaxLeaseLen bytes, valid UTF-8, no control or space characters. It
// returns a *MalformedError otherwise. Stores restrict names further: the
// etcd store and the service by ValidateName, Kubernetes stamps by
// ValidateKubeLease. Every name ValidateName accepts, ValidateLease
// accepts too.
func ValidateLease(lease string) error {
	if reason := nameProblem(lease, MaxLeaseLen, true); reason != "" {
		return malformed("lease", lease, reason)
	}
	return nil
}

// MaxNameLen is the longest lease or resource name that the etcd store
// (package etcdstore) and the service (packages server and client)
// accept, in bytes.
const MaxNameLen = 253

// ValidateName checks a lease or resource name of the etcd store and the
// service: 1 to MaxNameLen bytes of UTF-8 without "/", spaces or control
// characters. arg names the argument in the *ArgumentError it returns
// otherwise. It is the one name check of the library, the server and the
// client, and it is ValidateLease's check with the shorter limit and "/"
// refused, so a name it accepts always makes a valid Token.
func ValidateName(arg, name string) error {
	if reason := nameProblem(name, MaxNameLen, false); reason != "" {
		return InvalidArgument(arg, name, reason)
	}
	return nil
}

// nameProblem is the one implementation of ValidateLease and ValidateName:
// it returns what is wrong with name, or "" when nothing is.
func nameProblem(name string, maxLen int, slashOK bool) string {
	switch {
	case name == "":
		return "empty"
	case len(name) > maxLen:
		return "longer than " + strconv.Itoa(maxLen) + " bytes"
	case !utf8.ValidString(name):
		return "not valid UTF-8"
	case !slashOK && strings.Contains(name, "/"):
		return `contains the key separator "/"`
	case strings.IndexFunc(name, func(r rune) bool { return unicode.IsControl(r) || unicode.IsSpace(r) }) >= 0:
		return "contains a space or control character"
	}
	return ""
}

// Compare orders two tokens of the same lease by Revision, then Epoch. It
// returns -1, 0 or +1 like cmp.Compare, or a *ForeignLeaseError when the
// tokens belong to different leases, since such tokens have no order.
func (t Token) Compare(u Token) (int, error) {
	if t.Lease != u.Lease {
		return 0, &ForeignLeaseError{Want: t.Lease, Got: u.Lease}
	}
	if c := cmp.Compare(t.Revision, u.Revision); c != 0 {
		return c, nil
	}
	return cmp.Compare(t.Epoch, u.Epoch), nil
}

// String returns the version 1 text form, "v1:<epoch>:<revision>:<lease>".
func (t Token) String() string {
	return textPrefix + strconv.FormatUint(t.Epoch, 10) + ":" + strconv.FormatInt(t.Revision, 10) + ":" + t.Lease
}

const textPrefix = "v1:"

// Parse parses the text form produced by String. It accepts only canonical
// input, so String(Parse(s)) == s for every s it accepts, and returns a
// *MalformedError for anything else, including a valid form of an unknown
// version.
func Parse(s string) (Token, error) {
	rest, ok := strings.CutPrefix(s, textPrefix)
	if !ok {
		version, _, _ := strings.Cut(s, ":")
		return Token{}, malformed("version", version, `want "v1"`)
	}
	parts := strings.SplitN(rest, ":", 3)
	if len(parts) != 3 {
		return Token{}, malformed("token", s, `want "v1:<epoch>:<revision>:<lease>"`)
	}
	epoch, err := ParseEpoch(parts[0])
	if err != nil {
		return Token{}, err
	}
	rev, err := ParseRevision(parts[1])
	if err != nil {
		return Token{}, err
	}
	t := Token{Lease: parts[2], Epoch: epoch, Revision: rev}
	if err := t.Validate(); err != nil {
		return Token{}, err
	}
	return t, nil
}

// ParseRevision parses a canonical decimal revision: at least 1, no sign, no
// leading zeros, within int64.
func ParseRevision(s string) (int64, error) {
	if err := canonicalDecimal("revision", s); err != nil {
		return 0, err
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, malformed("revision", s, "out of range")
	}
	if v <= 0 {
		return 0, malformed("revision", s, "must be positive")
	}
	return v, nil
}

// ParseEpoch parses a canonical decimal epoch: no sign, no leading zeros,
// within uint64.
func ParseEpoch(s string) (uint64, error) {
	if err := canonicalDecimal("epoch", s); err != nil {
		return 0, err
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, malformed("epoch", s, "out of range")
	}
	return v, nil
}

func canonicalDecimal(field, s string) error {
	switch {
	case s == "":
		return malformed(field, s, "empty")
	case strings.Trim(s, "0123456789") != "":
		return malformed(field, s, "not a decimal integer")
	case len(s) > 1 && s[0] == '0':
		return malformed(field, s, "leading zero")
	}
	return nil
}

// MarshalText implements encoding.TextMarshaler with the text form. It
// refuses an invalid token.
func (t Token) MarshalText() ([]byte, error) {
	if err := t.Validate(); err != nil {
		return nil, err
	}
	return []byte(t.String()), nil
}

// UnmarshalText implements encoding.TextUnmarshaler with Parse. On error t
// is left unchanged.
func (t *Token) UnmarshalText(b []byte) error {
	u, err := Parse(string(b))
	if err != nil {
		return err
	}
	*t = u
	return nil
}
