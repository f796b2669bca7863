package etcdstore_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fencer-dev/fencer/etcdstore"
	"github.com/fencer-dev/fencer/internal/etcdtest"
)

// TestCheckPrefix writes a deployment's keys under an outer prefix and
// checks that every prefix inside it is refused, naming both prefixes,
// while the outer prefix itself, a sibling and a deeper deployment's own
// keys are not.
func TestCheckPrefix(t *testing.T) {
	ctx := etcdtest.Context(t)
	st := etcdtest.Store(t)
	cli, outer := st.Client(), st.Prefix()
	require.NoError(t, etcdstore.CheckPrefix(ctx, cli, outer+"data/tenant2/"), "no outer deployment yet")
	for _, dir := range []string{"leases/", "epochs/", "fences/", "owners/"} {
		_, err := cli.Put(ctx, outer+dir+"x", "1")
		require.NoError(t, err)
		for _, inner := range []string{outer + "data/tenant2/", outer + "epochs/a/b/", outer + "other/"} {
			err := etcdstore.CheckPrefix(ctx, cli, inner)
			var nested *etcdstore.NestedPrefixError
			require.ErrorAs(t, err, &nested, "%s with a key under %s", inner, dir)
			require.Equal(t, etcdstore.NestedPrefixError{Prefix: inner, Outer: outer}, *nested)
			require.Contains(t, err.Error(), inner)
			require.Contains(t, err.Error(), outer)
		}
		require.NoError(t, etcdstore.CheckPrefix(ctx, cli, outer))
		_, err = cli.Delete(ctx, outer+dir+"x")
		require.NoError(t, err)
	}
	// A sibling's keys do not make it an ancestor.
	_, err := cli.Put(ctx, outer+"data/tenant1/epochs/x", "1")
	require.NoError(t, err)
	require.NoError(t, etcdstore.CheckPrefix(ctx, cli, outer+"data/tenant2/"))
}
