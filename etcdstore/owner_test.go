package etcdstore_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencer-dev/fencer/etcdstore"
	"github.com/fencer-dev/fencer/fencertest"
	"github.com/fencer-dev/fencer/token"
)

// requireForeign checks that err is a *token.ForeignLeaseError naming the
// writer's lease and the owner's.
func requireForeign(t *testing.T, err error, want, got string) {
	t.Helper()
	require.ErrorIs(t, err, token.ErrForeignLease)
	var fe *token.ForeignLeaseError
	require.ErrorAs(t, err, &fe)
	require.Equal(t, &token.ForeignLeaseError{Want: want, Got: got}, fe)
}

// TestForeignLeaseCannotWriteAnotherLeasesKeys is the attack of issue 10:
// bob, holding lease billing, writes the key alice writes under lease
// orders, and advances her resource, while her token stays current.
func TestForeignLeaseCannotWriteAnotherLeasesKeys(t *testing.T) {
	ctx, st, alice, bob := aliceAndBob(t)
	var err error
	_, err = st.Put(ctx, alice.Token(), "orders/total", []byte("100"))
	require.NoError(t, err)
	require.NoError(t, st.Advance(ctx, "orders-db", alice.Token()))

	_, err = st.Put(ctx, bob.Token(), "orders/total", []byte("0"))
	requireForeign(t, err, "billing", "orders")
	deleted, err := st.Delete(ctx, bob.Token(), "orders/total")
	requireForeign(t, err, "billing", "orders")
	require.False(t, deleted)
	_, err = st.Txn(ctx, bob.Token(), nil, []clientv3.Op{clientv3.OpPut(st.DataKey("orders/total"), "0")}, nil)
	requireForeign(t, err, "billing", "orders")
	_, err = st.Txn(ctx, bob.Token(), nil, nil, []clientv3.Op{clientv3.OpDelete(st.DataKey("orders/total"))})
	requireForeign(t, err, "billing", "orders")
	err = st.Advance(ctx, "orders-db", bob.Token())
	requireForeign(t, err, "billing", "orders")

	// Nothing of bob's landed, and alice's writes still pass.
	require.Equal(t, "100", get(t, st, "orders/total"))
	fence, _, err := st.Fence(ctx, "orders-db")
	require.NoError(t, err)
	require.Equal(t, alice.Token(), fence)
	_, err = st.Put(ctx, alice.Token(), "orders/total", []byte("250"))
	require.NoError(t, err)
	require.NoError(t, st.Advance(ctx, "orders-db", alice.Token()))
	require.Equal(t, "250", get(t, st, "orders/total"))
}

