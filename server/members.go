package server

import clientv3 "go.etcd.io/etcd/client/v3"

// members maps each session to its subscribers (the lease hub's feeds,
// the session watch's subscriptions). A session rarely has more than
// one, so each has a slice, where a map per session would cost a few
// hundred bytes for each of thousands of sessions. Ranging over a
// session's slice while removing from it is not safe: range over a copy
// (slices.Clone) then.
type members[T comparable] map[clientv3.LeaseID][]T

func (m members[T]) add(id clientv3.LeaseID, v T) { m[id] = append(m[id], v) }

// remove takes v off id's subscribers, if it is there.
func (m members[T]) remove(id clientv3.LeaseID, v T) {
	vs := m[id]
	for i, x := range vs {
		if x == v {
			last := len(vs) - 1
			vs[i] = vs[last]
			var zero T
			vs[last] = zero
			vs = vs[:last]
			break
		}
	}
	if len(vs) == 0 {
		delete(m, id)
	} else {
		m[id] = vs
	}
}
