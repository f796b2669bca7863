package etcdstore

import (
	"context"
	"fmt"
	"slices"
	"strings"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencer-dev/fencer/internal/etcdcmp"
	"github.com/fencer-dev/fencer/internal/mutant"
	"github.com/fencer-dev/fencer/token"
)

// The guarded writes: Put, Delete and Txn of data keys, each in one etcd
// Txn under the token's guard (guard.go) and the keys' ownership rule
// (owner.go).

// Put writes value at the data key key if and only if tok is current and
// tok's lease owns key or nobody does, in one etcd Txn; a Put that finds
// no owner makes tok's lease the owner (see TakeOver for the exception).
// It returns the revision of the write. It writes nothing and returns a
// *token.StaleError when tok is not its lease's current token, and a
// *token.ForeignLeaseError when another lease owns key.
func (s *Store) Put(ctx context.Context, tok token.Token, key string, value []byte, opts ...WriteOption) (int64, error) {
	c, err := CheckPut(tok, key, value)
	if err != nil {
		return 0, err
	}
	return s.PutChecked(ctx, c, opts...)
}

// PutChecked is Put of arguments that CheckPut has checked; it does not
// check them again.
func (s *Store) PutChecked(ctx context.Context, c Checked, opts ...WriteOption) (int64, error) {
	if err := c.checkedFor(checkedPut); err != nil {
		return 0, err
	}
	_, rev, err := s.writeKey(ctx, c.tok, c.name, clientv3.OpPut(s.DataKey(c.name), string(c.value)), token.ApplyWriteOptions(opts).TakeOver)
	if err != nil {
		return 0, fmt.Errorf("etcdstore: put %q: %w", c.name, err)
	}
	return rev, nil
}

// Delete deletes the data key key if and only if tok is current and tok's
// lease owns key or nobody does, and reports whether the key existed. The
// owner record stays, so the key remains the lease's (a Delete that finds
// no owner makes tok's lease the owner). It returns a *token.StaleError
// when tok is not current and a *token.ForeignLeaseError when another
// lease owns key, and then deletes nothing.
func (s *Store) Delete(ctx context.Context, tok token.Token, key string, opts ...WriteOption) (bool, error) {
	c, err := CheckDelete(tok, key)
	if err != nil {
		return false, err
	}
	return s.DeleteChecked(ctx, c, opts...)
}

// DeleteChecked is Delete of arguments that CheckDelete has checked; it
// does not check them again.
func (s *Store) DeleteChecked(ctx context.Context, c Checked, opts ...WriteOption) (bool, error) {
	if err := c.checkedFor(checkedDelete); err != nil {
		return false, err
	}
	r, _, err := s.writeKey(ctx, c.tok, c.name, clientv3.OpDelete(s.DataKey(c.name)), token.ApplyWriteOptions(opts).TakeOver)
	if err != nil {
		return false, fmt.Errorf("etcdstore: delete %q: %w", c.name, err)
	}
	return r.GetResponseDeleteRange().GetDeleted() > 0, nil
}

// Txn runs the caller's transaction if and only if tok is current and
// tok's lease owns, or may claim, every data key the transaction may
// write. The caller's compares, then-ops and else-ops act on raw etcd keys
// and run as a nested Txn inside the guarded one, so:
//
//   - a token that is not its lease's current token yields a
//     *token.StaleError and runs neither branch;
//   - a data key (under DataKey's prefix) that either branch puts or
//     deletes, also inside nested Txns, and that another lease owns yields
//     a *token.ForeignLeaseError and runs neither branch, unless TakeOver
//     is given;
//   - otherwise the result is the caller's own Txn response, whose
//     Succeeded reports the caller's compares, and the lease owns every
//     data key the branch that ran may write (claimed if nobody owned it).
//
// The owners are compared in the same etcd Txn as the write: each key's
// owner record is compared with the one the store guesses it has (one of
// tok's lease, or none when the key is to be claimed). A wrong guess costs
// a second round trip, whose compares are what the first read. Keys that a nested Txn of the
// caller's writes are claimed with the branch that contains it, whichever
// way the nested Txn goes.
//
// A delete of a key range that includes data keys is refused with an
// *ArgumentError, since the owners of a range cannot be checked. etcd
// forbids a nested Txn from writing the same key twice; the same rules as
// a plain etcd Txn apply to the ops. Txns are never batched.
func (s *Store) Txn(ctx context.Context, tok token.Token, cmps []clientv3.Cmp, then, els []clientv3.Op, opts ...WriteOption) (*clientv3.TxnResponse, error) {
	c, err := CheckToken(tok)
	if err != nil {
		return nil, err
	}
	return s.TxnChecked(ctx, c, cmps, then, els, opts...)
}