// TestTakeOverIsExplicitAndFenced: bob takes alice's key and resource over
// only with the explicit option and his current token; then alice is
// refused, and a stale token is refused either way.
func TestTakeOverIsExplicitAndFenced(t *testing.T) {
	ctx := fencertest.Context(t)
	st := fencertest.SharedStore(t)
	alice, err := newSession(t, st).Acquire(ctx, "orders")
	require.NoError(t, err)
	bobs := newSession(t, st)
	bobOld, err := bobs.Acquire(ctx, "billing")
	require.NoError(t, err)
	require.NoError(t, bobOld.Release(ctx))
	bob, err := bobs.Acquire(ctx, "billing")
	require.NoError(t, err)
	_, err = st.Put(ctx, alice.Token(), "orders/total", []byte("100"))
	require.NoError(t, err)
	require.NoError(t, st.Advance(ctx, "orders-db", alice.Token()))

	// A takeover with a stale or forged token is refused like any write.
	forged := bob.Token()
	forged.Epoch++
	for _, tok := range []token.Token{bobOld.Token(), forged} {
		_, err = st.Put(ctx, tok, "orders/total", []byte("0"), etcdstore.TakeOver())
		require.ErrorIs(t, err, token.ErrStale, "%s", tok)
		_, err = st.Delete(ctx, tok, "orders/total", etcdstore.TakeOver())
		require.ErrorIs(t, err, token.ErrStale, "%s", tok)
		_, err = st.Txn(ctx, tok, nil, []clientv3.Op{clientv3.OpPut(st.DataKey("orders/total"), "0")}, nil, etcdstore.TakeOver())
		require.ErrorIs(t, err, token.ErrStale, "%s", tok)
		require.ErrorIs(t, st.Advance(ctx, "orders-db", tok, etcdstore.TakeOver()), token.ErrStale, "%s", tok)
	}
	owner, ok, err := st.Owner(ctx, "orders/total")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "orders", owner.Lease)
	require.Equal(t, "100", get(t, st, "orders/total"))

	// With his current token, bob takes both over.
	_, err = st.Put(ctx, bob.Token(), "orders/total", []byte("0"), etcdstore.TakeOver())
	require.NoError(t, err)
	require.NoError(t, st.Advance(ctx, "orders-db", bob.Token(), etcdstore.TakeOver()))
	owner, _, err = st.Owner(ctx, "orders/total")
	require.NoError(t, err)
	require.Equal(t, "billing", owner.Lease)
	fence, _, err := st.Fence(ctx, "orders-db")
	require.NoError(t, err)
	require.Equal(t, bob.Token(), fence)

	// Now alice is the foreign one; bob writes without the option.
	_, err = st.Put(ctx, alice.Token(), "orders/total", []byte("250"))
	requireForeign(t, err, "orders", "billing")
	_, err = st.Delete(ctx, alice.Token(), "orders/total")
	requireForeign(t, err, "orders", "billing")
	requireForeign(t, st.Advance(ctx, "orders-db", alice.Token()), "orders", "billing")
	_, err = st.Put(ctx, bob.Token(), "orders/total", []byte("1"))
	require.NoError(t, err)
	require.NoError(t, st.Advance(ctx, "orders-db", bob.Token()))

	// A stale alice token is refused with or without the option.
	aliceOld := alice.Token()
	require.NoError(t, alice.Release(ctx))
	for _, opts := range [][]etcdstore.WriteOption{nil, {etcdstore.TakeOver()}} {
		_, err = st.Put(ctx, aliceOld, "orders/total", []byte("late"), opts...)
		require.ErrorIs(t, err, token.ErrStale)
		_, err = st.Delete(ctx, aliceOld, "orders/total", opts...)
		require.ErrorIs(t, err, token.ErrStale)
		require.ErrorIs(t, st.Advance(ctx, "orders-db", aliceOld, opts...), token.ErrStale)
	}
	require.Equal(t, "1", get(t, st, "orders/total"))

	// The next holder of orders takes the key back by a Delete.
	alice2, err := newSession(t, st).Acquire(ctx, "orders")
	require.NoError(t, err)
	deleted, err := st.Delete(ctx, alice2.Token(), "orders/total", etcdstore.TakeOver())
	require.NoError(t, err)
	require.True(t, deleted)
	owner, _, err = st.Owner(ctx, "orders/total")
	require.NoError(t, err)
	require.Equal(t, "orders", owner.Lease, "the owner outlives the delete")
	_, err = st.Put(ctx, bob.Token(), "orders/total", []byte("2"))
	requireForeign(t, err, "billing", "orders")
	_, err = st.Put(ctx, alice2.Token(), "orders/total", []byte("3"))
	require.NoError(t, err)
}

