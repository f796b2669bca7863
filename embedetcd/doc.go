// Package embedetcd runs etcd members in-process, for fencer's server and
// tests.
//
// A member started here is a real etcd server from
// go.etcd.io/etcd/server/v3/embed: it persists to its data directory, runs
// raft, and serves the ordinary etcd v3 API. It is meant for single-machine
// deployments (fencer serve's default) and for tests.
//
// A member either listens on loopback TCP ports (Member.ClientPort and
// PeerPort, for tests and in-process clusters) or, with Member.Socket, on
// unix sockets inside its data directory. etcd keeps its data directory
// mode 0700, and the sockets are made 0600, so only the user running the
// member (fencer, or an operator with that user's rights) can connect.
// Neither mode configures TLS or etcd authentication.
//
// Every member compacts its history automatically, keeping at most
// DefaultCompactionRetention of it (so that watches resume across
// reconnections shorter than that) and at most a quarter of its backend
// quota (DefaultQuotaBytes by default), and recovers by itself from the
// NOSPACE alarm (see WithCompactionRetention). It holds an exclusive lock
// on its data directory for its lifetime: a second member on the same
// directory fails at once with a *LockedError instead of waiting on
// etcd's own file lock.
//
// Compaction frees space inside the database file for reuse but does not
// shrink the file; only a defragmentation does (etcdctl defrag, or the
// compactor's NOSPACE recovery; it blocks the member while it runs).
// Bounded history keeps the file bounded, since writes reuse the pages
// compaction frees.
//
// # Imports
//
// embedetcd imports etcd's server, never the Kubernetes client libraries,
// etcdstore, server, client or kubeadapter (internal/layout enforces it).
package embedetcd