// TxnChecked is Txn with a token that CheckToken has checked; it does
// not check the token again.
func (s *Store) TxnChecked(ctx context.Context, c Checked, cmps []clientv3.Cmp, then, els []clientv3.Op, opts ...WriteOption) (*clientv3.TxnResponse, error) {
	if err := c.checkedFor(checkedToken); err != nil {
		return nil, err
	}
	tok := c.tok
	o := token.ApplyWriteOptions(opts)
	thenKeys, err := s.dataKeysWritten(then)
	if err != nil {
		return nil, err
	}
	elsKeys, err := s.dataKeysWritten(els)
	if err != nil {
		return nil, err
	}
	keys := slices.Compact(slices.Sorted(slices.Values(slices.Concat(thenKeys, elsKeys))))
	// expect holds the owner record each key is compared with: the one
	// the store last saw if it is of tok's lease, else none (the key is to
	// be claimed), then what a failed attempt read. Every key whose record
	// is not tok's own gets tok's in the branch that writes it.
	mine := ownerRecord(tok)
	expect := map[string]string{}
	for _, k := range keys {
		if seen := s.owners.get(k); ownerLease(seen) == tok.Lease {
			expect[k] = seen
		}
	}
	claim := map[string]bool{}
	for {
		for _, k := range keys {
			claim[k] = o.TakeOver || expect[k] != mine
		}
		op := clientv3.OpTxn(cmps,
			slices.Concat(then, s.claims(tok, thenKeys, claim)),
			slices.Concat(els, s.claims(tok, elsKeys, claim)))
		checked := !o.TakeOver && len(keys) > 0 && !mutant.On(mutant.OwnerCompareDropped)
		if checked {
			owned := make([]clientv3.Cmp, len(keys))
			reads := make([]clientv3.Op, len(keys))
			for i, k := range keys {
				owned[i] = clientv3.Compare(clientv3.CreateRevision(s.ownerKey(k)), "=", 0)
				if rec := expect[k]; rec != "" {
					owned[i] = clientv3.Compare(clientv3.Value(s.ownerKey(k)), "=", rec)
				}
				reads[i] = clientv3.OpGet(s.ownerKey(k))
			}
			op = clientv3.OpTxn(owned, []clientv3.Op{op}, reads)
		}
		resp, err := s.cli.Txn(ctx).If(s.guard(tok)...).Then(op).Else(s.staleOps(tok)...).Commit()
		if err != nil {
			return nil, fmt.Errorf("etcdstore: txn: %w", err)
		}
		if !resp.Succeeded {
			return nil, staleError(tok, resp, 0)
		}
		inner := resp.Responses[0].GetResponseTxn()
		if checked {
			if !inner.GetSucceeded() {
				// An owner record was not as expected: expect what was
				// read.
				for i, k := range keys {
					rec := ownerOf(inner.GetResponses()[i])
					s.owners.put(k, rec)
					if rec != "" && ownerLease(rec) != tok.Lease {
						return nil, fmt.Errorf("etcdstore: txn: data key %q: %w", k, &token.ForeignLeaseError{Want: tok.Lease, Got: ownerLease(rec)})
					}
					expect[k] = rec
				}
				continue
			}
			inner = inner.GetResponses()[0].GetResponseTxn()
		}
		ran := thenKeys
		if !inner.GetSucceeded() {
			ran = elsKeys
		}
		for _, k := range keys {
			if slices.Contains(ran, k) {
				s.owners.putMine(k, tok, mine)
			}
		}
		// Hide the claims from the caller: they follow its own ops.
		n := len(then)
		if !inner.GetSucceeded() {
			n = len(els)
		}
		inner.Responses = inner.Responses[:n]
		inner.Header = resp.Header // a nested Txn's own header is empty
		return (*clientv3.TxnResponse)(inner), nil
	}
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
	w := s.newKeyWrite(tok, key, op, takeOver)
	for {
		cmps, then := w.txn()
		resp, err := s.commit(ctx, cmps, then, nil)
		if err != nil {
			return nil, 0, err
		}
		if r, rev, done, err := w.settle(ctx, resp); done {
			return r, rev, err
		}
	}
}