// TestBobCannotBlockAlice: nothing bob does without a takeover leaves
// alice unable to write, and a key he claimed first is hers again after
// her own fenced takeover.
func TestBobCannotBlockAlice(t *testing.T) {
	ctx, st, alice, bob := aliceAndBob(t)
	var err error
	_, err = st.Put(ctx, alice.Token(), "mine", []byte("a"))
	require.NoError(t, err)
	require.NoError(t, st.Advance(ctx, "orders-db", alice.Token()))

	// Bob's refused writes of every kind change no owner.
	_, err = st.Put(ctx, bob.Token(), "mine", nil)
	require.ErrorIs(t, err, token.ErrForeignLease)
	_, err = st.Delete(ctx, bob.Token(), "mine")
	require.ErrorIs(t, err, token.ErrForeignLease)
	_, err = st.Txn(ctx, bob.Token(), nil,
		[]clientv3.Op{clientv3.OpPut(st.DataKey("fresh"), "b"), clientv3.OpPut(st.DataKey("mine"), "b")}, nil)
	require.ErrorIs(t, err, token.ErrForeignLease)
	require.ErrorIs(t, st.Advance(ctx, "orders-db", bob.Token()), token.ErrForeignLease)
	_, ok, err := st.Owner(ctx, "fresh")
	require.NoError(t, err)
	require.False(t, ok, "a refused Txn claimed a key")
	_, ok, err = st.Get(ctx, "fresh")
	require.NoError(t, err)
	require.False(t, ok)

	_, err = st.Put(ctx, alice.Token(), "mine", []byte("a2"))
	require.NoError(t, err)
	_, err = st.Put(ctx, alice.Token(), "fresh", []byte("a"))
	require.NoError(t, err)
	require.NoError(t, st.Advance(ctx, "orders-db", alice.Token()))

	// A key nobody owned goes to the first lease that writes it, bob here;
	// alice's plain write is then refused, and her takeover wins it back.
	_, err = st.Put(ctx, bob.Token(), "squatted", []byte("b"))
	require.NoError(t, err)
	_, err = st.Put(ctx, alice.Token(), "squatted", []byte("a"))
	requireForeign(t, err, "orders", "billing")
	_, err = st.Put(ctx, alice.Token(), "squatted", []byte("a"), etcdstore.TakeOver())
	require.NoError(t, err)
	_, err = st.Put(ctx, bob.Token(), "squatted", []byte("b"))
	requireForeign(t, err, "billing", "orders")
	require.Equal(t, "a", get(t, st, "squatted"))
}

// TestUnownedKeyIsClaimedByItsFirstGuardedWrite covers keys written before
// owners existed (or by a raw client): the first guarded write claims them.
func TestUnownedKeyIsClaimedByItsFirstGuardedWrite(t *testing.T) {
	ctx, st, _, l := holding(t, "orders")
	_, err := st.Client().Put(ctx, st.DataKey("legacy"), "old")
	require.NoError(t, err)
	_, ok, err := st.Owner(ctx, "legacy")
	require.NoError(t, err)
	require.False(t, ok)
	deleted, err := st.Delete(ctx, l.Token(), "legacy")
	require.NoError(t, err)
	require.True(t, deleted)
	owner, ok, err := st.Owner(ctx, "legacy")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "orders", owner.Lease)
	_, _, err = st.Owner(ctx, "")
	require.ErrorIs(t, err, etcdstore.ErrInvalidArgument)
}

