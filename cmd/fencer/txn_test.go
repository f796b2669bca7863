package main

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
)

func TestParseTxn(t *testing.T) {
	req, err := parseTxn("# close an open order\nvalue(orders/state) = open\nversion(\"orders/x y\") > \"0\"\nmod(k) < 10\ncreate(k) != 3\n\nput orders/state closed\nput \"orders/x y\" \"a \\\"b\\\"\\n\"\n\ndel orders/state\nget k\n")
	require.NoError(t, err)
	require.Len(t, req.compares, 4)
	require.True(t, proto.Equal(&fencerv1.Compare{Key: "orders/x y", Target: fencerv1.Compare_TARGET_VERSION, Result: fencerv1.Compare_RESULT_GREATER}, req.compares[1]))
	require.EqualValues(t, 10, req.compares[2].GetNumber())
	require.Len(t, req.success, 2)
	require.Equal(t, "a \"b\"\n", string(req.success[1].GetPut().GetValue()))
	require.Len(t, req.failure, 2)
	require.Equal(t, "k", req.failure[1].GetGet().GetKey())

	empty, err := parseTxn("\nput k v\n")
	require.NoError(t, err)
	require.Empty(t, empty.compares)
	require.Len(t, empty.success, 1)

	for _, bad := range []string{
		"val(k) = v",            // unknown target
		"value(k) == v",         // unknown operator
		"value(k) =",            // no operand
		"mod(k) > -1",           // negative revision
		"mod(k) > x",            // not a number
		"value(k = v",           // no )
		"value() = v",           // empty key
		"value(\"k) = v",        // unterminated quote
		"\nput k",               // put needs a value
		"\nupsert k v",          // unknown operation
		"\nput \"k\"v v",        // no space after a quoted word
		"\nput k\"x v",          // quote inside a word
		"\n\n\nput k v",         // a fourth section
		"value(k) = v\nput k v", // an operation among the compares
		"\nget \"\"",            // empty key
		"value(a b) = v",        // unquoted key with a space
	} {
		_, err := parseTxn(bad)
		var te *txnError
		require.True(t, errors.As(err, &te), "%q: %v", bad, err)
		require.ErrorIs(t, err, errTxnSyntax, bad)
	}
}

// FuzzParseTxn: parseTxn never panics, refuses with a *txnError, and what
// it accepts formats to text that parses back to the same transaction.
func FuzzParseTxn(f *testing.F) {
	for _, s := range []string{
		"value(k) = v\n\nput k v\n\nget k\n",
		"version(\"a b\") > \"0\"\nmod(k) < 9\n\ndel k\n",
		"\n\nput \"\\x00\\xff\" \"\"\n",
		"# c\ncreate(k) != 1\n",
		"value(k) = \"\\u00e9\"",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, text string) {
		req, err := parseTxn(text)
		if err != nil {
			var te *txnError
			require.True(t, errors.As(err, &te), "%v", err)
			return
		}
		again, err := parseTxn(req.format())
		require.NoError(t, err, "format of %q: %q", text, req.format())
		for _, pair := range [][2][]*fencerv1.Op{{req.success, again.success}, {req.failure, again.failure}} {
			require.Len(t, pair[1], len(pair[0]))
			for i := range pair[0] {
				require.True(t, proto.Equal(pair[0][i], pair[1][i]), "%q", text)
			}
		}
		require.Len(t, again.compares, len(req.compares))
		for i := range req.compares {
			require.True(t, proto.Equal(req.compares[i], again.compares[i]), "%q", text)
		}
	})
}
