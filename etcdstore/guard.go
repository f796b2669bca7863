package etcdstore

import (
	"context"
	"fmt"
	"strconv"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencer-dev/fencer/token"
)

// Guard returns the etcd conditions that hold exactly while tok is its
// lease's current token: the holder key <prefix>leases/<lease> exists and
// was created at tok.Revision, and the acquisition counter
// <prefix>epochs/<lease> holds tok.Epoch. Put them in a Txn's If, the way
// etcd's Mutex.IsOwner is used, and the Txn commits only for the current
// holder's exact token. It returns a *token.MalformedError for a token
// this store could not have issued.
//
// The pair pins one acquisition. Only the acquiring Txn writes the epoch
// key, in the same Txn that creates the holder key, and it can run only
// while the holder key is absent; so while the holder key created at
// revision R exists, the epoch key holds the epoch of the acquisition at
// R. A token that differs from the current one in its lease, epoch or
// revision fails one of the two compares.
//
// Guard does not tell a failed guard from the caller's own compares
// failing; Txn does. Nor does it check who owns the keys the caller's Txn
// writes: Put, Delete and Txn do that for data keys.
func (s *Store) Guard(tok token.Token) ([]clientv3.Cmp, error) {
	if err := validToken(tok); err != nil {
		return nil, err
	}
	return s.guard(tok), nil
}

// guard is Guard for a valid token.
func (s *Store) guard(tok token.Token) []clientv3.Cmp {
	return []clientv3.Cmp{
		clientv3.Compare(clientv3.CreateRevision(s.holderKey(tok.Lease)), "=", tok.Revision),
		clientv3.Compare(clientv3.Value(s.epochKey(tok.Lease)), "=", formatEpoch(tok.Epoch)),
	}
}

// formatEpoch is the text of an epoch in the epoch key, as the acquiring
// Txn writes it.
func formatEpoch(epoch uint64) string { return strconv.FormatUint(epoch, 10) }

// staleOps are the Else branch of a guarded Txn: they read the holder key
// and the epoch key, to tell what superseded the token.
func (s *Store) staleOps(tok token.Token) []clientv3.Op {
	return []clientv3.Op{clientv3.OpGet(s.holderKey(tok.Lease)), clientv3.OpGet(s.epochKey(tok.Lease))}
}

// current reports whether the staleOps results at index i and i+1 of resp
// show tok as its lease's current token, that is, whether tok's guard
// held at the Txn's revision.
func current(tok token.Token, resp *clientv3.TxnResponse, i int) bool {
	holder := resp.Responses[i].GetResponseRange().GetKvs()
	epoch := resp.Responses[i+1].GetResponseRange().GetKvs()
	return len(holder) == 1 && holder[0].CreateRevision == tok.Revision &&
		len(epoch) == 1 && string(epoch[0].Value) == formatEpoch(tok.Epoch)
}

// staleError builds the error for a failed guard from the staleOps results
// at index i of resp. Newer is the lease's current token when that is a
// later acquisition than tok; a token that was never issued (a forged
// epoch, a revision no acquisition of the lease had) gets no Newer unless
// a later acquisition exists.
func staleError(tok token.Token, resp *clientv3.TxnResponse, i int) error {
	e := &token.StaleError{Token: tok}
	if kvs := resp.Responses[i].GetResponseRange().GetKvs(); len(kvs) == 1 {
		if cur, _ := holderOf(tok.Lease, kvs[0]); cur.Revision > tok.Revision {
			e.Newer = cur
		}
	}
	return e
}

// Check reports whether tok is its lease's current token. It returns nil if
// it is, a *token.StaleError if the lease has been released, lost or
// re-acquired since, and a *token.MalformedError for an invalid token. The
// answer may be stale when it returns; to act on it, use a guarded write.
func (s *Store) Check(ctx context.Context, tok token.Token) error {
	if err := validToken(tok); err != nil {
		return err
	}
	resp, err := s.cli.Txn(ctx).If(s.guard(tok)...).Else(s.staleOps(tok)...).Commit()
	if err != nil {
		return fmt.Errorf("etcdstore: check %s: %w", tok, err)
	}
	if !resp.Succeeded {
		return staleError(tok, resp, 0)
	}
	return nil
}

// Put writes value at the data key key if and only if tok is current, in
// one etcd Txn. It returns the revision of the write, or a
// *token.StaleError and writes nothing when tok has been superseded.
func (s *Store) Put(ctx context.Context, tok token.Token, key string, value []byte) (int64, error) {
	if err := validToken(tok); err != nil {
		return 0, err
	}
	if err := ValidateKey(key); err != nil {
		return 0, err
	}
	if err := ValidateValue(value); err != nil {
		return 0, err
	}
	resp, err := s.commit(ctx, s.guard(tok),
		[]clientv3.Op{clientv3.OpPut(s.DataKey(key), string(value))}, s.staleOps(tok))
	if err != nil {
		return 0, fmt.Errorf("etcdstore: put %q: %w", key, err)
	}
	if !resp.Succeeded {
		return 0, staleError(tok, resp, 0)
	}
	return resp.Header.Revision, nil
}

// Delete deletes the data key key if and only if tok is current. It
// reports whether the key existed, or a *token.StaleError when tok has been
// superseded.
func (s *Store) Delete(ctx context.Context, tok token.Token, key string) (bool, error) {
	if err := validToken(tok); err != nil {
		return false, err
	}
	if err := ValidateKey(key); err != nil {
		return false, err
	}
	resp, err := s.commit(ctx, s.guard(tok),
		[]clientv3.Op{clientv3.OpDelete(s.DataKey(key))}, s.staleOps(tok))
	if err != nil {
		return false, fmt.Errorf("etcdstore: delete %q: %w", key, err)
	}
	if !resp.Succeeded {
		return false, staleError(tok, resp, 0)
	}
	return resp.Responses[0].GetResponseDeleteRange().Deleted > 0, nil
}