// keyWrite is one writeKey between its Txns: what the store last saw of
// key's owner record, and the shape of the Txn that follows from it.
type keyWrite struct {
	s        *Store
	tok      token.Token
	key      string
	op       clientv3.Op
	takeOver bool

	owner  string // the owner record's etcd key
	seen   string // the owner record the store last saw for key
	mine   string // the record a write by tok leaves
	isMine bool   // seen is mine
	nested bool   // the last txn has the shape of ownedOps
}

// newKeyWrite starts writeKey's write of op to key with tok.
func (s *Store) newKeyWrite(tok token.Token, key string, op clientv3.Op, takeOver bool) *keyWrite {
	w := &keyWrite{s: s, tok: tok, key: key, op: op, takeOver: takeOver, owner: s.ownerKey(key)}
	w.seen, w.isMine = s.owners.getFor(key, tok)
	w.mine = w.seen // the common case: the record this store wrote for tok
	if !w.isMine {
		w.mine = ownerRecord(tok)
		w.isMine = w.seen == w.mine
	}
	return w
}

// txn returns the compares and Then branch of w's next Txn, in the shape
// that the owner record w last saw calls for (see writeKey).
func (w *keyWrite) txn() ([]clientv3.Cmp, []clientv3.Op) {
	s, tok, owner := w.s, w.tok, w.owner
	w.nested = false
	switch {
	case mutant.On(mutant.OwnerCompareDropped):
		return s.guard(tok), []clientv3.Op{clientv3.OpPut(owner, w.mine), w.op}
	case w.isMine && !w.takeOver:
		return []clientv3.Cmp{
			etcdcmp.CreateRevisionIs(s.holderKey(tok.Lease), tok.Revision),
			etcdcmp.ValueIs(owner, w.mine),
		}, []clientv3.Op{w.op}
	case w.takeOver:
		return s.guard(tok), []clientv3.Op{clientv3.OpPut(owner, w.mine), w.op}
	case w.seen != "" && ownerLease(w.seen) == tok.Lease:
		return append(s.guard(tok), etcdcmp.ValueIs(owner, w.seen)), []clientv3.Op{clientv3.OpPut(owner, w.mine), w.op}
	default:
		w.nested = true
		return s.guard(tok), s.ownedOps(tok, w.key, w.op)
	}
}

// settle takes the response of w's last Txn. done reports that the write
// is over, with op's response and the write's revision, or with its
// error; otherwise the owner record was not the one guessed, and w's next
// txn is the one to send. A failed Txn costs a read of the holder, epoch
// and owner keys, off the write's own path, to tell a stale token from a
// wrong guess: an Else branch that read them would cost every write.
func (w *keyWrite) settle(ctx context.Context, resp *clientv3.TxnResponse) (r *pb.ResponseOp, rev int64, done bool, err error) {
	s, tok := w.s, w.tok
	if !resp.Succeeded {
		why, err := s.cli.Txn(ctx).Then(append(s.staleOps(tok), clientv3.OpGet(w.owner))...).Commit()
		if err != nil {
			return nil, 0, true, err
		}
		if !current(tok, why, 0) {
			return nil, 0, true, staleError(tok, why, 0)
		}
		// The guessed owner record was wrong (a token that is not
		// current never becomes current again).
		w.seen = ownerOf(why.Responses[2])
		w.isMine = w.seen == w.mine
		s.owners.put(w.key, w.seen)
		if w.seen != "" && ownerLease(w.seen) != tok.Lease && !w.takeOver {
			return nil, 0, true, &token.ForeignLeaseError{Want: tok.Lease, Got: ownerLease(w.seen)}
		}
		return nil, 0, false, nil
	}
	rs := resp.Responses
	if w.nested {
		var ok bool
		if rs, w.seen, ok = ownedResult(rs); !ok {
			s.owners.put(w.key, w.seen)
			return nil, 0, true, &token.ForeignLeaseError{Want: tok.Lease, Got: ownerLease(w.seen)}
		}
	}
	s.owners.putMine(w.key, tok, w.mine)
	return rs[len(rs)-1], resp.Header.Revision, true, nil
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
