package server

import (
	"testing"

	"github.com/stretchr/testify/require"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func TestProgressRevisionNeverPassesTheLastEvent(t *testing.T) {
	event := func(rev int64) *clientv3.Event {
		return &clientv3.Event{Type: mvccpb.PUT, Kv: &mvccpb.KeyValue{Key: []byte("k"), ModRevision: rev}}
	}
	// A catch-up response cut short: events up to 1040, the store at 5000.
	cut := clientv3.WatchResponse{Header: &pb.ResponseHeader{Revision: 5000}, Events: []*clientv3.Event{event(1030), event(1040)}}
	require.Equal(t, int64(1040), progressRevision(cut))
	// A progress notification: everything up to the header's revision.
	notify := clientv3.WatchResponse{Header: &pb.ResponseHeader{Revision: 5000}}
	require.Equal(t, int64(5000), progressRevision(notify))
}