// Value is a data value with the revisions etcd recorded for it.
type Value struct {
	Data           []byte
	CreateRevision int64
	ModRevision    int64
}

// Get reads the data key key. It is not guarded: any reader may read. It
// reports false when the key does not exist.
func (s *Store) Get(ctx context.Context, key string) (Value, bool, error) {
	if err := ValidateKey(key); err != nil {
		return Value{}, false, err
	}
	resp, err := s.cli.Get(ctx, s.DataKey(key))
	if err != nil {
		return Value{}, false, fmt.Errorf("etcdstore: get %q: %w", key, err)
	}
	if len(resp.Kvs) == 0 {
		return Value{}, false, nil
	}
	kv := resp.Kvs[0]
	return Value{Data: kv.Value, CreateRevision: kv.CreateRevision, ModRevision: kv.ModRevision}, true, nil
}

// Txn runs the caller's transaction if and only if tok is current. The
// caller's compares, then-ops and else-ops act on raw etcd keys and run as
// a nested Txn inside the guarded one, so:
//
//   - a superseded token yields a *token.StaleError and runs neither branch;
//   - otherwise the result is the caller's own Txn response, whose
//     Succeeded reports the caller's compares.
//
// etcd forbids a nested Txn from writing the same key twice; the same rules
// as a plain etcd Txn apply to the ops.
func (s *Store) Txn(ctx context.Context, tok token.Token, cmps []clientv3.Cmp, then, els []clientv3.Op) (*clientv3.TxnResponse, error) {
	if err := validToken(tok); err != nil {
		return nil, err
	}
	resp, err := s.cli.Txn(ctx).If(s.guard(tok)...).
		Then(clientv3.OpTxn(cmps, then, els)).
		Else(s.staleOps(tok)...).Commit()
	if err != nil {
		return nil, fmt.Errorf("etcdstore: txn: %w", err)
	}
	if !resp.Succeeded {
		return nil, staleError(tok, resp, 0)
	}
	inner := resp.Responses[0].GetResponseTxn()
	return (*clientv3.TxnResponse)(inner), nil
}

// Release deletes tok's holder key if and only if tok is still current, so
// a retried or late release never deletes a newer holder's key. It reports
// whether it deleted the key.
func (s *Store) Release(ctx context.Context, tok token.Token) (bool, error) {
	if err := validToken(tok); err != nil {
		return false, err
	}
	resp, err := s.commit(ctx, s.guard(tok), []clientv3.Op{clientv3.OpDelete(s.holderKey(tok.Lease))}, nil)
	if err != nil {
		return false, fmt.Errorf("etcdstore: release %s: %w", tok, err)
	}
	return resp.Succeeded, nil
}

// Advance records tok as the highest token that has passed for the
// external resource, a compare-and-advance register kept at
// <prefix>fences/<resource>. It succeeds only if tok is its lease's current
// token and is not lower than the recorded one; an equal token succeeds
// again, so retries are safe. Otherwise it returns a *token.StaleError (the
// recorded token, when it is newer, as Newer) or, if the resource was
// advanced by another lease, a *token.ForeignLeaseError. Nothing is written
// on error.
func (s *Store) Advance(ctx context.Context, resource string, tok token.Token) error {
	if err := ValidateName("resource", resource); err != nil {
		return err
	}
	if err := validToken(tok); err != nil {
		return err
	}
	key := s.fenceKey(resource)
	for {
		cur, err := s.cli.Get(ctx, key)
		if err != nil {
			return fmt.Errorf("etcdstore: advance %q: %w", resource, err)
		}
		var modRev int64
		if len(cur.Kvs) == 1 {
			modRev = cur.Kvs[0].ModRevision
			recorded, err := token.Parse(string(cur.Kvs[0].Value))
			if err != nil {
				return fmt.Errorf("etcdstore: advance %q: recorded fence: %w", resource, err)
			}
			c, err := tok.Compare(recorded)
			if err != nil {
				return err
			}
			if c < 0 {
				return &token.StaleError{Token: tok, Newer: recorded}
			}
		}
		resp, err := s.commit(ctx, append(s.guard(tok), clientv3.Compare(clientv3.ModRevision(key), "=", modRev)),
			[]clientv3.Op{clientv3.OpPut(key, tok.String())}, s.staleOps(tok))
		if err != nil {
			return fmt.Errorf("etcdstore: advance %q: %w", resource, err)
		}
		if resp.Succeeded {
			return nil
		}
		if !current(tok, resp, 0) {
			return staleError(tok, resp, 0)
		}
		// The fence moved between the read and the Txn; read it again.
	}
}

// Fence returns the token recorded for resource by Advance; ok is false if
// none was.
func (s *Store) Fence(ctx context.Context, resource string) (tok token.Token, ok bool, err error) {
	if err := ValidateName("resource", resource); err != nil {
		return token.Token{}, false, err
	}
	resp, err := s.cli.Get(ctx, s.fenceKey(resource))
	if err != nil {
		return token.Token{}, false, fmt.Errorf("etcdstore: fence %q: %w", resource, err)
	}
	if len(resp.Kvs) == 0 {
		return token.Token{}, false, nil
	}
	tok, err = token.Parse(string(resp.Kvs[0].Value))
	if err != nil {
		return token.Token{}, false, fmt.Errorf("etcdstore: fence %q: %w", resource, err)
	}
	return tok, true, nil
}
