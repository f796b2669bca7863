package etcdstore_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/fencer-dev/fencer/etcdstore"
	"github.com/fencer-dev/fencer/fencertest"
)

// TestCheckPrefix writes a deployment's keys under an outer prefix and
// checks that every prefix inside it is refused, naming both prefixes,
// while the outer prefix itself, a sibling and a deeper deployment's own
// keys are not.
func TestCheckPrefix(t *testing.T) {
	ctx := fencertest.Context(t)
	st := fencertest.SharedStore(t)
	cli, outer := st.Client(), st.Prefix()
	require.NoError(t, etcdstore.CheckPrefix(ctx, cli, outer+"data/tenant2/"), "no outer deployment yet")
	for _, dir := range []string{"leases/", "epochs/", "fences/", "owners/"} {
		_, err := cli.Put(ctx, outer+dir+"x", "1")
		require.NoError(t, err)
		for _, inner := range []string{outer + "data/tenant2/", outer + "owners/t/", outer + "data/", outer + "delays/", outer + "delays/t/"} {
			err := etcdstore.CheckPrefix(ctx, cli, inner)
			var nested *etcdstore.NestedPrefixError
			require.ErrorAs(t, err, &nested, "%s with a key under %s", inner, dir)
			require.Equal(t, etcdstore.NestedPrefixError{Prefix: inner, Outer: outer}, *nested)
			require.Contains(t, err.Error(), inner)
			require.Contains(t, err.Error(), outer)
		}
		require.NoError(t, etcdstore.CheckPrefix(ctx, cli, outer))
		// Key spaces that the outer deployment's clients do not choose
		// keys in are not refused: a key such as /leases/x of another
		// program at the root does not refuse every prefix.
		for _, beside := range []string{outer + "other/", outer + "epochs/a/b/", outer + "tenant/data/"} {
			require.NoError(t, etcdstore.CheckPrefix(ctx, cli, beside), "%s with a key under %s", beside, dir)
		}
		_, err = cli.Delete(ctx, outer+dir+"x")
		require.NoError(t, err)
	}
	// A sibling's keys do not make it an ancestor.
	_, err := cli.Put(ctx, outer+"data/tenant1/epochs/x", "1")
	require.NoError(t, err)
	require.NoError(t, etcdstore.CheckPrefix(ctx, cli, outer+"data/tenant2/"))
}

// TestCheckPrefixSeesOnlyWhatRBACAllows checks a prefix inside an outer
// deployment as an etcd user whose role is confined to that prefix: the
// outer deployment's keys are out of its sight, so the check passes (the
// RBAC is the isolation), while the same check as root refuses it.
func TestCheckPrefixSeesOnlyWhatRBACAllows(t *testing.T) {
	ctx := fencertest.Context(t)
	member := fencertest.Etcd(t)
	root := fencertest.Client(t, member.Endpoint())
	inner := "/fencer/data/tenant2/"
	_, err := root.Put(ctx, "/fencer/epochs/T0", "1")
	require.NoError(t, err)
	for _, step := range []func() error{
		func() error { _, err := root.UserAdd(ctx, "root", "rootpw"); return err },
		func() error { _, err := root.UserGrantRole(ctx, "root", "root"); return err },
		func() error { _, err := root.RoleAdd(ctx, "tenant2"); return err },
		func() error {
			_, err := root.RoleGrantPermission(ctx, "tenant2", inner, clientv3.GetPrefixRangeEnd(inner), clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		},
		func() error { _, err := root.UserAdd(ctx, "tenant2", "tenant2pw"); return err },
		func() error { _, err := root.UserGrantRole(ctx, "tenant2", "tenant2"); return err },
		func() error { _, err := root.AuthEnable(ctx); return err },
	} {
		require.NoError(t, step())
	}
	as := func(user, password string) *clientv3.Client {
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{member.Endpoint()}, Username: user, Password: password, DialTimeout: 30 * time.Second, Logger: zap.NewNop()})
		require.NoError(t, err)
		t.Cleanup(func() { cli.Close() })
		return cli
	}
	require.NoError(t, etcdstore.CheckPrefix(ctx, as("tenant2", "tenant2pw"), inner))
	var nested *etcdstore.NestedPrefixError
	require.ErrorAs(t, etcdstore.CheckPrefix(ctx, as("root", "rootpw"), inner), &nested)
}
