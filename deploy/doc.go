// Package deploy is the home of fencer's deployment files, whose tests
// check them against the real tools that consume them, and carries the
// Kubernetes manifests of fencer's library into Go programs, so that a test
// suite or an installer outside this repository applies exactly the files
// this repository tests.
//
//   - service/: kustomize manifests for fencer serve against an external
//     etcd cluster; rendered with kustomize and applied with server-side
//     apply to a real kube-apiserver in the tests; the commands that
//     docs/operations.md gives before applying them (the Secrets the
//     Deployment mounts, the image build and kustomize edit set image) are
//     checked against the manifests.
//   - admission/ and rbac/: the admission policies and the Role of fencer's
//     Kubernetes library, embedded in FS (see Policy, LiveLease and Role).
//   - monitoring/: Prometheus alert rules and a Grafana dashboard, checked
//     by the PromQL test in tools/promcheck.
//   - ../Dockerfile: the container image; the tests run its build stage's
//     go build with the VERSION and COMMIT build arguments and check that
//     the binary is static and prints them.
//
// FS holds, at the paths the constants name:
//   - admission/policy.yaml: the ValidatingAdmissionPolicy and binding that
//     make the API server refuse stale fencing tokens (Policy);
//   - admission/live-lease.yaml: the opt-in policy that also refuses writes
//     of a holder whose Lease has moved on (LiveLease);
//   - rbac/role.yaml: the Role fencer's Kubernetes library needs in the
//     namespace of its fence Leases (Role).
//
// The embedded files are the ones under deploy/ at the version of the module
// in use; nothing here parses or applies them (package
// fencertest/kubefencertest installs them into an API server).
package deploy
