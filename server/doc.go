// Package server serves fencer's gRPC API (proto/fencer/v1) over an
// etcdstore.Store, for writers that do not link the Go library.
//
// # Sessions
//
// A remote session is an etcd lease that the server grants for an
// authenticated principal, plus a key <prefix>sessions/<id> on the same
// lease that names the principal. Leases acquired through the session are
// etcdstore holder keys on that etcd lease, with the holder identity
// "<principal>/<session id>". KeepAlive renews the etcd lease. Nothing lives
// in a server's memory that another server needs, so several servers can
// front one etcd cluster and any of them can serve any session.
//
// # Operations
//
// Health (grpc.health.v1 and HealthHandler's /readyz) follows a periodic
// linearizable read of etcd, and the gauge fencer_etcd_up with it; health
// and reflection need no credentials. Every etcd request of a call requires
// an etcd leader, so a member without quorum fails calls at once with
// UNAVAILABLE, and BoundRequests (which fencer serve applies) ends each
// etcd request that gets no answer in time, so that no call hangs on an
// unreachable etcd. etcd's errors reach clients as codes and ErrorInfo causes
// from one table (errors.go). Config.Logger receives call logs and audit
// records (attribute audit=true) of every acquisition, release, loss and
// refused write. TokenFile reloads a bearer token file while it runs.
//
// # What is guaranteed
//
//   - Guarded writes (Put, Delete, Txn, Advance) are etcdstore's: etcd
//     commits them only while the token is its lease's current token.
//   - A principal can renew, release, watch or write only with its own
//     sessions and tokens; otherwise the call fails with PERMISSION_DENIED
//     before anything is written.
//   - Requests are validated against the limits in docs/service.md before
//     anything is sent to etcd; an invalid one fails with INVALID_ARGUMENT
//     naming the field. Each input is checked once, with etcdstore's
//     checks (etcdstore.CheckPut and the like, validate.go), before the
//     token's holder is read, and the writes take the checked input
//     (etcdstore.PutChecked and the like) without checking it again.
//
// # What is not guaranteed
//
//   - WatchLease is early warning for self-fencing, not the guarantee; a
//     remote holder that acts after its lease is gone is stopped by the
//     guard, not by the watch.
//   - Authentication is as strong as its configuration: Anonymous admits
//     anyone who can reach the port, bearer tokens over plaintext can be
//     read on the network, and ClientCertificates checks no revocation and
//     trusts every CA in the TLS configuration's ClientCAs alike.
//   - A call that fails with STORE_UNAVAILABLE may or may not have been
//     applied.
//   - Readiness is as fresh as its last check (every ReadinessInterval):
//     SERVING does not promise that the next call reaches etcd.
//   - Writes made with a raw etcd client bypass both the guard's caller
//     check and the principal binding.
//
// # Imports
//
// server imports etcdstore, token and proto, never etcd's server code (it
// serves over an etcd client; embedetcd runs members), the Kubernetes
// client libraries, client, embedetcd or kubeadapter (internal/layout
// enforces it).
package server
