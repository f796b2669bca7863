package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// layoutDirs are the key spaces a Store keeps under its prefix; a key
// under prefix+dir for any of them shows that a deployment uses prefix.
var layoutDirs = []string{"leases/", "epochs/", "fences/", "owners/", "delays/"}

// NestedPrefixError reports a prefix that lies inside the key space of
// another deployment found in etcd: that deployment's guarded writes of its
// own data keys could then write this prefix's holder, epoch and fence
// keys, forging or invalidating its tokens.
type NestedPrefixError struct {
	// Prefix is the prefix that was refused.
	Prefix string
	// Outer is the other deployment's prefix, a proper ancestor of Prefix
	// under which etcd holds a lease, epoch, fence, owner or lock-delay key.
	Outer string
}

func (e *NestedPrefixError) Error() string {
	return fmt.Sprintf("etcdstore: prefix %q lies inside the key space of the deployment with prefix %q in the same etcd; prefixes of deployments sharing an etcd must not be nested", e.Prefix, e.Outer)
}

// CheckPrefix returns a *NestedPrefixError if prefix lies inside the
// data, owner or lock-delay key space of another deployment: if, for a
// proper ancestor A of prefix at a "/" boundary (for "/a/data/b/": "/" and
// "/a/"), prefix begins with A+"data/", A+"owners/" or A+"delays/", and
// etcd holds a Store's layout under A, that is any key under its leases/,
// epochs/, fences/, owners/ or delays/. Those are the key spaces whose keys
// A's clients choose with further "/" levels below them: a deployment at
// A+"delays/" would hold A's lock-delay claim keys (delays/<lease>/claim)
// among its own keys, and could delete them. A prefix under A's other key
// spaces (or beside them) is not written by A and is not refused. It reads only key counts, and only what cli's etcd user may
// read: a range it may not read counts as empty. It cannot catch the
// reverse order, a deployment started later at an ancestor of prefix, nor
// a deployment that has not written a key yet, nor one its user cannot
// see. Prefixes of deployments sharing an etcd must never be nested;
// etcd's own RBAC, one user per deployment confined to its prefix, is
// what isolates them (docs/operations.md).
func CheckPrefix(ctx context.Context, cli *clientv3.Client, prefix string) error {
	for i := 0; i < len(prefix)-1; i++ {
		if prefix[i] != '/' {
			continue
		}
		outer, rest := prefix[:i+1], prefix[i+1:]
		if !strings.HasPrefix(rest, "data/") && !strings.HasPrefix(rest, "owners/") && !strings.HasPrefix(rest, "delays/") {
			continue
		}
		for _, dir := range layoutDirs {
			resp, err := cli.Get(ctx, outer+dir, clientv3.WithPrefix(), clientv3.WithCountOnly(), clientv3.WithLimit(1))
			if errors.Is(rpctypes.Error(err), rpctypes.ErrPermissionDenied) {
				continue // out of this etcd user's sight
			}
			if err != nil {
				return fmt.Errorf("etcdstore: check prefix %q: %w", prefix, err)
			}
			if resp.Count > 0 {
				return &NestedPrefixError{Prefix: prefix, Outer: outer}
			}
		}
	}
	return nil
}