func TestTxnChecksAndClaimsEveryDataKeyItMayWrite(t *testing.T) {
	ctx := fencertest.Context(t)
	st := fencertest.SharedStore(t)
	cst, txns := countingStore(t, st)
	alice, err := newSession(t, st).Acquire(ctx, "orders")
	require.NoError(t, err)
	bob, err := newSession(t, st).Acquire(ctx, "billing")
	require.NoError(t, err)
	_, err = st.Put(ctx, alice.Token(), "owned", []byte("a"))
	require.NoError(t, err)
	_, err = st.Put(ctx, bob.Token(), "bobs", []byte("b"))
	require.NoError(t, err)
	put := func(k, v string) clientv3.Op { return clientv3.OpPut(st.DataKey(k), v) }
	absent := clientv3.Compare(clientv3.Version(st.DataKey("new-then")), "=", 0)

	// cst has not seen "owned" written, so it guesses it unowned: a wrong
	// guess costs a second round trip. The caller sees its own responses
	// only, and only the branch that ran claims its keys.
	txns.Store(0)
	resp, err := cst.Txn(ctx, alice.Token(), []clientv3.Cmp{absent},
		[]clientv3.Op{put("owned", "a2"), put("new-then", "a"), clientv3.OpGet(st.DataKey("owned"))},
		[]clientv3.Op{put("new-else", "a")})
	require.NoError(t, err)
	require.True(t, resp.Succeeded)
	require.Len(t, resp.Responses, 3)
	require.Equal(t, "a2", string(resp.Responses[2].GetResponseRange().Kvs[0].Value))
	require.Positive(t, resp.Header.Revision)
	require.Equal(t, int64(2), txns.Load())
	for key, want := range map[string]bool{"owned": true, "new-then": true, "new-else": false} {
		_, ok, err := st.Owner(ctx, key)
		require.NoError(t, err)
		require.Equal(t, want, ok, key)
	}

	// Right guesses: one round trip. The else branch runs and claims its
	// key.
	txns.Store(0)
	resp, err = cst.Txn(ctx, alice.Token(), []clientv3.Cmp{absent},
		[]clientv3.Op{put("owned", "a3")}, []clientv3.Op{put("owned", "a4"), put("new-else", "a")})
	require.NoError(t, err)
	require.False(t, resp.Succeeded)
	require.Len(t, resp.Responses, 2)
	require.Equal(t, int64(1), txns.Load())
	txns.Store(0)
	_, err = cst.Txn(ctx, alice.Token(), nil, []clientv3.Op{put("owned", "a5"), put("new-else", "a5")}, nil)
	require.NoError(t, err)
	require.Equal(t, int64(1), txns.Load())
	owner, _, err := st.Owner(ctx, "new-else")
	require.NoError(t, err)
	require.Equal(t, "orders", owner.Lease)

	// A foreign key in either branch, or in a nested Txn, refuses the
	// whole Txn, which then writes nothing.
	for name, ops := range map[string][2][]clientv3.Op{
		"then":   {{put("owned", "x"), put("bobs", "x")}, nil},
		"else":   {{put("owned", "x")}, {clientv3.OpDelete(st.DataKey("bobs"))}},
		"nested": {{clientv3.OpTxn(nil, nil, []clientv3.Op{put("bobs", "x")})}, nil},
	} {
		_, err := st.Txn(ctx, alice.Token(), nil, ops[0], ops[1])
		requireForeign(t, err, "orders", "billing")
		require.ErrorContains(t, err, `"bobs"`, name)
	}
	require.Equal(t, "a5", get(t, st, "owned"))
	require.Equal(t, "b", get(t, st, "bobs"))

	// Keys outside the data space are the caller's own business; a range
	// delete cannot be checked if it reaches into data keys.
	_, err = st.Txn(ctx, alice.Token(), nil, []clientv3.Op{clientv3.OpPut(st.Prefix()+"elsewhere", "x")}, nil)
	require.NoError(t, err)
	for _, del := range []clientv3.Op{
		clientv3.OpDelete(st.DataKey(""), clientv3.WithPrefix()),
		clientv3.OpDelete(st.Prefix(), clientv3.WithPrefix()),
		clientv3.OpDelete(st.Prefix()+"a", clientv3.WithFromKey()),
	} {
		_, err = st.Txn(ctx, alice.Token(), nil, []clientv3.Op{del}, nil)
		require.ErrorIs(t, err, etcdstore.ErrInvalidArgument)
	}
	_, err = st.Txn(ctx, alice.Token(), nil, []clientv3.Op{clientv3.OpDelete(st.Prefix()+"elsewhere", clientv3.WithPrefix())}, nil)
	require.NoError(t, err)

	// With TakeOver, bob takes every key the branch writes.
	_, err = st.Txn(ctx, bob.Token(), nil, []clientv3.Op{put("owned", "b"), put("new-then", "b")}, nil, etcdstore.TakeOver())
	require.NoError(t, err)
	for _, key := range []string{"owned", "new-then"} {
		owner, _, err := st.Owner(ctx, key)
		require.NoError(t, err)
		require.Equal(t, "billing", owner.Lease, key)
	}
}

// outcome is what one write returned, in a form that does not depend on
// the store's revisions.
type outcome struct {
	err     string
	deleted bool
}

func outcomeOf(deleted bool, err error) outcome {
	var fe *token.ForeignLeaseError
	switch {
	case err == nil:
		return outcome{deleted: deleted}
	case errors.As(err, &fe):
		return outcome{err: "foreign " + fe.Want + " owned by " + fe.Got}
	case errors.Is(err, token.ErrStale):
		return outcome{err: "stale"}
	}
	return outcome{err: err.Error()}
}

