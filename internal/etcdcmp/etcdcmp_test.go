package etcdcmp

import (
	"testing"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"
)

// TestComparesAreClientv3s: the compares built in place are exactly
// clientv3.Compare's of the same arguments.
func TestComparesAreClientv3s(t *testing.T) {
	for _, tc := range []struct {
		name      string
		got, want clientv3.Cmp
	}{
		{"create revision", CreateRevisionIs("/fencer/leases/a", 42), clientv3.Compare(clientv3.CreateRevision("/fencer/leases/a"), "=", 42)},
		{"create revision 0", CreateRevisionIs("k", 0), clientv3.Compare(clientv3.CreateRevision("k"), "=", 0)},
		{"mod revision", ModRevisionIs("/fencer/epochs/a", 7), clientv3.Compare(clientv3.ModRevision("/fencer/epochs/a"), "=", 7)},
		{"mod revision 0", ModRevisionIs("k", 0), clientv3.Compare(clientv3.ModRevision("k"), "=", 0)},
		{"value", ValueIs("/fencer/owners/k", "a!7"), clientv3.Compare(clientv3.Value("/fencer/owners/k"), "=", "a!7")},
		{"empty value", ValueIs("k", ""), clientv3.Compare(clientv3.Value("k"), "=", "")},
		{"version", VersionIs("/fencer/claims/a", 0), clientv3.Compare(clientv3.Version("/fencer/claims/a"), "=", 0)},
		{"version above", VersionAbove("/fencer/claims/a", 0), clientv3.Compare(clientv3.Version("/fencer/claims/a"), ">", 0)},
		{"lease", LeaseIs("/fencer/leases/a", 0x1234), clientv3.Compare(clientv3.LeaseValue("/fencer/leases/a"), "=", int64(0x1234))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.True(t, proto.Equal(tc.want.GetCompare(), tc.got.GetCompare()), "got %v, want %v", tc.got.GetCompare(), tc.want.GetCompare())
		})
	}
}
