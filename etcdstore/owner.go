package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencer-dev/fencer/token"
)

// Keys belong to leases.
//
// Every data key has an owner: the lease whose name <prefix>owners/<key>
// holds. A guarded write of a data key (Put, Delete, or a Txn that puts or
// deletes it) commits only if its token is current (the guard) and, in
// the same etcd Txn, its lease owns the key or nobody does; a write that
// finds no owner records its own lease as the owner. So once lease L has
// written a key, a holder of another lease cannot overwrite or delete it,
// however current its own token: it gets a *token.ForeignLeaseError and
// nothing changes. The owner record outlives a Delete, so a deleted key
// stays L's and nobody else can recreate it.
//
// Only an explicit takeover (the TakeOver write option) moves a key to
// another lease. It is fenced like any other write: it commits only while
// the taker's token is current, and it then records the taker's lease as
// owner, after which the previous owner's writes are refused in turn.
//
// Advance resources follow the same rule with no extra key: the token
// recorded in <prefix>fences/<resource> names the lease that owns it.

// WriteOption modifies one guarded write: Put, Delete, Txn or Advance.
type WriteOption func(*writeOptions)

type writeOptions struct {
	takeOver bool
}

func writeOpts(opts []WriteOption) writeOptions {
	var o writeOptions
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// TakeOver makes a write take over the data keys it writes (or the
// resource it advances) from whichever lease owns them, instead of
// failing with a *token.ForeignLeaseError. The takeover is fenced like any
// other write: it commits only if the writer's token is its lease's
// current token, checked in the same etcd Txn, and it records the
// writer's lease as the new owner, so the previous owner's later writes
// are refused. A Txn with TakeOver takes over every data key that the
// branch which runs puts or deletes. Taking over a key the lease already
// owns, or one nobody owns, is an ordinary write.
func TakeOver() WriteOption { return func(o *writeOptions) { o.takeOver = true } }

func (s *Store) ownerKey(key string) string { return s.prefix + "owners/" + key }

// OwnerKey returns the etcd key that records which lease owns the data key
// key: its value is the owning lease's name. Only guarded writes of key
// write it.
func (s *Store) OwnerKey(key string) string { return s.ownerKey(key) }

// Owner returns the name of the lease that owns the data key key; ok is
// false when no guarded write has written key yet. The answer may be
// stale when it returns; the guarded writes check ownership themselves.
func (s *Store) Owner(ctx context.Context, key string) (lease string, ok bool, err error) {
	if err := ValidateKey(key); err != nil {
		return "", false, err
	}
	resp, err := s.cli.Get(ctx, s.ownerKey(key))
	if err != nil {
		return "", false, fmt.Errorf("etcdstore: owner of %q: %w", key, err)
	}
	if len(resp.Kvs) == 0 {
		return "", false, nil
	}
	return string(resp.Kvs[0].Value), true, nil
}

// writeKey runs op, a put or delete of the data key key, in one guarded
// etcd Txn under the ownership rule, and returns op's response and the
// revision of the write. It returns a *token.StaleError when tok is not
// current and a *token.ForeignLeaseError when another lease owns key (and
// takeOver is false).
//
// The Txn takes one of three shapes, all checked by etcd in the Txn:
//
//   - takeOver: If(guard) Then(Put(owner, lease), op);
//   - key last seen owned by the lease (the common case, and the cheapest
//     for etcd): If(guard, Value(owner) = lease) Then(op);
//   - otherwise, "owned by the lease or by nobody" in one round trip, as
//     a nested Txn that claims an unowned key (ownedOps).
//
// The Txn has no Else branch, which would cost every write; a write that
// fails reads the holder, epoch and owner keys to tell a stale token from
// a wrong guess of the owner. A wrong guess costs those round trips, never
// correctness: the write is retried in the nested shape.
func (s *Store) writeKey(ctx context.Context, tok token.Token, key string, op clientv3.Op, takeOver bool) (*pb.ResponseOp, int64, error) {
	owner := s.ownerKey(key)
	known := !takeOver && s.owners.get(key) == tok.Lease
	for {
		cmps, then := s.guard(tok), []clientv3.Op{op}
		switch {
		case takeOver:
			then = []clientv3.Op{clientv3.OpPut(owner, tok.Lease), op}
		case known:
			cmps = append(cmps, clientv3.Compare(clientv3.Value(owner), "=", tok.Lease))
		default:
			then = s.ownedOps(tok.Lease, key, op)
		}
		resp, err := s.commit(ctx, cmps, then, nil)
		if err != nil {
			return nil, 0, err
		}
		if !resp.Succeeded {
			// Find out why, off the write's own path: an Else branch
			// that read the keys would cost every write.
			why, err := s.cli.Txn(ctx).Then(append(s.staleOps(tok), clientv3.OpGet(owner))...).Commit()
			if err != nil {
				return nil, 0, err
			}
			if !current(tok, why, 0) {
				return nil, 0, staleError(tok, why, 0)
			}
			// The guessed owner was wrong (a token that is not current
			// never becomes current again).
			s.owners.put(key, ownerOf(why.Responses[2]))
			known = false
			continue
		}
		rs := resp.Responses
		switch {
		case takeOver:
			rs = rs[1:]
		case !known:
			if rs, err = ownedResult(tok.Lease, rs); err != nil {
				var fe *token.ForeignLeaseError
				if errors.As(err, &fe) {
					s.owners.put(key, fe.Got)
				}
				return nil, 0, err
			}
		}
		s.owners.put(key, tok.Lease)
		return rs[0], resp.Header.Revision, nil
	}
}

// ownedOps returns the Then branch of a guarded write of the data key key
// by lease: ops, which write key, in a nested Txn that runs them only if
// lease owns key or nobody does, claiming key in the second case:
//
//	If(Value(owner) = lease) Then(ops...)
//	Else(Txn(If(CreateRevision(owner) = 0) Then(Put(owner, lease), ops...) Else(Get(owner))))
//
// etcd evaluates every compare before any write, so each branch sees the
// owner as it was before the Txn.
func (s *Store) ownedOps(lease, key string, ops ...clientv3.Op) []clientv3.Op {
	owner := s.ownerKey(key)
	claim := append([]clientv3.Op{clientv3.OpPut(owner, lease)}, ops...)
	return []clientv3.Op{clientv3.OpTxn(
		[]clientv3.Cmp{clientv3.Compare(clientv3.Value(owner), "=", lease)}, ops,
		[]clientv3.Op{clientv3.OpTxn(
			[]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(owner), "=", 0)}, claim,
			[]clientv3.Op{clientv3.OpGet(owner)})})}
}

