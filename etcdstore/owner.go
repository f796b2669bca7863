package etcdstore

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencer-dev/fencer/internal/mutant"
	"github.com/fencer-dev/fencer/token"
)

// Keys belong to leases.
//
// Every data key that a guarded write has written has an owner record,
// <prefix>owners/<key> = "<lease> <token>": the lease that owns the key
// and the token of the last guarded write of it, which is of that lease. A
// guarded write of a data key (Put, Delete, or a Txn that puts or deletes
// it) commits only if its token is current (the guard) and, in the same
// etcd Txn, its lease owns the key or nobody does; the write then records
// its own token as the owner's, unless it is already recorded. So once
// lease L has written a key, a holder of another lease cannot overwrite or
// delete it, however current its own token: it gets a
// *token.ForeignLeaseError and nothing changes. The owner record outlives
// a Delete, so a deleted key stays L's and nobody else can recreate it.
//
// Only an explicit takeover (the TakeOver write option) moves a key to
// another lease. It is fenced like any other write: it commits only while
// the taker's token is current, and it then records the taker's token as
// the owner's, after which the previous owner's writes are refused in
// turn.
//
// Only guarded writes write owner records, each under the full guard of
// the token it records (the holder key's create revision and the epoch
// key's value). So a record naming token T proves that T was exactly
// current when it was written, and a later write by T needs only compare
// the holder key's create revision and the record: if T's acquisition is
// still the current one, T is still exact. That is the cheapest Txn for
// etcd, two compares, and the one a lease's repeated writes of its keys
// take.
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

// OwnerKey returns the etcd key of the data key key's owner record,
// "<lease> <token>" (see ParseOwnerRecord). Only guarded writes of key
// write it.
func (s *Store) OwnerKey(key string) string { return s.ownerKey(key) }

// ownerRecord is the owner record of a key that tok writes.
func ownerRecord(tok token.Token) string { return tok.Lease + " " + tok.String() }

// ParseOwnerRecord reads an owner record, "<lease> <token>", where token
// is the text form of a token of lease: the lease that owns a data key and
// the token of the last guarded write of the key. It accepts only what
// guarded writes record, so that formatting the result gives back rec; it
// returns a *token.MalformedError otherwise.
func ParseOwnerRecord(rec string) (token.Token, error) {
	lease, text, ok := strings.Cut(rec, " ")
	if !ok {
		return token.Token{}, &token.MalformedError{Field: "owner record", Input: truncate(rec), Reason: `want "<lease> <token>"`}
	}
	tok, err := token.Parse(text)
	if err != nil {
		return token.Token{}, err
	}
	if tok.Lease != lease {
		return token.Token{}, &token.MalformedError{Field: "owner record", Input: truncate(rec), Reason: "the token is of another lease"}
	}
	if err := validToken(tok); err != nil {
		return token.Token{}, err
	}
	return tok, nil
}

func truncate(s string) string {
	if len(s) > 64 {
		return s[:64]
	}
	return s
}

// ownerLease returns the lease of an owner record as read from etcd: the
// text before its first space. Guarded writes record only well-formed
// records; a record that something else wrote still names its lease this
// way, which is how a "owned by the lease" compare reads it.
func ownerLease(rec string) string {
	lease, _, _ := strings.Cut(rec, " ")
	return lease
}

// foreignTo returns compares each of which holds, on its own, exactly
// when key's owner record exists and does not name lease (whatever its
// token): its value sorts at or before "<lease> " (below "<lease> \x00"),
// after "<lease>!", or is "<lease>!". No lease name holds a byte below "!",
// so every other lease's record is among them, and every value sorting
// strictly between "<lease> " and "<lease>!" (a record of lease's) is in
// none. Like every value compare, they all fail when the key has no
// record, which is what lets ownedOps put the record and the write in the
// one branch where all of them failed.
func (s *Store) foreignTo(key, lease string) []clientv3.Cmp {
	owner := s.ownerKey(key)
	return []clientv3.Cmp{
		clientv3.Compare(clientv3.Value(owner), "<", lease+" \x00"),
		clientv3.Compare(clientv3.Value(owner), ">", lease+"!"),
		clientv3.Compare(clientv3.Value(owner), "=", lease+"!"),
	}
}

