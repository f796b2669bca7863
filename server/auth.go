package server

import (
	"bufio"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"strings"
	"unicode"
	"unicode/utf8"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
)

// MaxPrincipalLen is the longest principal name, in bytes.
const MaxPrincipalLen = 128

// MinBearerTokenLen is the shortest bearer token a token file may hold.
const MinBearerTokenLen = 16

// Authenticator decides who is calling. Authenticate returns the caller's
// principal, or an error wrapping ErrUnauthenticated. A principal is 1 to
// MaxPrincipalLen bytes of printable UTF-8 without "/" or spaces; the server
// binds every session to the principal that opened it. A stream is
// authenticated once, when it opens; only TokenFile's streams are checked
// again, on each reload of its file (see TokenFile).
type Authenticator interface {
	Authenticate(ctx context.Context) (string, error)
}

// revocable is an Authenticator whose credentials can be withdrawn while a
// stream they authenticated runs. whileValid returns a context that is
// ctx until the stream's credentials no longer authenticate principal,
// and is then cancelled with a cause wrapping ErrUnauthenticated.
type revocable interface {
	whileValid(ctx context.Context, principal string) (valid context.Context, stop func())
}

// ValidatePrincipal checks a principal name.
func ValidatePrincipal(p string) error {
	switch {
	case p == "":
		return fmt.Errorf("principal is empty")
	case len(p) > MaxPrincipalLen:
		return fmt.Errorf("principal %.32q is longer than %d bytes", p, MaxPrincipalLen)
	case !utf8.ValidString(p):
		return fmt.Errorf("principal %.32q is not valid UTF-8", p)
	case strings.ContainsRune(p, '/'),
		strings.IndexFunc(p, func(r rune) bool { return !unicode.IsPrint(r) || unicode.IsSpace(r) }) >= 0:
		return fmt.Errorf("principal %.32q contains \"/\", a space or a non-printable character", p)
	}
	return nil
}

// Anonymous admits every caller as one fixed principal. It is for a server
// that only trusted local processes can reach; it authenticates nobody.
type Anonymous string

// Authenticate returns the fixed principal.
func (a Anonymous) Authenticate(context.Context) (string, error) { return string(a), nil }

// BearerTokens authenticates calls by the "authorization: Bearer <token>"
// metadata (the scheme in any case, one space before the token) against a
// fixed set of tokens. Tokens are compared by their SHA-256 digest, so
// lookup time does not depend on how much of a token matches. It does not expire or rotate tokens; TokenFile reloads a
// token file when it changes.
type BearerTokens struct {
	principals map[[sha256.Size]byte]string
}

// LoadTokenFile reads a token file: one "<token> <principal>" pair per line,
// separated by spaces or tabs; blank lines and lines starting with "#" are
// ignored. Tokens must be at least MinBearerTokenLen bytes and unique.
func LoadTokenFile(path string) (*BearerTokens, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("token file: %w", err)
	}
	defer f.Close()
	return parseTokenFile(path, f)
}

// parseTokenFile parses a token file's content; path is for errors.
func parseTokenFile(path string, r io.Reader) (*BearerTokens, error) {
	b := &BearerTokens{principals: map[[sha256.Size]byte]string{}}
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) != 2 {
			return nil, fmt.Errorf("token file %s:%d: want \"<token> <principal>\"", path, n)
		}
		if err := b.add(fields[0], fields[1]); err != nil {
			return nil, fmt.Errorf("token file %s:%d: %w", path, n, err)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("token file: %w", err)
	}
	if len(b.principals) == 0 {
		return nil, fmt.Errorf("token file %s holds no tokens", path)
	}
	return b, nil
}

// NewBearerTokens returns an Authenticator for the given token → principal
// pairs, with the rules of LoadTokenFile.
func NewBearerTokens(tokens map[string]string) (*BearerTokens, error) {
	b := &BearerTokens{principals: map[[sha256.Size]byte]string{}}
	for tok, p := range tokens {
		if err := b.add(tok, p); err != nil {
			return nil, err
		}
	}
	return b, nil
}

func (b *BearerTokens) add(tok, principal string) error {
	if len(tok) < MinBearerTokenLen {
		return fmt.Errorf("server: bearer token shorter than %d bytes", MinBearerTokenLen)
	}
	if err := ValidatePrincipal(principal); err != nil {
		return err
	}
	h := sha256.Sum256([]byte(tok))
	if _, dup := b.principals[h]; dup {
		return fmt.Errorf("server: duplicate bearer token")
	}
	b.principals[h] = principal
	return nil
}

// Authenticate returns the principal of the call's bearer token.
func (b *BearerTokens) Authenticate(ctx context.Context) (string, error) {
	vals := metadata.ValueFromIncomingContext(ctx, "authorization") // not a copy of all the metadata
	if len(vals) != 1 {
		return "", fmt.Errorf("%w: want one \"authorization: Bearer <token>\" header", ErrUnauthenticated)
	}
	// The scheme is case-insensitive (RFC 7235, section 2.1).
	const scheme = "Bearer "
	v := vals[0]
	if len(v) < len(scheme) || !strings.EqualFold(v[:len(scheme)], scheme) {
		return "", fmt.Errorf("%w: authorization is not a bearer token", ErrUnauthenticated)
	}
	p, ok := b.principals[sha256.Sum256([]byte(v[len(scheme):]))]
	if !ok {
		return "", fmt.Errorf("%w: unknown bearer token", ErrUnauthenticated)
	}
	return p, nil
}

// ClientCertificates authenticates calls by their verified TLS client
// certificate: the principal is the subject common name of the chain's
// leaf, which must be a valid principal (see ValidatePrincipal); a call
// without a verified chain fails with ErrUnauthenticated. Verification is
// the TLS layer's (against ClientCAs, or the system's roots when that is
// nil), so Config.Validate accepts ClientCertificates only with a
// tls.Config that verifies client certificates.
//
// It does not check revocation, and it trusts every CA in ClientCAs alike:
// any certificate they issue with common name X is principal X. Subject
// alternative names are ignored.
type ClientCertificates struct{}

// Authenticate returns the common name of the verified client certificate.
func (ClientCertificates) Authenticate(ctx context.Context) (string, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return "", fmt.Errorf("%w: no peer", ErrUnauthenticated)
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.VerifiedChains) == 0 || len(ti.State.VerifiedChains[0]) == 0 {
		return "", fmt.Errorf("%w: no verified client certificate", ErrUnauthenticated)
	}
	cn := ti.State.VerifiedChains[0][0].Subject.CommonName
	if err := ValidatePrincipal(cn); err != nil {
		return "", fmt.Errorf("%w: client certificate: %w", ErrUnauthenticated, err)
	}
	return cn, nil
}

type principalKey struct{}

func withPrincipal(ctx context.Context, p string) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// principalOf returns the principal the interceptor authenticated.
func principalOf(ctx context.Context) string {
	p, _ := ctx.Value(principalKey{}).(string)
	return p
}
