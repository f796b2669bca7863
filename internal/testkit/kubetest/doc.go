// Package kubetest runs a real kube-apiserver on loopback for fencer's tests.
//
// An Env is an in-process etcd member (package embedetcd) and a
// kube-apiserver child process serving HTTPS on 127.0.0.1. Its behaviour is
// the real API server's: optimistic concurrency on resourceVersion, RBAC,
// and ValidatingAdmissionPolicy all run exactly as in a cluster. What an Env
// does not run is everything outside the API server: there is no
// kube-controller-manager, so nothing garbage-collects objects, finalizes
// namespace deletion or issues service-account tokens, and there are no
// nodes.
//
// The kube-apiserver binary is built from the pinned module in
// tools/kube-apiserver by scripts/build-kube-apiserver.sh (make
// kube-apiserver). BinaryPath says where it is looked for.
//
// Tests use StartForTest. Packages that share one Env across tests keep a
// Shared, which starts it on first use, and call Shared.Main from
// TestMain. Stallable is a Lease client that a test can pause or kill, as
// a process's link to the API server; CreateNamespace gives a test a
// namespace of its own.
package kubetest