// TestBatchedWritesOfMixedOwnersActAsAlone runs one sequence of writes by
// two leases twice: queued up so that they share Txns where they may, and
// one at a time on a store that does not batch. Every write's outcome and
// the final keys and owners are the same.
func TestBatchedWritesOfMixedOwnersActAsAlone(t *testing.T) {
	ctx := fencertest.Context(t)
	var revs [14]int64
	run := func(st *etcdstore.Store, batched bool) ([]outcome, map[string]string) {
		alice, err := newSession(t, st).Acquire(ctx, "orders")
		require.NoError(t, err)
		bobs := newSession(t, st)
		bobOld, err := bobs.Acquire(ctx, "billing")
		require.NoError(t, err)
		require.NoError(t, bobOld.Release(ctx))
		bob, err := bobs.Acquire(ctx, "billing")
		require.NoError(t, err)
		for _, k := range []string{"c", "e", "g"} {
			_, err := st.Put(ctx, alice.Token(), k, []byte("a0"))
			require.NoError(t, err)
		}
		a, b, stale := alice.Token(), bob.Token(), bobOld.Token()
		out := make([]outcome, 14)
		put := func(i int, tok token.Token, key, val string, opts ...etcdstore.WriteOption) func() {
			return func() {
				var err error
				revs[i], err = st.Put(ctx, tok, key, []byte(val), opts...)
				out[i] = outcomeOf(false, err)
			}
		}
		del := func(i int, tok token.Token, key string, opts ...etcdstore.WriteOption) func() {
			return func() { d, err := st.Delete(ctx, tok, key, opts...); out[i] = outcomeOf(d, err) }
		}
		advance := func(i int, tok token.Token, opts ...etcdstore.WriteOption) func() {
			return func() { out[i] = outcomeOf(false, st.Advance(ctx, "r", tok, opts...)) }
		}
		writes := []func(){
			put(0, a, "a", "a1"),
			put(1, b, "a", "b1"),
			put(2, b, "b", "b1"),
			put(3, a, "b", "a1"),
			put(4, b, "c", "b1", etcdstore.TakeOver()),
			put(5, a, "c", "a2"),
			put(6, stale, "d", "stale"),
			put(7, stale, "g", "stale", etcdstore.TakeOver()),
			del(8, b, "e"),
			del(9, a, "e"),
			put(10, b, "e", "b1"),
			advance(11, a),
			advance(12, b),
			put(13, a, "f", "a1"),
		}
		if batched {
			queueUp(t, st, writes...)
		} else {
			for _, w := range writes {
				w()
			}
		}
		state := map[string]string{}
		kvs, err := st.Client().Get(ctx, st.Prefix(), clientv3.WithPrefix())
		require.NoError(t, err)
		for _, kv := range kvs.Kvs {
			key := strings.TrimPrefix(string(kv.Key), st.Prefix())
			switch {
			case strings.HasPrefix(key, "data/"):
				state[key] = string(kv.Value)
			case strings.HasPrefix(key, "owners/"): // the owning lease; tokens differ between the runs
				owner, err := etcdstore.ParseOwnerRecord(string(kv.Value))
				require.NoError(t, err)
				state[key] = owner.Lease
			}
		}
		return out, state
	}
	batching := fencertest.SharedStore(t)
	alone, err := etcdstore.New(fencertest.Client(t), etcdstore.WithPrefix(batching.Prefix()+"alone/"), etcdstore.WithBatching(0))
	require.NoError(t, err)
	gotOut, gotState := run(batching, true)
	require.Equal(t, revs[0], revs[2], "alice's put of a and bob's of b shared a Txn")
	require.Equal(t, revs[0], revs[4], "and bob's takeover of c")
	wantOut, wantState := run(alone, false)
	require.Equal(t, wantOut, gotOut)
	require.Equal(t, wantState, gotState)
	require.Equal(t, outcome{err: "foreign billing owned by orders"}, gotOut[1])
	require.Equal(t, outcome{}, gotOut[4], "bob's takeover of c")
	require.Equal(t, outcome{err: "foreign orders owned by billing"}, gotOut[5])
	require.Equal(t, outcome{err: "stale"}, gotOut[7])
	require.Equal(t, outcome{deleted: true}, gotOut[9])
	require.Equal(t, "a1", gotState["data/a"])
	require.Equal(t, "orders", gotState["owners/e"])
}

