// Package client is the Go client of fencer's gRPC service (see package
// server and proto/fencer/v1).
//
// It mirrors the library (package etcdstore) over the network: a Session
// holds leases, each Lease has a Token and a Done channel, and Put, Delete,
// Txn and Advance are guarded by a token. Errors are the library's: a stale
// write returns a *token.StaleError that matches token.ErrStale, with Newer
// filled in when the server knew the superseding token.
//
// Concurrent Puts on one Client share calls: while one is in flight, the
// others queue and leave together as one PutMany, each with its own guard
// and its own result (see Client.Put). Goroutines that write should share
// a Client, as they would share an etcd client with the library.
//
// # What is guaranteed
//
// A guarded write commits only if its token is current when etcd applies
// it; the check is etcd's, run by the server inside the write's own
// transaction.
//
// # What is not guaranteed
//
//   - Lease.Done is advisory: it closes when the server's watch reports the
//     lease lost, or when renewals have failed until the local deadline. A
//     paused process may act before it notices; only guarded writes are
//     fenced.
//   - A write that fails with a transport error may or may not have
//     committed.
//   - The client does not retry calls; the grpc connection's own policy
//     (e.g. several server addresses with round_robin) decides which
//     server a call reaches.
//
// # Imports
//
// client is a module of its own (github.com/fencer-dev/fencer/client) on
// token, proto and grpc. It must not import etcdstore, server,
// kubeadapter or any other package of the root module, any go.etcd.io
// module, or any k8s.io or sigs.k8s.io module, so that a gRPC user's
// module graph holds none of them (internal/layout enforces it). Its
// errors are therefore the token package's, which etcdstore aliases.
package client
