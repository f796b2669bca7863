// Package deploy carries fencer's Kubernetes manifests into Go programs, so
// that a test suite or an installer outside this repository applies exactly
// the files this repository tests.
//
// FS holds, at the paths the constants name:
//   - admission/policy.yaml: the ValidatingAdmissionPolicy and binding that
//     make the API server refuse stale fencing tokens (Policy);
//   - admission/live-lease.yaml: the opt-in policy that also refuses writes
//     of a holder whose Lease has moved on (LiveLease);
//   - rbac/role.yaml: the Role fencer's Kubernetes library needs in the
//     namespace of its fence Leases (Role).
//
// The files are the ones under deploy/ at the version of the module in use;
// nothing here parses or applies them (package fencertest/kubefencertest
// installs them into an API server).
package deploy