// TestWrongOwnerGuessesCostRoundTripsNotCorrectness runs writes through a
// store whose guess of a key's owner is out of date: another store took
// the key over, or the owner record vanished (a raw client deleted it).
func TestWrongOwnerGuessesCostRoundTripsNotCorrectness(t *testing.T) {
	ctx := fencertest.Context(t)
	st := fencertest.SharedStore(t)
	cst, txns := countingStore(t, st)
	alice, err := newSession(t, st).Acquire(ctx, "orders")
	require.NoError(t, err)
	bob, err := newSession(t, st).Acquire(ctx, "billing")
	require.NoError(t, err)

	txns.Store(0)
	_, err = cst.Put(ctx, alice.Token(), "k", []byte("1"))
	require.NoError(t, err)
	_, err = cst.Put(ctx, alice.Token(), "k", []byte("2"))
	require.NoError(t, err)
	require.Equal(t, int64(2), txns.Load(), "a claim and a write: one Txn each")

	// Bob takes k over through another store; cst still guesses alice.
	_, err = st.Put(ctx, bob.Token(), "k", []byte("b"), etcdstore.TakeOver())
	require.NoError(t, err)
	txns.Store(0)
	_, err = cst.Put(ctx, alice.Token(), "k", []byte("3"))
	requireForeign(t, err, "orders", "billing")
	require.Equal(t, int64(2), txns.Load(), "the write on the wrong guess, then a read of why it failed")
	_, err = cst.Delete(ctx, alice.Token(), "k")
	requireForeign(t, err, "orders", "billing")
	_, err = cst.Txn(ctx, alice.Token(), nil, []clientv3.Op{clientv3.OpPut(st.DataKey("k"), "3")}, nil)
	requireForeign(t, err, "orders", "billing")
	require.Equal(t, "b", get(t, st, "k"))

	// The owner record of a key cst knows as alice's vanishes: her write
	// claims it again.
	_, err = cst.Put(ctx, alice.Token(), "j", []byte("1"))
	require.NoError(t, err)
	_, err = st.Client().Delete(ctx, st.OwnerKey("j"))
	require.NoError(t, err)
	_, err = cst.Put(ctx, alice.Token(), "j", []byte("2"))
	require.NoError(t, err)
	owner, _, err := st.Owner(ctx, "j")
	require.NoError(t, err)
	require.Equal(t, "orders", owner.Lease)

	// A stale token is stale whatever the guess.
	old := alice.Token()
	require.NoError(t, alice.Release(ctx))
	_, err = cst.Put(ctx, old, "j", []byte("late"))
	require.ErrorIs(t, err, token.ErrStale)
	require.Equal(t, "2", get(t, st, "j"))
}

// TestOwnerRecordFollowsTheLeasesAcquisitions: the owner record holds the
// token of the last write; the first write after a re-acquisition records
// the new token in the same Txn, and every write after it takes one Txn.
func TestOwnerRecordFollowsTheLeasesAcquisitions(t *testing.T) {
	ctx := fencertest.Context(t)
	st := fencertest.SharedStore(t)
	cst, txns := countingStore(t, st)
	s := newSession(t, st)
	first, err := s.Acquire(ctx, "orders")
	require.NoError(t, err)
	_, err = cst.Put(ctx, first.Token(), "k", []byte("1"))
	require.NoError(t, err)
	owner, ok, err := cst.Owner(ctx, "k")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, first.Token(), owner)
	raw, err := st.Client().Get(ctx, st.OwnerKey("k"))
	require.NoError(t, err)
	require.Equal(t, "orders "+first.Token().String(), string(raw.Kvs[0].Value))

	require.NoError(t, first.Release(ctx))
	second, err := s.Acquire(ctx, "orders")
	require.NoError(t, err)
	for i := range 3 {
		txns.Store(0)
		_, err = cst.Put(ctx, second.Token(), "k", []byte("2"))
		require.NoError(t, err)
		require.Equal(t, int64(1), txns.Load(), "write %d", i)
		owner, _, err = cst.Owner(ctx, "k")
		require.NoError(t, err)
		require.Equal(t, second.Token(), owner)
	}
	for _, tok := range []token.Token{first.Token(), {Lease: "orders", Epoch: second.Token().Epoch + 1, Revision: second.Token().Revision}} {
		_, err = cst.Put(ctx, tok, "k", []byte("late"))
		require.ErrorIs(t, err, token.ErrStale, "%s", tok)
		_, err = cst.Delete(ctx, tok, "k")
		require.ErrorIs(t, err, token.ErrStale, "%s", tok)
	}
	require.Equal(t, "2", get(t, st, "k"))

	// A record nothing but a guarded write should have written is reported.
	_, err = st.Client().Put(ctx, st.OwnerKey("k"), "orders")
	require.NoError(t, err)
	_, _, err = st.Owner(ctx, "k")
	require.ErrorIs(t, err, token.ErrMalformed)
}