// Owner returns the token recorded for the data key key: its Lease is
// the lease that owns key, and it is the token of the last guarded write
// of key. ok is false when no guarded write has written key yet. The
// answer may be stale when it returns; the guarded writes check ownership
// themselves. A record that a guarded write did not write yields a
// *token.MalformedError.
func (s *Store) Owner(ctx context.Context, key string) (tok token.Token, ok bool, err error) {
	if err := ValidateKey(key); err != nil {
		return token.Token{}, false, err
	}
	resp, err := s.cli.Get(ctx, s.ownerKey(key))
	if err != nil {
		return token.Token{}, false, fmt.Errorf("etcdstore: owner of %q: %w", key, err)
	}
	if len(resp.Kvs) == 0 {
		return token.Token{}, false, nil
	}
	tok, err = ParseOwnerRecord(string(resp.Kvs[0].Value))
	if err != nil {
		return token.Token{}, false, fmt.Errorf("etcdstore: owner of %q: %w", key, err)
	}
	return tok, true, nil
}

// writeKey runs op, a put or delete of the data key key, in one guarded
// etcd Txn under the ownership rule, and returns op's response and the
// revision of the write. It returns a *token.StaleError when tok is not
// current and a *token.ForeignLeaseError when another lease owns key (and
// takeOver is false).
//
// The Txn takes one of four shapes, chosen by the owner record the store
// last saw for key, each checked by etcd in the Txn:
//
//   - the record is tok's (the common case): If(CreateRevision(holder) =
//     tok.Revision, Value(owner) = record) Then(op), two compares, which
//     are exact because the record was written under tok's full guard;
//   - the record is of an earlier token of tok's lease (the first write
//     after a re-acquisition): If(guard, Value(owner) = that record)
//     Then(Put(owner, record), op);
//   - takeOver: If(guard) Then(Put(owner, record), op);
//   - otherwise "owned by the lease or by nobody" in one round trip, as
//     nested Txns that record tok (ownedOps), with op in them once.
//
// The Txn has no Else branch, which would cost every write; a write that
// fails reads the holder, epoch and owner keys to tell a stale token from
// a wrong guess of the owner. A wrong guess costs those round trips, never
// correctness: the write is retried in the shape the read calls for.
func (s *Store) writeKey(ctx context.Context, tok token.Token, key string, op clientv3.Op, takeOver bool) (*pb.ResponseOp, int64, error) {
	owner, mine := s.ownerKey(key), ownerRecord(tok)
	seen := s.owners.get(key)
	for {
		var cmps []clientv3.Cmp
		var then []clientv3.Op
		nested := false
		switch {
		case mutant.On(mutant.OwnerCompareDropped):
			cmps, then = s.guard(tok), []clientv3.Op{clientv3.OpPut(owner, mine), op}
		case seen == mine && !takeOver:
			cmps = []clientv3.Cmp{
				clientv3.Compare(clientv3.CreateRevision(s.holderKey(tok.Lease)), "=", tok.Revision),
				clientv3.Compare(clientv3.Value(owner), "=", mine),
			}
			then = []clientv3.Op{op}
		case takeOver:
			cmps, then = s.guard(tok), []clientv3.Op{clientv3.OpPut(owner, mine), op}
		case seen != "" && ownerLease(seen) == tok.Lease:
			cmps = append(s.guard(tok), clientv3.Compare(clientv3.Value(owner), "=", seen))
			then = []clientv3.Op{clientv3.OpPut(owner, mine), op}
		default:
			cmps, then, nested = s.guard(tok), s.ownedOps(tok, key, op), true
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
			// The guessed owner record was wrong (a token that is not
			// current never becomes current again).
			seen = ownerOf(why.Responses[2])
			s.owners.put(key, seen)
			if seen != "" && ownerLease(seen) != tok.Lease && !takeOver {
				return nil, 0, &token.ForeignLeaseError{Want: tok.Lease, Got: ownerLease(seen)}
			}
			continue
		}
		rs := resp.Responses
		if nested {
			var ok bool
			if rs, seen, ok = ownedResult(rs); !ok {
				s.owners.put(key, seen)
				return nil, 0, &token.ForeignLeaseError{Want: tok.Lease, Got: ownerLease(seen)}
			}
		}
		s.owners.put(key, mine)
		return rs[len(rs)-1], resp.Header.Revision, nil
	}
}

