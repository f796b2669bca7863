// Package token defines fencer's fencing token: the value a lease holder
// stamps on everything it writes so that the store can reject writes from a
// superseded holder.
//
// A Token names its lease and carries two numbers:
//
//   - Revision orders tokens. For an etcd-backed lease it is the create
//     revision of the holder key; for a Kubernetes Lease it is the
//     resourceVersion of the write that acquired it. A later acquisition of
//     the same lease always has a greater Revision.
//   - Epoch counts acquisitions (etcd epoch counter, Kubernetes
//     leaseTransitions). It is for people reading logs and objects; it
//     never decides order on its own.
//
// Tokens of different leases are not comparable. Compare returns
// ErrForeignLease for them rather than guessing.
//
// # Text form
//
// Version 1 of the text form is
//
//	v1:<epoch>:<revision>:<lease>
//
// where epoch and revision are canonical decimal integers (no sign, no
// leading zeros; revision at least 1) and lease is everything after the
// third colon. Parse accepts exactly the strings String produces, so the
// form round-trips in both directions.
//
// # Kubernetes annotations
//
// On Kubernetes objects a token is stored as three annotations:
// AnnotationLease ("namespace/name"), AnnotationToken (the revision, in
// decimal so that admission CEL can compare it with int()) and
// AnnotationEpoch. See Token.Stamp, FromAnnotations and CheckStamp.
//
// This package only describes and compares tokens. The guarantee that a
// stale token cannot write comes from the store's conditional write, never
// from a comparison made here.
//
// # Imports
//
// token is a module of its own (github.com/fencer-dev/fencer/token) and
// imports only the standard library: no other fencer package, no etcd, no
// Kubernetes module (internal/layout enforces it).
package token
