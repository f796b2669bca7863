// Package fenced writes Kubernetes objects fenced by a fencer token: the
// object protocol of docs/protocol.md, for controller-runtime clients
// (Client, NewClient) and for client-go's typed and dynamic clients
// (UpdateFenced, DeleteFenced).
//
// # The engine
//
// Every fenced write, whatever its path, runs the one engine in engine.go;
// a path differs from another only in how it reads, what it sends, and
// what it does with an absent object. Each attempt
//
//  1. reads the object itself: through the first reader (WithReader, such
//     as a manager's cache) on the first attempt, through the API reader
//     (WithAPIReader) after a conflict, when a first read did not return
//     the resourceVersion the caller pinned, and always with
//     WithLiveRead; UpdateFenced and DeleteFenced read with the caller's
//     get. The caller's object supplies the content written, never the
//     stamp checked or the version written over.
//  2. checks the stamp of exactly the version read with token.CheckStamp
//     (WithTakeover lets a write take over another lease's object, keeping
//     that lease's mark).
//  3. stamps the token over that version's protocol annotations
//     (token.Restamp), so a caller-built object can neither lower nor drop
//     a stamp.
//  4. writes conditionally on that version's resourceVersion (and UID,
//     where a write could otherwise create), so the API server refuses the
//     write if any write, in particular a newer holder's, landed between
//     the check and the write.
//  5. on a Conflict, retries from a fresh live read, at most
//     WithMaxAttempts times and only while the Holder still holds the
//     lease, unless the caller pinned a version of its own: then it
//     returns the Conflict, or the *token.StaleError that a fresh read
//     shows.
//
// The paths: Client's Update, Patch, Apply and Delete; the status writer
// (Client.Status, Client.SubResource("status")), whose writes cannot carry
// a stamp and are fenced by a precondition on a version that carries the
// holder's own; UpdateFenced and DeleteFenced. Create is conditional by
// nature and only checks the caller's object.
//
// # Contract
//
// Per object: once a write stamped with a token of a lease has landed on
// an object, no write through this package with a smaller token of that
// lease lands on it afterwards, also after other leases took the object
// over. The API server's optimistic concurrency is what refuses a write
// when a newer holder wrote in between; the check is what refuses a write
// over a newer stamp or a lease's mark.
//
// What is not guaranteed: that a stale holder cannot write (create,
// delete, or write for the first time) an object that no newer holder
// has written yet: that write is ordered before the newer holder's; the
// opt-in live-Lease admission mode refuses those (docs/protocol.md).
// Nothing about objects written by other means: install the admission
// policy in deploy/admission for those. A Holder's Err stops retries early;
// the safety of a write never depends on it. DeleteAllOf, a core/v1
// Binding's create, subresources other than status and patch types other
// than JSON, merge, strategic merge and apply are refused with
// ErrUnsupported.
//
// # Holders
//
// A write takes a Holder, which is token.Holder: kubeadapter's Held and
// shard.Held, and the etcd store's and the gRPC client's leases (whose
// tokens name no Kubernetes Lease and are refused with a
// *token.MalformedError), satisfy it without this package importing theirs.
//
// # Imports
//
// fenced imports token (and internal/mutant, the mutation-testing switch,
// a constant false in builds without the fencer_mutants tag) apart from
// the Kubernetes libraries (apimachinery, client-go, controller-runtime's
// client); never kubeadapter, etcdstore or any go.etcd.io module
// (internal/layout enforces it).
package fenced