// aliceAndBob returns a store on a fresh prefix where alice holds the
// lease orders and bob the lease billing, each through a session of its
// own.
func aliceAndBob(t *testing.T) (context.Context, *etcdstore.Store, *etcdstore.Lease, *etcdstore.Lease) {
	t.Helper()
	ctx := fencertest.Context(t)
	st := fencertest.SharedStore(t)
	alice, err := newSession(t, st).Acquire(ctx, "orders")
	require.NoError(t, err)
	bob, err := newSession(t, st).Acquire(ctx, "billing")
	require.NoError(t, err)
	return ctx, st, alice, bob
}

// freshStore is a store on st's keys that has seen no owner record, so
// that its first write of a key takes the nested "owned by the lease or by
// nobody" Txn.
func freshStore(t *testing.T, st *etcdstore.Store) *etcdstore.Store {
	t.Helper()
	fresh, err := etcdstore.New(st.Client(), etcdstore.WithPrefix(st.Prefix()))
	require.NoError(t, err)
	return fresh
}

// TestPutOfAnyKeyTakesTheLargestValue puts a value of MaxValueLen bytes to
// a key nobody owns and to a key the lease owns that the store has not
// seen: the value is in the request once, so both fit etcd's default
// request limit, as they do for a key the store knows or a takeover.
func TestPutOfAnyKeyTakesTheLargestValue(t *testing.T) {
	ctx, st, _, l := holding(t, "orders")
	big := []byte(strings.Repeat("v", etcdstore.MaxValueLen))
	_, err := st.Put(ctx, l.Token(), "new", big)
	require.NoError(t, err, "a new key")
	require.Equal(t, string(big), get(t, st, "new"))
	owner, ok, err := st.Owner(ctx, "new")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, l.Token(), owner)

	big[0] = 'w'
	_, err = freshStore(t, st).Put(ctx, l.Token(), "new", big)
	require.NoError(t, err, "a key the lease owns, unknown to the store")
	require.Equal(t, string(big), get(t, st, "new"))
}

// TestOwnerRecordsBesideALeasesAreForeign writes owner records that sort
// just outside "<lease> <token>" (by hand: guarded writes never do), and
// records of the lease itself: a write that has not seen the key claims
// only a key its lease owns or nobody does, and otherwise writes nothing.
func TestOwnerRecordsBesideALeasesAreForeign(t *testing.T) {
	ctx, st, _, l := holding(t, "orders")
	for _, rec := range []string{"orders", "orders ", "orders!", "orders!x", "orders\x1fx", "ordersa v1:1:2:ordersa", "order v1:1:2:order", "z"} {
		_, err := st.Client().Put(ctx, st.OwnerKey("k"), rec)
		require.NoError(t, err)
		_, err = freshStore(t, st).Put(ctx, l.Token(), "k", []byte(rec))
		require.ErrorIs(t, err, token.ErrForeignLease, "owner record %q", rec)
		_, ok, err := st.Get(ctx, "k")
		require.NoError(t, err)
		require.False(t, ok, "owner record %q: the write landed", rec)
	}
	for _, rec := range []string{"orders \x00", "orders v1:1:2:orders", "orders " + l.Token().String()} {
		_, err := st.Client().Put(ctx, st.OwnerKey("k"), rec)
		require.NoError(t, err)
		_, err = freshStore(t, st).Put(ctx, l.Token(), "k", []byte(rec))
		require.NoError(t, err, "owner record %q", rec)
		require.Equal(t, rec, get(t, st, "k"))
		owner, _, err := st.Owner(ctx, "k")
		require.NoError(t, err)
		require.Equal(t, l.Token(), owner, "the write records its token")
	}
}
