package etcdstore_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fencer-dev/fencer/etcdstore"
	"github.com/fencer-dev/fencer/fencertest"
	"github.com/fencer-dev/fencer/token"
)

// TestPutManyShareOneTxnAndFailAlone: the puts of PutManyChecked leave in
// one shared Txn when none is in flight, each under its own guard: a stale
// put fails alone with its *token.StaleError, a key of another lease
// with a *token.ForeignLeaseError (or is taken over with TakeOver), also
// when the store's guess of the owner was wrong, and the others land at
// one revision. On a store without batching the results are the same.
func TestPutManyShareOneTxnAndFailAlone(t *testing.T) {
	for _, batching := range []bool{true, false} {
		t.Run("batching="+strconv.FormatBool(batching), func(t *testing.T) {
			ctx, st, s, l := holding(t, "many")
			if !batching {
				var err error
				st, err = etcdstore.New(st.Client(), etcdstore.WithPrefix(st.Prefix()), etcdstore.WithBatching(0))
				require.NoError(t, err)
			}
			old, err := s.Acquire(ctx, "many-old")
			require.NoError(t, err)
			require.NoError(t, old.Release(ctx))
			other, err := s.Acquire(ctx, "many-other")
			require.NoError(t, err)
			_, err = st.Put(ctx, other.Token(), "theirs", []byte("0"))
			require.NoError(t, err)
			_, err = st.Put(ctx, other.Token(), "taken", []byte("0"))
			require.NoError(t, err)
			// This store writes "guessed" for l, and another takes it over
			// for other: this one's guess of its owner (l) is wrong.
			_, err = st.Put(ctx, l.Token(), "guessed", []byte("0"))
			require.NoError(t, err)
			elsewhere, err := etcdstore.New(fencertest.Client(t), etcdstore.WithPrefix(st.Prefix()))
			require.NoError(t, err)
			_, err = elsewhere.Put(ctx, other.Token(), "guessed", []byte("taken"), etcdstore.TakeOver())
			require.NoError(t, err)

			put := func(tok token.Token, key, value string, opts ...etcdstore.WriteOption) etcdstore.CheckedPut {
				c, err := etcdstore.CheckPut(tok, key, []byte(value))
				require.NoError(t, err)
				return etcdstore.CheckedPut{Checked: c, Options: opts}
			}
			res := st.PutManyChecked(ctx, []etcdstore.CheckedPut{
				put(l.Token(), "a", "1"),
				put(old.Token(), "b", "stale"),
				put(l.Token(), "theirs", "foreign"),
				put(l.Token(), "taken", "mine now", etcdstore.TakeOver()),
				put(l.Token(), "guessed", "2"),
				put(l.Token(), "c", "3"),
				{Checked: etcdstore.Checked{}},
			})
			require.Len(t, res, 7)
			require.NoError(t, res[0].Err)
			require.NoError(t, res[5].Err)
			if batching {
				require.Equal(t, res[0].Revision, res[5].Revision, "the puts shared one Txn")
			}
			var stale *token.StaleError
			require.ErrorAs(t, res[1].Err, &stale)
			require.Equal(t, old.Token(), stale.Token)
			var foreign *token.ForeignLeaseError
			require.ErrorAs(t, res[2].Err, &foreign)
			require.Equal(t, "many-other", foreign.Got)
			require.NoError(t, res[3].Err)
			require.ErrorAs(t, res[4].Err, &foreign, "a wrong owner guess is found out")
			require.Equal(t, "many-other", foreign.Got)
			require.Error(t, res[6].Err, "arguments CheckPut did not check")

			for key, want := range map[string]string{"a": "1", "theirs": "0", "taken": "mine now", "guessed": "taken", "c": "3"} {
				require.Equal(t, want, get(t, st, key), key)
			}
			_, ok, err := st.Get(ctx, "b")
			require.NoError(t, err)
			require.False(t, ok, "the stale put wrote nothing")
		})
	}
}

// TestPutManyCancelled: puts whose context has ended write nothing and
// return its error.
func TestPutManyCancelled(t *testing.T) {
	_, st, _, l := holding(t, "many-cancelled")
	ctx, cancel := context.WithCancel(fencertest.Context(t))
	cancel()
	c, err := etcdstore.CheckPut(l.Token(), "never", []byte("x"))
	require.NoError(t, err)
	res := st.PutManyChecked(ctx, []etcdstore.CheckedPut{{Checked: c}, {Checked: c}})
	for _, r := range res {
		require.ErrorIs(t, r.Err, context.Canceled)
	}
	_, ok, err := st.Get(fencertest.Context(t), "never")
	require.NoError(t, err)
	require.False(t, ok)
}
