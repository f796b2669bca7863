// Package shard shares shards (projects, clusters, namespaces) among the
// replicas of a controller, each shard owned by at most one live replica
// at a time with a fencing token of its own.
//
// A Sharder makes the replicas members of a ring: each member renews one
// heartbeat Lease (a kubeadapter.Elector and kubeadapter.Held), and each
// shard has a Lease written only when the shard moves (create, handoff,
// release, takeover of an orphaned shard), so renewal writes grow with
// members, not shards. A shard's token comes from its own Lease
// (kubeadapter.TokenOf), so kubeadapter's fenced client and the admission
// policy fence a shard's writers unchanged. Owns answers without a lock;
// Shard returns a Held for fenced.NewClient; Gate drops requests of
// shards the member does not own at dispatch, and AcquiredSource
// enqueues a shard's objects when the member starts to own it. Dead
// members are detected on each survivor's own clock from an unchanged
// resourceVersion, never from a record's timestamps. A View is a
// read-only delegate of one member (a pod per namespace) that acts on the
// member's shards with their tokens (Delegate) and writes no Lease.
// Metrics records this package's metrics (NewMetrics, Config.Metrics).
// See docs/sharding.md.
//
// # What is not guaranteed
//
// Two members may believe they own a shard at the same instant: a paused
// or partitioned former owner believes it until it notices. Its writes
// are then refused by the store through the token (the fenced client and
// the admission policy), per object, as for any kubeadapter.Held. A Held
// or a Delegate ends when this process learns of the change, not when the
// change happens.
//
// # Why a package of its own
//
// The Sharder once reached into kubeadapter's unexported state: it
// renewed the heartbeat Held by hand through its fields, read the
// Watcher's private Lease index, and counted its metrics through the
// Watcher's collectors. Each reach is now a documented seam in
// kubeadapter (Held.Renew and Held.Lease, Watcher.Labelled and
// Watcher.Subscribe, Watcher.RecordLeaseWrite), and this package keeps its
// own metrics. The pure Lease-record functions both use are in
// kubeadapter/internal/leaserecord.
//
// # Imports
//
// shard imports kubeadapter (its exported API), kubeadapter/internal/
// leaserecord, token, internal/rendezvous, internal/mutant and the
// Kubernetes and controller-runtime libraries; never etcdstore, server,
// client, embedetcd, proto, fencertest or any go.etcd.io module.
// kubeadapter does not import shard. internal/layout enforces both.
package shard
