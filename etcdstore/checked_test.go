package etcdstore_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencer-dev/fencer/etcdstore"
	"github.com/fencer-dev/fencer/token"
)

// TestCheckedWritesAsTheCalls checks that the *Checked writes of input
// that the Check* functions accepted do what Put, Delete, Txn and Advance
// do.
func TestCheckedWritesAsTheCalls(t *testing.T) {
	ctx, st, _, l := holding(t, "checked")
	tok := l.Token()

	in, err := etcdstore.CheckPut(tok, "checked/k", []byte("v"))
	require.NoError(t, err)
	require.Equal(t, tok, in.Token())
	_, err = st.PutChecked(ctx, in)
	require.NoError(t, err)
	v, ok, err := st.Get(ctx, "checked/k")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "v", string(v.Data))

	in, err = etcdstore.CheckToken(tok)
	require.NoError(t, err)
	resp, err := st.TxnChecked(ctx, in, nil, []clientv3.Op{clientv3.OpPut(st.DataKey("checked/t"), "t")}, nil)
	require.NoError(t, err)
	require.True(t, resp.Succeeded)

	in, err = etcdstore.CheckDelete(tok, "checked/k")
	require.NoError(t, err)
	deleted, err := st.DeleteChecked(ctx, in)
	require.NoError(t, err)
	require.True(t, deleted)

	in, err = etcdstore.CheckAdvance("checked-resource", tok)
	require.NoError(t, err)
	require.NoError(t, st.AdvanceChecked(ctx, in))
	fence, ok, err := st.Fence(ctx, "checked-resource")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, tok, fence)

	in, err = etcdstore.CheckToken(tok)
	require.NoError(t, err)
	released, err := st.ReleaseChecked(ctx, in, 0)
	require.NoError(t, err)
	require.True(t, released)
	require.ErrorIs(t, st.Check(ctx, tok), token.ErrStale)
}

// TestCheckReturnsTheCallsErrors checks that each Check* function refuses
// bad input with exactly the error its call returns for it, checking the
// arguments in the same order.
func TestCheckReturnsTheCallsErrors(t *testing.T) {
	ctx, st, _, l := holding(t, "checked-errors")
	good := l.Token()
	slash := token.Token{Lease: "a/b", Epoch: 1, Revision: 5}
	long := strings.Repeat("k", etcdstore.MaxKeyLen+1)
	big := make([]byte, etcdstore.MaxValueLen+1)
	cases := []struct {
		name       string
		check, run func() error
	}{
		{"put: token before key", func() error { _, err := etcdstore.CheckPut(slash, "", nil); return err },
			func() error { _, err := st.Put(ctx, slash, "", nil); return err }},
		{"put: key before value", func() error { _, err := etcdstore.CheckPut(good, long, big); return err },
			func() error { _, err := st.Put(ctx, good, long, big); return err }},
		{"put: value", func() error { _, err := etcdstore.CheckPut(good, "k", big); return err },
			func() error { _, err := st.Put(ctx, good, "k", big); return err }},
		{"delete: token before key", func() error { _, err := etcdstore.CheckDelete(token.Token{}, ""); return err },
			func() error { _, err := st.Delete(ctx, token.Token{}, ""); return err }},
		{"delete: key", func() error { _, err := etcdstore.CheckDelete(good, "a\x01"); return err },
			func() error { _, err := st.Delete(ctx, good, "a\x01"); return err }},
		{"txn: token", func() error { _, err := etcdstore.CheckToken(slash); return err },
			func() error { _, err := st.Txn(ctx, slash, nil, nil, nil); return err }},
		{"release: token", func() error { _, err := etcdstore.CheckToken(slash); return err },
			func() error { _, err := st.Release(ctx, slash); return err }},
		{"release on: token", func() error { _, err := etcdstore.CheckToken(token.Token{Lease: "x"}); return err },
			func() error { _, err := st.ReleaseOn(ctx, token.Token{Lease: "x"}, 1); return err }},
		{"advance: resource before token", func() error { _, err := etcdstore.CheckAdvance("a/b", slash); return err },
			func() error { return st.Advance(ctx, "a/b", slash) }},
		{"advance: token", func() error { _, err := etcdstore.CheckAdvance("r", slash); return err },
			func() error { return st.Advance(ctx, "r", slash) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			want := tc.run()
			require.Error(t, want)
			require.Equal(t, want, tc.check())
		})
	}
}

// TestCheckedRefusesUncheckedInput checks that a *Checked write refuses
// the zero Checked and one checked for another kind of write with an
// *ArgumentError, and writes nothing.
func TestCheckedRefusesUncheckedInput(t *testing.T) {
	ctx, st, _, l := holding(t, "unchecked")
	forTxn, err := etcdstore.CheckToken(l.Token())
	require.NoError(t, err)
	forPut, err := etcdstore.CheckPut(l.Token(), "unchecked/k", []byte("v"))
	require.NoError(t, err)
	writes := map[string]func(in etcdstore.Checked) error{
		"put":     func(in etcdstore.Checked) error { _, err := st.PutChecked(ctx, in); return err },
		"delete":  func(in etcdstore.Checked) error { _, err := st.DeleteChecked(ctx, in); return err },
		"advance": func(in etcdstore.Checked) error { return st.AdvanceChecked(ctx, in) },
		"release": func(in etcdstore.Checked) error { _, err := st.ReleaseChecked(ctx, in, 0); return err },
		"txn": func(in etcdstore.Checked) error {
			_, err := st.TxnChecked(ctx, in, nil, []clientv3.Op{clientv3.OpPut(st.DataKey("unchecked/t"), "t")}, nil)
			return err
		},
	}
	for name, write := range writes {
		other := forTxn
		if name == "txn" || name == "release" {
			other = forPut
		}
		for _, in := range []etcdstore.Checked{{}, other} {
			err := write(in)
			var arg *etcdstore.ArgumentError
			require.ErrorAs(t, err, &arg, name)
			require.Equal(t, "checked", arg.Arg)
			require.ErrorIs(t, err, etcdstore.ErrInvalidArgument)
		}
	}
	for _, k := range []string{"unchecked/k", "unchecked/t"} {
		_, ok, err := st.Get(ctx, k)
		require.NoError(t, err)
		require.False(t, ok, k)
		_, ok, err = st.Owner(ctx, k)
		require.NoError(t, err)
		require.False(t, ok, k)
	}
	_, ok, err := st.Fence(ctx, "unchecked")
	require.NoError(t, err)
	require.False(t, ok)
	require.NoError(t, st.Check(ctx, l.Token()), "still held")
}
