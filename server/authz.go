package server

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"
	"sigs.k8s.io/yaml"

	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
	"github.com/fencer-dev/fencer/ring"
	"github.com/fencer-dev/fencer/token"
)

// Grants is what one principal may do, as name patterns. A pattern is a
// name, matched exactly, or a prefix followed by "*", matching every name
// that starts with the prefix ("*" alone matches everything). A principal
// with no grant of a kind may do nothing of that kind.
type Grants struct {
	// Leases are the lease names the principal may acquire, release,
	// check and list.
	Leases []string `json:"leases,omitempty"`
	// Read are the data keys the principal may read: Get, the compares
	// and reads of a Txn, and the keys ListKeys returns (it skips the
	// others).
	Read []string `json:"read,omitempty"`
	// Write are the data keys the principal may write (Put, Delete, and a
	// Txn's puts and deletes). Write implies Read.
	Write []string `json:"write,omitempty"`
	// Resources are the external resources the principal may Advance.
	Resources []string `json:"resources,omitempty"`
	// Rings are the rings the principal may create, join, leave, release
	// shards in, ask Owns of and read the status of. A ring grant covers
	// the lease names of the ring's shards ("ring:<ring>:<shard>") as a
	// lease grant would: their tokens are checked, released, listed and
	// used in guarded writes like the principal's other leases (the keys
	// written still need write grants).
	Rings []string `json:"rings,omitempty"`
}

// Authorization grants each principal the names it may use, the way etcd's
// RBAC grants key ranges: which leases it may acquire, which data keys it
// may read and write, which resources it may advance. A call that names
// anything outside its principal's grants fails with ErrPermissionDenied
// (gRPC PERMISSION_DENIED) before the store is touched; the error names
// only what the caller itself sent. A principal the Authorization does not
// list may do nothing.
//
// Authorization decides which names a principal may use; it is not what
// fences writes. A granted write still needs the current token of a lease
// held by the same principal.
type Authorization struct {
	principals map[string]grantSet
}

// AuthorizationFile is the file format of LoadAuthorization:
//
//	principals:
//	  alice:
//	    leases: ["orders", "orders-*"]
//	    read: ["*"]
//	    write: ["orders/*"]
//	    resources: ["orders-db"]
//	    rings: ["orders-shards"]
type AuthorizationFile struct {
	// Principals maps each principal to its grants.
	Principals map[string]Grants `json:"principals"`
}

// LoadAuthorization reads an AuthorizationFile in YAML or JSON from path
// (see ParseAuthorization); errors name the file.
func LoadAuthorization(path string) (*Authorization, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("authorization file: %w", err)
	}
	a, err := ParseAuthorization(data)
	if err != nil {
		return nil, fmt.Errorf("authorization file %s: %w", path, err)
	}
	return a, nil
}

// ParseAuthorization parses an AuthorizationFile in YAML or JSON. Unknown
// fields, invalid principals and invalid patterns are errors naming the
// principal and the pattern; a file that grants nothing to anyone is an
// error.
func ParseAuthorization(data []byte) (*Authorization, error) {
	var f AuthorizationFile
	if err := yaml.UnmarshalStrict(data, &f); err != nil {
		return nil, err
	}
	if len(f.Principals) == 0 {
		return nil, errors.New("grants nothing to anyone")
	}
	return NewAuthorization(f.Principals)
}

// NewAuthorization returns the Authorization that grants each principal
// its Grants. It validates principals and patterns like LoadAuthorization.
func NewAuthorization(principals map[string]Grants) (*Authorization, error) {
	a := &Authorization{principals: make(map[string]grantSet, len(principals))}
	for p, g := range principals {
		if err := ValidatePrincipal(p); err != nil {
			return nil, err
		}
		set := grantSet{}
		for _, k := range []struct {
			kind     string
			patterns []string
			into     *[]pattern
		}{
			// write before read, which holds the write patterns
			// too, so that a bad one is reported as write's.
			{"leases", g.Leases, &set.leases},
			{"write", g.Write, &set.write},
			{"read", append(append([]string(nil), g.Read...), g.Write...), &set.read},
			{"resources", g.Resources, &set.resources},
			{"rings", g.Rings, &set.rings},
		} {
			for _, s := range k.patterns {
				pat, err := parsePattern(s)
				if err != nil {
					return nil, fmt.Errorf("principal %q: %s: %w", p, k.kind, err)
				}
				*k.into = append(*k.into, pat)
			}
		}
		a.principals[p] = set
	}
	return a, nil
}

type grantSet struct {
	leases, read, write, resources, rings []pattern
}

// pattern is a parsed grant pattern: prefix holds when the pattern ended
// in "*".
type pattern struct {
	name   string
	prefix bool
}

func parsePattern(s string) (pattern, error) {
	name, prefix := strings.CutSuffix(s, "*")
	switch {
	case s == "":
		return pattern{}, errors.New("empty pattern")
	case strings.Contains(name, "*"):
		return pattern{}, fmt.Errorf("pattern %q: \"*\" may only end a pattern", s)
	}
	return pattern{name: name, prefix: prefix}, nil
}

func (p pattern) match(name string) bool {
	if p.prefix {
		return strings.HasPrefix(name, p.name)
	}
	return name == p.name
}

