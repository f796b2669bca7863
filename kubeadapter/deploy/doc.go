// Package deploy carries the Kubernetes manifests of fencer's library into
// Go programs, so that a test suite or an installer outside this
// repository applies exactly the files this repository tests:
//   - admission/policy.yaml: the ValidatingAdmissionPolicy and binding that
//     make the API server refuse stale fencing tokens (Policy);
//   - admission/live-lease.yaml: the opt-in policy that also refuses writes
//     of a holder whose Lease has moved on (LiveLease);
//   - rbac/role.yaml: the Role fencer's Kubernetes library needs in the
//     namespace of its fence Leases (Role).
//
// The files live here, in the Kubernetes module, because a Go module can
// embed only its own files. The embedded files are the ones at the version
// of the module in use; nothing here parses or applies them (package
// kubeadapter/kubefencertest installs them into an API server, and its
// tests check them against a real one). Package deploy imports embed only.
package deploy