// ownedOps returns the Then branch of a guarded write of the data key key
// by tok: ops, which write key, in nested Txns that run them only if tok's
// lease owns key or nobody does, recording tok as the owner's token either
// way. Each compare of foreignTo gets a Txn of its own, since a Txn's
// compares must all hold for its Then branch; the first that holds reads
// the owner record instead:
//
//	If(Value(owner) < "<lease> \x00") Then(Get(owner))
//	Else(Txn(If(Value(owner) > "<lease>!") Then(Get(owner))
//	  Else(Txn(If(Value(owner) = "<lease>!") Then(Get(owner))
//	    Else(Put(owner, record), ops...)))))
//
// So ops are in the request once (a value of MaxValueLen bytes fits
// etcd's request limit), and they run exactly when no compare holds: the
// owner record is absent or names tok's lease. etcd evaluates every
// compare before any write, so each one sees the owner as it was before
// the Txn.
func (s *Store) ownedOps(tok token.Token, key string, ops ...clientv3.Op) []clientv3.Op {
	owner := s.ownerKey(key)
	branch := append([]clientv3.Op{clientv3.OpPut(owner, ownerRecord(tok))}, ops...)
	foreign := s.foreignTo(key, tok.Lease)
	for i := len(foreign) - 1; i >= 0; i-- {
		branch = []clientv3.Op{clientv3.OpTxn(foreign[i:i+1], []clientv3.Op{clientv3.OpGet(owner)}, branch)}
	}
	return branch
}

// ownedResult reads the responses of the Then branch that ownedOps built:
// those of the wrapped ops, after the owner record's put, and true; or, if
// another lease owns the key, its owner record and false.
func ownedResult(rs []*pb.ResponseOp) (ops []*pb.ResponseOp, foreign string, ok bool) {
	for {
		txn := rs[0].GetResponseTxn()
		if txn == nil {
			return rs, "", true
		}
		if txn.GetSucceeded() {
			return nil, ownerOf(txn.GetResponses()[0]), false
		}
		rs = txn.GetResponses()
	}
}

// maxOwnerGuesses bounds ownerGuesses; past it the guesses start over.
const maxOwnerGuesses = 1 << 16

// ownerGuesses remembers, per data key, the owner record a store last saw
// for it, so that a write takes the cheapest Txn. A wrong or missing guess
// costs a round trip or a nested Txn, never correctness.
type ownerGuesses struct {
	mu   sync.Mutex
	seen map[string]string
}

func (g *ownerGuesses) get(key string) string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.seen[key]
}

// put records rec as key's owner record; "" forgets the key.
func (g *ownerGuesses) put(key, rec string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if rec == "" {
		delete(g.seen, key)
		return
	}
	if g.seen[key] == rec {
		return
	}
	if _, ok := g.seen[key]; g.seen == nil || (!ok && len(g.seen) >= maxOwnerGuesses) {
		g.seen = map[string]string{}
	}
	g.seen[key] = rec
}

// ownerOf reads the owner record from a Get's response; "" if absent.
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

// claims returns a Put of tok's owner record at the owner key of each of
// keys that claim holds.
func (s *Store) claims(tok token.Token, keys []string, claim map[string]bool) []clientv3.Op {
	var ops []clientv3.Op
	for _, k := range keys {
		if claim[k] {
			ops = append(ops, clientv3.OpPut(s.ownerKey(k), ownerRecord(tok)))
		}
	}
	return ops
}
