// Package etcdcmp builds the etcd compares of fencer's hot paths (guarded
// writes, acquisitions, releases) in place. Each function returns exactly
// what clientv3.Compare makes of the same arguments, without the
// reflective proto.Clone of its argument that clientv3.Compare makes
// first, which cost about a tenth of a loaded server's CPU time on guarded
// writes and a twentieth on acquire and release. It does not cover
// etcd's other targets or results; use clientv3.Compare for those.
package etcdcmp

import (
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// CreateRevisionIs is clientv3.Compare(clientv3.CreateRevision(key), "=", rev).
func CreateRevisionIs(key string, rev int64) clientv3.Cmp {
	cmp := clientv3.CreateRevision(key)
	c := cmp.GetCompare()
	c.Result = pb.Compare_EQUAL
	c.TargetUnion = &pb.Compare_CreateRevision{CreateRevision: rev}
	return cmp
}

// ModRevisionIs is clientv3.Compare(clientv3.ModRevision(key), "=", rev).
func ModRevisionIs(key string, rev int64) clientv3.Cmp {
	cmp := clientv3.ModRevision(key)
	c := cmp.GetCompare()
	c.Result = pb.Compare_EQUAL
	c.TargetUnion = &pb.Compare_ModRevision{ModRevision: rev}
	return cmp
}

// ValueIs is clientv3.Compare(clientv3.Value(key), "=", value).
func ValueIs(key, value string) clientv3.Cmp {
	cmp := clientv3.Value(key)
	c := cmp.GetCompare()
	c.Result = pb.Compare_EQUAL
	c.TargetUnion = &pb.Compare_Value{Value: []byte(value)}
	return cmp
}

// VersionIs is clientv3.Compare(clientv3.Version(key), "=", v).
func VersionIs(key string, v int64) clientv3.Cmp {
	cmp := clientv3.Version(key)
	c := cmp.GetCompare()
	c.Result = pb.Compare_EQUAL
	c.TargetUnion = &pb.Compare_Version{Version: v}
	return cmp
}

// VersionAbove is clientv3.Compare(clientv3.Version(key), ">", v).
func VersionAbove(key string, v int64) clientv3.Cmp {
	cmp := clientv3.Version(key)
	c := cmp.GetCompare()
	c.Result = pb.Compare_GREATER
	c.TargetUnion = &pb.Compare_Version{Version: v}
	return cmp
}

// LeaseIs is clientv3.Compare(clientv3.LeaseValue(key), "=", int64(id)).
func LeaseIs(key string, id clientv3.LeaseID) clientv3.Cmp {
	cmp := clientv3.LeaseValue(key)
	c := cmp.GetCompare()
	c.Result = pb.Compare_EQUAL
	c.TargetUnion = &pb.Compare_Lease{Lease: int64(id)}
	return cmp
}
