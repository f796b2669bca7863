// Package etcdstore is fencer's fencing-token store on etcd v3.
//
// A Store issues tokens and checks them atomically in etcd:
//
//   - A Session owns one etcd lease (one keepalive stream) and one watch on
//     the store's prefix, however many fencer leases it holds.
//   - Session.Acquire and Session.TryAcquire take a named lease. The holder
//     key <prefix>leases/<name> is created on the session's etcd lease, and
//     the acquisition counter <prefix>epochs/<name> is bumped in the same
//     Txn. The token is the holder key's create revision plus that epoch, so
//     a later acquisition always has a greater token, across restarts of the
//     holder and of etcd.
//   - Store.Guard turns a token into an etcd Cmp that holds only while the
//     token is its lease's current token. Put, Delete and Txn add it to the
//     write's own Txn, so a write from a superseded holder fails in etcd
//     itself, however late it arrives, with a *token.StaleError.
//   - Store.Advance records the highest token that has passed for an
//     external resource (a sequencer check for stores that cannot run an
//     etcd Txn).
//   - Concurrent writes (guarded Put and Delete, acquisitions, Release,
//     Advance) share etcd Txns: a write that finds another in flight leaves
//     with the others queued behind it, each as a nested Txn under its own
//     guard. See WithBatching.
//
// # What is guaranteed
//
// A guarded write commits only if, at the revision it commits at, the
// holder key exists with the token's create revision. That check is etcd's,
// inside the same Txn as the write.
//
// # What is not guaranteed
//
//   - Lease.Done is an early warning, not the guarantee: it closes promptly
//     when the session's watch sees the holder key deleted or replaced, or
//     when keepalive has failed until the local deadline, but a process that
//     is paused may act before it notices. Only the guarded write is safe.
//   - Acquire is not fair: waiters race when the holder key is deleted.
//   - Restoring etcd from a backup must bump revisions (etcdutl snapshot
//     restore --bump-revision), or tokens issued after the backup may be
//     issued again.
//   - Writes made outside the store, with a raw etcd client, are not fenced.
//   - Writes that shared a Txn report the same revision; a revision does not
//     identify one write.
package etcdstore
