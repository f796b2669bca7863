// Package kubeadapter turns Kubernetes Leases into fencing tokens and
// fences writes to Kubernetes objects with them.
//
// # Tokens from Leases
//
// An Elector acquires a coordination.k8s.io/v1 Lease, writing the same
// record as client-go's LeaseLock, so that it interoperates with stock
// client-go electors. Each acquisition is a Held whose token is
//
//	token.Token{Lease: "namespace/name", Epoch: leaseTransitions, Revision: resourceVersion}
//
// where resourceVersion is that of the acquiring write. Tokens are ordered
// by Revision, which grows with every write to the Lease, including one
// that recreates it after a delete; Epoch is for people. The Elector
// increments leaseTransitions on every acquisition and adds a per-Elector
// nonce to its identity, so that a restarted process is a new holder with
// a greater token.
//
// Expiry is judged like client-go: by how long the record has been seen
// unchanged on the candidate's own clock, never by the record's
// timestamps. A holder ends its Held (fail closed) when renewal has failed
// for RenewDeadline, which is less than LeaseDuration, so it stops before
// any other candidate may take over.
//
// # Self-fencing
//
// A Watcher, one per process, lists and watches Leases and ends every
// Held of the Electors configured with it (Config.Watcher) as soon as an
// event shows its Lease deleted, replaced or taken, cancelling the Held's
// Context. A Leader runs controller-runtime leader-only work under an
// Elector with such a context and acquires again, with a greater token,
// after a loss. The Watcher also feeds the metrics (WithRegisterer). See
// docs/fencing.md for what this gives over client-go, its timings, and
// the RBAC it needs.
//
// # Fenced writes
//
// Client wraps a controller-runtime client; UpdateFenced and DeleteFenced
// serve client-go's typed and dynamic clients. They implement the object
// protocol of docs/protocol.md: read the object themselves (from a cache
// when it holds the version to be written, live otherwise), check the
// stamp of exactly that copy with token.CheckStamp, stamp the token over
// that copy's fencer annotations (token.Restamp), and write conditionally
// on that copy's resourceVersion. Annotations and resourceVersions that
// the caller supplies are never trusted: a version the caller pinned must
// be the one checked, or nothing is written. The API server's optimistic
// concurrency is what rejects a write when a newer holder wrote in
// between; the check is what rejects a write over a newer stamp, or over
// a lease mark left by a takeover. The admission policy in deploy/admission
// enforces the same order on writers that do not use this package.
//
// # Sharding
//
// Sharding lives in kubeadapter/shard, which builds on this package's
// exported API only: an Elector and Held for each member's heartbeat
// (renewed out of turn, with a mark, by Held.Renew), the Watcher's ring
// source (Labelled and Subscribe) and Watcher.RecordLeaseWrite for its
// Lease writes. This package does not import it. See docs/sharding.md.
//
// # What is not guaranteed
//
//   - Fencing is per object. A stale holder can still write an object that
//     no newer holder has written; that write is ordered before the newer
//     holder's writes to it.
//   - A Held's Done and Err report loss when the Watcher's event reaches
//     the process (without a Watcher, up to a renewal period late), and not
//     at all while the process is paused or, until the renew deadline, cut
//     off from the API server. They stop work early; they are not what
//     makes a write safe.
//   - Status writes are conditional on a version stamped with the
//     writer's own token. Deletes are conditional on the UID and
//     resourceVersion that were checked. Creates cannot be fenced per
//     object against an object that does not exist yet (the opt-in
//     live-Lease admission mode refuses them; docs/protocol.md).
//   - Patches and server-side apply are sent as patches and applies,
//     with the stamp and a resourceVersion precondition added, so fields
//     the caller's Go type does not know are kept. An apply also carries
//     the UID read, so it never creates again an object that was read
//     and has since been deleted (ErrDeleted).
//   - DeleteAllOf and subresources other than status are refused.
//
// # Imports
//
// kubeadapter imports token and the Kubernetes client libraries, never
// any go.etcd.io module, etcdstore, server, client, embedetcd, proto or
// its own kubeadapter/shard (internal/layout enforces it). The pure
// Lease-record functions it shares with kubeadapter/shard are in
// kubeadapter/internal/leaserecord; the fake Lease clientset of both
// packages' unit tests is kubeadapter/internal/leasefake, which no
// production package imports. Its fenced writes take a token.Holder, so
// any fencer lease type is accepted where the type system is concerned.
package kubeadapter
