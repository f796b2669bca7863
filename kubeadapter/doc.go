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
// Context. A leader.Leader (package kubeadapter/leader) runs
// controller-runtime leader-only work under an Elector with such a context
// and acquires again, with a greater token, after a loss. The Watcher also feeds the metrics (WithRegisterer). See
// docs/fencing.md for what this gives over client-go, its timings, and
// the RBAC it needs.
//
// # Fenced writes
//
// Package kubeadapter/fenced writes objects with these tokens: its Client
// wraps a controller-runtime client, and UpdateFenced and DeleteFenced
// serve client-go's typed and dynamic clients, all through one engine
// (see its doc). A Held, a shard.Held and a shard.Delegate are the Holder
// (token.Holder) that fenced writes take.
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
//   - What a fenced write guarantees is package fenced's contract.
//
// # Imports
//
// kubeadapter is the root of the Kubernetes module
// (github.com/fencer-dev/fencer/kubeadapter), which never requires fencer's
// root module: no etcd server, porcupine or kustomize reaches a
// controller's module graph through it. kubeadapter itself imports token
// and client-go, never controller-runtime (package kubeadapter/leader
// does), any go.etcd.io module, or its own kubeadapter/shard
// (internal/layout enforces it). The pure
// Lease-record functions it shares with kubeadapter/shard are in
// kubeadapter/internal/leaserecord; the fake Lease clientset of both
// packages' unit tests is kubeadapter/internal/leasefake, which no
// production package imports.
package kubeadapter
