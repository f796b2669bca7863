package etcdstore

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencer-dev/fencer/internal/etcdcmp"
	"github.com/fencer-dev/fencer/internal/holderkey"
	"github.com/fencer-dev/fencer/internal/mutant"
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
	if mutant.On(mutant.EpochCompareDropped) {
		return []clientv3.Cmp{etcdcmp.CreateRevisionIs(s.holderKey(tok.Lease), tok.Revision)}
	}
	return []clientv3.Cmp{
		etcdcmp.CreateRevisionIs(s.holderKey(tok.Lease), tok.Revision),
		etcdcmp.ValueIs(s.epochKey(tok.Lease), formatEpoch(tok.Epoch)),
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
		if cur, _ := holderkey.Of(tok.Lease, kvs[0]); cur.Revision > tok.Revision {
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
	return s.check(ctx, tok)
}

// check is Check for a valid token.
func (s *Store) check(ctx context.Context, tok token.Token) error {
	resp, err := s.cli.Txn(ctx).If(s.guard(tok)...).Else(s.staleOps(tok)...).Commit()
	if err != nil {
		return fmt.Errorf("etcdstore: check %s: %w", tok, err)
	}
	if !resp.Succeeded {
		return staleError(tok, resp, 0)
	}
	return nil
}

// Value is token.Value: a data value with the revisions etcd recorded for
// it.
type Value = token.Value

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

// KeyValue is a data key with its value.
type KeyValue struct {
	Key string
	Value
}

// GetPage reads at most limit data keys that start with prefix ("" for
// every key) and sort after after ("" starts at the first), with their
// values, ordered by key; more reports whether further keys follow the
// last one returned. after is a cursor, usually the last key of the
// previous page, and need not be a valid key. Each page is read at one
// etcd revision; a listing of several pages is not one snapshot. It is not
// guarded: any reader may read. It returns an *ArgumentError for limit < 1
// or a prefix that is neither "" nor a valid key.
func (s *Store) GetPage(ctx context.Context, prefix, after string, limit int) (page []KeyValue, more bool, err error) {
	if limit < 1 {
		return nil, false, invalid("limit", strconv.Itoa(limit), "less than 1")
	}
	if prefix != "" {
		if err := ValidateKey(prefix); err != nil {
			return nil, false, err
		}
	}
	base := s.DataKey("")
	start := base + prefix
	from := start
	if next := s.DataKey(after) + "\x00"; after != "" && next > from {
		from = next
	}
	resp, err := s.cli.Get(ctx, from, clientv3.WithRange(clientv3.GetPrefixRangeEnd(start)), clientv3.WithLimit(int64(limit)))
	if err != nil {
		return nil, false, fmt.Errorf("etcdstore: get prefix %q: %w", prefix, err)
	}
	page = make([]KeyValue, len(resp.Kvs))
	for i, kv := range resp.Kvs {
		page[i] = KeyValue{Key: strings.TrimPrefix(string(kv.Key), base), Value: Value{Data: kv.Value, CreateRevision: kv.CreateRevision, ModRevision: kv.ModRevision}}
	}
	return page, resp.More, nil
}

// Release deletes tok's holder key if and only if tok is still current, so
// a retried or late release never deletes a newer holder's key. It reports
// whether it deleted the key.
//
// Release is not a clean release: anyone with the token may call it, so the
// lock-delay of tok's acquisition, if it set one, still applies, and the
// lease cannot be acquired again until it has passed. The holder's own
// Lease.Release (or ReleaseOn, on the holder's etcd lease) is clean and
// skips the delay.
func (s *Store) Release(ctx context.Context, tok token.Token) (bool, error) {
	c, err := CheckToken(tok)
	if err != nil {
		return false, err
	}
	return s.release(ctx, c.tok, 0)
}

// ReleaseOn is the clean release of tok by its holder: like Release, it
// deletes tok's holder key if and only if tok is still current, and, only
// if the holder key is also attached to etcd lease id (the holder's
// session), it deletes the lease's lock-delay marker in the same Txn, so
// the lease can be acquired again at once. A release whose id does not
// match deletes nothing and reports false. It does not check that the
// caller owns id; the service checks that.
func (s *Store) ReleaseOn(ctx context.Context, tok token.Token, id clientv3.LeaseID) (bool, error) {
	if id == 0 {
		return false, invalid("lease id", "0", "not an etcd lease")
	}
	c, err := CheckToken(tok)
	if err != nil {
		return false, err
	}
	return s.release(ctx, c.tok, id)
}

// ReleaseChecked is Release, when id is 0, or ReleaseOn of a token that
// CheckToken has checked; it does not check the token again. cond, like
// AcquireOn's, are more compares that the release's Txn requires: when
// one fails, it deletes nothing and reports false, as for a token that is
// not current (the service compares the holder session's principal and
// secret so, in the same Txn as the release).
func (s *Store) ReleaseChecked(ctx context.Context, c Checked, id clientv3.LeaseID, cond ...clientv3.Cmp) (bool, error) {
	if err := c.checkedFor(checkedToken); err != nil {
		return false, err
	}
	return s.release(ctx, c.tok, id, cond...)
}

// release is Release, or the clean ReleaseOn when id != 0, of a valid
// token, under the further compares cond.
func (s *Store) release(ctx context.Context, tok token.Token, id clientv3.LeaseID, cond ...clientv3.Cmp) (bool, error) {
	cmps, ops := s.guard(tok), []clientv3.Op{clientv3.OpDelete(s.holderKey(tok.Lease))}
	if id != 0 {
		cmps = append(cmps, etcdcmp.LeaseIs(s.holderKey(tok.Lease), id))
		ops = append(ops, clientv3.OpDelete(s.delayKey(tok.Lease)))
	}
	if mutant.On(mutant.ReleaseAnyHolder) {
		cmps = nil
	}
	cmps = append(cmps, cond...)
	resp, err := s.commit(ctx, cmps, ops, nil)
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
//
// A resource belongs to the lease whose token is recorded: the first lease
// to advance it, or the last to take it over. With TakeOver, Advance
// records tok over another lease's token; it is still refused unless tok
// is current, and a token of the same lease still never moves the record
// back.
func (s *Store) Advance(ctx context.Context, resource string, tok token.Token, opts ...WriteOption) error {
	c, err := CheckAdvance(resource, tok)
	if err != nil {
		return err
	}
	return s.AdvanceChecked(ctx, c, opts...)
}

// AdvanceChecked is Advance of arguments that CheckAdvance has checked; it
// does not check them again.
func (s *Store) AdvanceChecked(ctx context.Context, c Checked, opts ...WriteOption) error {
	if err := c.checkedFor(checkedAdvance); err != nil {
		return err
	}
	resource, tok := c.name, c.tok
	o := token.ApplyWriteOptions(opts)
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
			var refused error
			switch {
			case err != nil && !o.TakeOver:
				refused = fmt.Errorf("etcdstore: advance %q: %w", resource, err)
			case err == nil && c < 0:
				refused = &token.StaleError{Token: tok, Newer: recorded}
			}
			if refused != nil {
				// A token that is not current is stale whoever owns
				// the resource, as in every guarded write.
				if err := s.check(ctx, tok); err != nil {
					return err
				}
				return refused
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
