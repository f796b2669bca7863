// Package fencertest is fencer's test kit: real etcd, a real fencer
// service and a way to be superseded on demand, each in one call, each
// stopped through the test's Cleanup, so that users can test how their own
// fenced code behaves when another holder takes over, as httptest does for
// HTTP handlers.
//
//	func TestReconcilerStopsWhenSuperseded(t *testing.T) {
//		st := fencertest.Store(t) // a fresh embedded etcd
//		lease, _ := fencertest.Session(t, st).Acquire(t.Context(), "orders")
//		r := &reconciler{st: st, lease: lease} // the reconciler of Example_supersededController
//		fencertest.Supersede(t, st, lease)     // another holder acquires "orders", now: no TTL wait
//		err := r.reconcile(t.Context(), "999")
//		require.ErrorIs(t, err, token.ErrStale) // refused by etcd itself
//		require.True(t, r.stopped)
//	}
//
// What it offers:
//   - Store: an etcdstore.Store on a fresh in-process etcd member (Etcd,
//     Client, StoreOn and Session are the parts it is made of).
//   - SharedStore: a store under a prefix of its own on the test binary's
//     shared member (SharedEtcd), for packages with many tests: one member
//     for all of them, stopped by Main (or StopShared).
//   - Context and WaitClosed: a bounded context for a test's calls, and a
//     bounded wait for a channel to close.
//   - Cluster: an etcd cluster of member processes, with Stop (SIGKILL),
//     Restart and Partition of one member.
//   - Service: an in-process fencer service (what fencer serve runs) and a
//     connected client.Client, with TLS, mutual TLS, bearer-token and
//     authorization options; Serve for a server.Config of the caller's own.
//   - Supersede: another holder acquires a held lease at once, without
//     waiting for a TTL, so that the holder's next guarded write fails with
//     token.ErrStale; it works for leases of the library and of the service's
//     client alike.
//   - Main and LeakOptions: a TestMain that also checks for goroutine leaks
//     with goleak, and lets Cluster run its members; IgnoreInProcessPeers
//     for tests that run several etcd members in one process.
//
// Package kubeadapter/kubefencertest, in the Kubernetes module, does the
// same for Kubernetes, so that etcd-only users do not depend on it.
//
// # What is not guaranteed
//
//   - The kit is for tests: etcd runs on loopback without TLS or
//     authentication, and data lives in temporary directories.
//   - Supersede makes the holder's token stale at once, but the holder
//     learns it only through its watch, a moment later: Done is prompt, not
//     instantaneous. Tests that depend on Done wait for it.
//   - Cluster re-executes the test binary as etcd members, so its package's
//     TestMain must call RunIfMember (or Main) first. Partition cuts a member
//     off in both directions on Linux only.
//   - Every step is bounded by Timeout; on a machine too slow for that, the
//     kit fails the test rather than waiting forever.
//
// # Imports
//
// fencertest never imports the Kubernetes client libraries or
// kubeadapter; those helpers are in kubefencertest, so that etcd-only
// users do not compile Kubernetes (internal/layout enforces it).
package fencertest
