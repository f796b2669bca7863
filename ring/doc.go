// Package ring divides a named, fixed set of shards (a ring) among the
// members that join it, each shard held as an ordinary fencer lease, so
// that every guarded write (Put, Delete, Txn, Advance, Check) fences on a
// shard's token unchanged.
//
// The store model, under an etcdstore.Store's prefix:
//
//   - <prefix>rings/<ring>: the ring record, its shard list (JSON), written
//     once by Define and never changed.
//   - <prefix>ringmembers/<ring>/<member>: a member key, written by Join on
//     the member's etcd lease (its session), whose value names the holder
//     and says whether the member is active or leaving. It expires with the
//     session: etcd, not the members, judges death.
//   - A shard is the fencer lease ring:<ring>:<shard>, acquired with
//     etcdstore.Store.AcquireOn on the member's etcd lease, in a Txn that
//     also compares the member key to be this member's, active. The shard's
//     token is the holder key's create revision, the holder key vanishes
//     with the session, and nothing is written while shards stay put: the
//     steady-state cost of a member is its session's keepalive.
//
// Shards are assigned by rendezvous hashing of the shard name over the
// live, active members' names. Each Member runs one loop that watches the
// member keys and the ring's holder keys: it acquires the free shards
// assigned to it at once, reports the shards it holds that are assigned
// elsewhere as Losing (at most Config.MovesPerSecond of them per second),
// and releases each when the application says it has drained (Release) or
// after Config.Drain. A shard assigned to a member but still held by
// another is waited for, never taken: at most one member holds a shard at
// any revision, and etcd checks it (the acquiring Txn requires the holder
// key to be absent).
//
// What is not guaranteed: Member.Owns and Updates are the member's view,
// which lags etcd; a member whose session expired may believe it owns a
// shard until it observes the expiry. Correctness comes from the store:
// a write guarded by a shard's old token is refused once the shard moved.
//
// names.go holds the names and errors; define.go the ring record and
// ReadStatus; keys.go the key layout and the member key's value; member.go
// Join and the Member's methods; loop.go the member's loop, which also
// delivers Updates.
//
// # Imports
//
// ring is built on etcdstore's exported API, etcd's client and the
// rendezvous hash: never etcd's server code, the Kubernetes client
// libraries, proto, client, server or kubeadapter (internal/layout
// enforces it).
package ring
