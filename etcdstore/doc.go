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
//   - Store.Guard turns a token into etcd Cmps that hold only while the
//     token is exactly its lease's current token: the holder key's create
//     revision and the epoch key's value. Put, Delete and Txn add them to
//     the write's own Txn, so a write from a superseded holder, or with a
//     token no acquisition issued, fails in etcd itself, however late it
//     arrives, with a *token.StaleError.
//   - Keys belong to leases: <prefix>owners/<key> names the lease that
//     owns the data key <key>, and the token of its last guarded write.
//     Put, Delete and Txn also check, in the same Txn, that the writer's
//     lease owns the key or that nobody does (and then claim it), so the
//     holder of another lease gets a *token.ForeignLeaseError. Only an
//     explicit TakeOver, itself fenced, moves a key to another lease.
//   - Store.Advance records the highest token that has passed for an
//     external resource (a sequencer check for stores that cannot run an
//     etcd Txn); the resource belongs to the lease whose token it records.
//   - WithLockDelay gives an acquisition a lock-delay: if it ends without
//     a clean release by its holder (Lease.Release), because its session
//     expired or was closed, its holder key was deleted or someone released
//     its token with Store.Release, the lease cannot be acquired again
//     until the delay has passed on etcd's clock, timed by an etcd lease
//     and checked by the acquiring Txn itself. Until then TryAcquire
//     returns a *token.LockDelayError and Acquire waits. It keeps a holder
//     that has not yet noticed its loss (a process in its grace period)
//     from overlapping its successor in side effects the store cannot
//     fence; its cost is that a lease whose holder crashed is unavailable
//     for the session's TTL plus the delay.
//   - Put, Delete, Txn, Release and Advance check their arguments on
//     every call. CheckPut, CheckDelete, CheckToken and CheckAdvance make
//     those checks on their own and return a Checked, which PutChecked,
//     DeleteChecked, TxnChecked, ReleaseChecked and AdvanceChecked take
//     without checking it again: a caller that must refuse bad input
//     before its own work (the service authorizes a token in etcd before
//     it writes) checks each input once. That is why the service does not
//     simply leave the checks to the store's calls.
//   - Concurrent writes (guarded Put and Delete, acquisitions, Release,
//     Advance) share etcd Txns: a write that finds another in flight leaves
//     with the others queued behind it, each as a nested Txn under its own
//     guard. See WithBatching. PutManyChecked hands the store several puts
//     at once, which then leave together (the service's PutMany).
//
// # What is guaranteed
//
// A guarded write commits only if, at the revision it commits at, the
// holder key exists with the token's create revision and the epoch key
// holds the token's epoch, and, for a data key, the token's lease owns the
// key or nobody does. Those checks are etcd's, inside the same Txn as the
// write.
//
// # Key layout, under the store's prefix
//
//	leases/<name>   holder record, on the holder's etcd lease; its create revision is the token's revision
//	epochs/<name>   acquisition counter, written only by the acquiring Txn
//	owners/<key>    "<lease> <token>": the lease that owns data key <key> and the token of its
//	                last guarded write; written only by guarded writes, under that token's full guard
//	fences/<res>    the highest token that passed Advance for resource <res>; its lease owns <res>
//	data/<key>      the guarded key-value space of Put, Get and Delete
//	delays/<name>   lock-delay marker of an acquisition with a delay: "<ms>", and " <etcd lease ID>" once an
//	                acquirer has started the delay; deleted by a clean release or an acquisition without a delay
//	delays/<name>/claim  on an etcd lease with the delay's TTL: the delay runs while it exists
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
//   - A data key or resource that no lease has written yet belongs to the
//     first lease that writes it: the store cannot know which lease it was
//     meant for. Restrict who may write which keys (the service's
//     authorization) to keep a holder of another lease from claiming it
//     first; the rightful lease can take it back only by a TakeOver.
//   - The owner record outlives a Delete of its key, so deleted keys keep
//     one small key each under owners/.
//   - Writes that shared a Txn report the same revision; a revision does not
//     identify one write.
//
// # Files
//
// store.go opens a Store; session.go and lease.go acquire and hold leases;
// guard.go holds the guard of a token (Guard, Check, Release, Advance);
// write.go the guarded writes of data keys (Put, Delete, Txn); checked.go
// their arguments checked once (Checked); owner.go
// the owner records those writes keep; batch.go the batching of Puts and
// Deletes into shared Txns; delay.go the lock-delay; watch.go the watch of
// holder keys; prefix.go the key layout's checks; errors.go the errors.
//
// # Imports
//
// etcdstore imports token and etcd's client, never etcd's server code
// (go.etcd.io/etcd/server), the Kubernetes client libraries (k8s.io/api,
// apimachinery, client-go, controller-runtime; k8s.io/utils/clock, which
// has no dependencies, is its clock), proto, client, server or
// kubeadapter (internal/layout enforces it). Its shared errors, Value and
// Status are aliases of the token package's.
package etcdstore
