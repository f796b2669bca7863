package etcdstore

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
		{"create revision", createRevisionIs("/fencer/leases/a", 42), clientv3.Compare(clientv3.CreateRevision("/fencer/leases/a"), "=", 42)},
		{"create revision 0", createRevisionIs("k", 0), clientv3.Compare(clientv3.CreateRevision("k"), "=", 0)},
		{"value", valueIs("/fencer/owners/k", "a!7"), clientv3.Compare(clientv3.Value("/fencer/owners/k"), "=", "a!7")},
		{"empty value", valueIs("k", ""), clientv3.Compare(clientv3.Value("k"), "=", "")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.True(t, proto.Equal(tc.want.GetCompare(), tc.got.GetCompare()), "got %v, want %v", tc.got.GetCompare(), tc.want.GetCompare())
		})
	}
}