// ownedResult reads the responses of the Then branch that ownedOps built:
// those of the wrapped ops, or a *token.ForeignLeaseError naming the
// lease that owns the key.
func ownedResult(lease string, rs []*pb.ResponseOp) ([]*pb.ResponseOp, error) {
	mine := rs[0].GetResponseTxn()
	if mine.GetSucceeded() {
		return mine.GetResponses(), nil
	}
	free := mine.GetResponses()[0].GetResponseTxn()
	if free.GetSucceeded() {
		return free.GetResponses()[1:], nil
	}
	return nil, &token.ForeignLeaseError{Want: lease, Got: ownerOf(free.GetResponses()[0])}
}

// maxOwnerGuesses bounds ownerGuesses; past it the guesses start over.
const maxOwnerGuesses = 1 << 16

// ownerGuesses remembers, per data key, the lease a store last saw owning
// it, so that a write by that lease takes the cheapest Txn. A wrong or
// missing guess costs a round trip or a nested Txn, never correctness.
type ownerGuesses struct {
	mu   sync.Mutex
	seen map[string]string
}

func (g *ownerGuesses) get(key string) string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.seen[key]
}

// put records lease as key's owner; "" forgets the key.
func (g *ownerGuesses) put(key, lease string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if lease == "" {
		delete(g.seen, key)
		return
	}
	if g.seen[key] == lease {
		return
	}
	if _, ok := g.seen[key]; g.seen == nil || (!ok && len(g.seen) >= maxOwnerGuesses) {
		g.seen = map[string]string{}
	}
	g.seen[key] = lease
}

// ownerOf reads the owner key's value from a Get's response; "" if absent.
func ownerOf(r *pb.ResponseOp) string {
	if kvs := r.GetResponseRange().GetKvs(); len(kvs) == 1 {
		return string(kvs[0].Value)
	}
	return ""
}

// dataKeysWritten returns the data keys (without the data prefix) that
// ops put or delete, also inside nested Txns, sorted and without
// duplicates. A delete of a key range that reaches into the data keys is
// refused with an *ArgumentError: the owners of the keys in a range cannot
// be checked in the Txn.
func (s *Store) dataKeysWritten(ops []clientv3.Op) ([]string, error) {
	data := s.prefix + "data/"
	dataEnd := clientv3.GetPrefixRangeEnd(data)
	var keys []string
	var walk func(ops []clientv3.Op) error
	walk = func(ops []clientv3.Op) error {
		for _, op := range ops {
			switch {
			case op.IsTxn():
				_, then, els := op.Txn()
				if err := walk(then); err != nil {
					return err
				}
				if err := walk(els); err != nil {
					return err
				}
			case op.IsPut(), op.IsDelete():
				key, end := string(op.KeyBytes()), string(op.RangeBytes())
				if end != "" {
					if key < dataEnd && (end == "\x00" || end > data) {
						return invalid("op", key, "deletes a key range that includes data keys, whose owners cannot be checked")
					}
					continue
				}
				if k, ok := strings.CutPrefix(key, data); ok {
					keys = append(keys, k)
				}
			}
		}
		return nil
	}
	if err := walk(ops); err != nil {
		return nil, err
	}
	slices.Sort(keys)
	return slices.Compact(keys), nil
}

// claims returns a Put of the owner key of each of keys that claim holds.
func (s *Store) claims(lease string, keys []string, claim map[string]bool) []clientv3.Op {
	var ops []clientv3.Op
	for _, k := range keys {
		if claim[k] {
			ops = append(ops, clientv3.OpPut(s.ownerKey(k), lease))
		}
	}
	return ops
}
