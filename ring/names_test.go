package ring_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fencer-dev/fencer/ring"
	"github.com/fencer-dev/fencer/token"
)

func TestValidateRing(t *testing.T) {
	for _, tc := range []struct {
		name string
		ok   bool
	}{
		{"a", true},
		{"orders-eu.1", true},
		{strings.Repeat("a", 63), true},
		{"", false},
		{strings.Repeat("a", 64), false},
		{"-a", false},
		{"a.", false},
		{"A", false},
		{"a:b", false},
		{"a b", false},
		{"a/b", false},
		{"é", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := ring.ValidateRing(tc.name)
			if tc.ok {
				require.NoError(t, err)
				return
			}
			var ae *token.ArgumentError
			require.ErrorAs(t, err, &ae)
			require.ErrorIs(t, err, token.ErrInvalidArgument)
		})
	}
}

func TestValidateShardAndMember(t *testing.T) {
	for _, tc := range []struct {
		name string
		ok   bool
	}{
		{"s", true},
		{"tenant:42", true},
		{"héllo", true},
		{strings.Repeat("x", 128), true},
		{"", false},
		{strings.Repeat("x", 129), false},
		{"a b", false},
		{"a/b", false},
		{"a\tb", false},
		{"\xff", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, f := range []func(string) error{ring.ValidateShard, ring.ValidateMember} {
				err := f(tc.name)
				if tc.ok {
					require.NoError(t, err)
				} else {
					require.ErrorIs(t, err, token.ErrInvalidArgument)
				}
			}
		})
	}
}

func TestShardLease(t *testing.T) {
	require.Equal(t, "ring:orders:tenant:42", ring.ShardLease("orders", "tenant:42"))
	r, s, ok := ring.ParseShardLease("ring:orders:tenant:42")
	require.True(t, ok)
	require.Equal(t, "orders", r)
	require.Equal(t, "tenant:42", s)
	for _, bad := range []string{"", "ring:", "ring:orders", "ring:orders:", "ring::s", "ring:Orders:s", "lease:orders:s", "ring:o:a b"} {
		_, _, ok := ring.ParseShardLease(bad)
		require.False(t, ok, bad)
	}
	require.NoError(t, token.ValidateName("lease", ring.ShardLease(strings.Repeat("r", 63), strings.Repeat("s", 128))))
}

func TestKindString(t *testing.T) {
	require.Equal(t, "Gained", ring.Gained.String())
	require.Equal(t, "Losing", ring.Losing.String())
	require.Equal(t, "Lost", ring.Lost.String())
	require.Equal(t, "Kind(9)", ring.Kind(9).String())
}

// FuzzParseShardLease: a parsed lease name is made of a valid ring and
// shard and ShardLease gives it back; whatever ShardLease makes of valid
// names parses back to them.
func FuzzParseShardLease(f *testing.F) {
	for _, s := range []string{"ring:a:b", "ring:orders:tenant:42", "ring::", "ring:a", "x:a:b", "ring:a-:b", "ring:a:b c"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, lease string) {
		r, s, ok := ring.ParseShardLease(lease)
		if !ok {
			require.Empty(t, r)
			require.Empty(t, s)
			return
		}
		require.NoError(t, ring.ValidateRing(r))
		require.NoError(t, ring.ValidateShard(s))
		require.Equal(t, lease, ring.ShardLease(r, s))
		require.NoError(t, token.ValidateName("lease", lease))
		r2, s2, ok := ring.ParseShardLease(ring.ShardLease(r, s))
		require.True(t, ok)
		require.Equal(t, [2]string{r, s}, [2]string{r2, s2})
	})
}