func matchAny(patterns []pattern, name string) bool {
	for _, p := range patterns {
		if p.match(name) {
			return true
		}
	}
	return false
}

// Allowed reports whether principal may use name as a thing of kind:
// "lease", "read", "write", "resource" or "ring". Any other kind is
// refused. A ring grant also allows the lease names of the ring's shards.
func (a *Authorization) Allowed(principal, kind, name string) bool {
	g := a.principals[principal]
	switch kind {
	case "lease":
		if r, _, ok := ring.ParseShardLease(name); ok && matchAny(g.rings, r) {
			return true
		}
		return matchAny(g.leases, name)
	case "ring":
		return matchAny(g.rings, name)
	case "read":
		return matchAny(g.read, name)
	case "write":
		return matchAny(g.write, name)
	case "resource":
		return matchAny(g.resources, name)
	}
	return false
}

// denied is the error for principal using name as kind outside its grants.
func denied(principal, kind, name string) error {
	return fmt.Errorf("%w: principal %q has no %s grant for %q", ErrPermissionDenied, principal, kind, name)
}

// authorize checks the names req carries against principal's grants,
// before the handler runs. It returns nil for a request that names nothing
// (sessions, keepalives and watches are bound to their principal by the
// session itself), and for every request when a is nil.
func (a *Authorization) authorize(principal string, req any) error {
	if a == nil {
		return nil
	}
	need := func(kind, name string) error {
		if a.Allowed(principal, kind, name) {
			return nil
		}
		return denied(principal, kind, name)
	}
	leaseOf := func(text string) error {
		tok, err := token.Parse(text)
		if err != nil {
			return nil // the handler reports the malformed token
		}
		return need("lease", tok.Lease)
	}
	switch r := req.(type) {
	case *fencerv1.AcquireRequest:
		return need("lease", r.GetName())
	case *fencerv1.ReleaseRequest:
		if t := r.GetToken(); t != "" {
			return leaseOf(t)
		}
	case *fencerv1.CheckRequest:
		return leaseOf(r.GetToken())
	case *fencerv1.AdvanceRequest:
		return need("resource", r.GetResource())
	case *fencerv1.PutRequest:
		return need("write", r.GetKey())
	case *fencerv1.PutManyRequest:
		return nil // PutMany authorizes each put on its own, so that one refused fails alone
	case *fencerv1.DeleteRequest:
		return need("write", r.GetKey())
	case *fencerv1.GetRequest:
		return need("read", r.GetKey())
	case *fencerv1.TxnRequest:
		return a.authorizeTxn(need, r)
	case *fencerv1.CreateRingRequest:
		return need("ring", r.GetRing())
	case *fencerv1.JoinRingRequest:
		return need("ring", r.GetRing())
	case *fencerv1.ReleaseShardsRequest:
		return need("ring", r.GetRing())
	case *fencerv1.LeaveRingRequest:
		return need("ring", r.GetRing())
	case *fencerv1.OwnsRequest:
		return need("ring", r.GetRing())
	case *fencerv1.RingStatusRequest:
		return need("ring", r.GetRing())
	}
	return nil
}

func (a *Authorization) authorizeTxn(need func(kind, name string) error, r *fencerv1.TxnRequest) error {
	for _, c := range r.GetCompares() {
		if err := need("read", c.GetKey()); err != nil {
			return err
		}
	}
	for _, ops := range [][]*fencerv1.Op{r.GetSuccess(), r.GetFailure()} {
		for _, op := range ops {
			var err error
			switch {
			case op.GetPut() != nil:
				err = need("write", op.GetPut().GetKey())
			case op.GetDelete() != nil:
				err = need("write", op.GetDelete().GetKey())
			case op.GetGet() != nil:
				err = need("read", op.GetGet().GetKey())
			}
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// otherPrincipal stands for a holder of another principal in what a
// caller is told.
const otherPrincipal = "another principal"

// anotherPrincipalsLease stands for the lease of another principal that
// owns a key or resource, in what a caller is told.
const anotherPrincipalsLease = "a lease of another principal"

// hideOthers keeps a refusal from telling a caller about another
// principal's lease: an acquisition through a session that is not the
// caller's is refused as such (PERMISSION_DENIED) even when the lease was
// held, a held lease's holder is named only when it is the caller's, and
// a key or resource of another lease names that lease only when the
// caller may use it.
func (s *Server) hideOthers(ctx context.Context, principal string, req any, err error) error {
	if err == nil {
		return nil // the common case, without errors.As's allocations
	}
	var foreign *token.ForeignLeaseError
	if errors.As(err, &foreign) && s.authz != nil && !s.authz.Allowed(principal, "lease", foreign.Got) {
		return &token.ForeignLeaseError{Want: foreign.Want, Got: anotherPrincipalsLease}
	}
	var held *token.HeldError
	if !errors.As(err, &held) {
		return err
	}
	if r, ok := req.(*fencerv1.AcquireRequest); ok && r.GetSessionId() != 0 {
		if _, serr := s.checkSession(ctx, clientv3.LeaseID(r.GetSessionId()), principal); serr != nil {
			return serr
		}
	}
	if principalOfHolder(held.Holder) != principal {
		return &token.HeldError{Lease: held.Lease, Holder: otherPrincipal}
	}
	return err
}
