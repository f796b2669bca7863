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
// Tests use StartForTest. Packages that share one Env across tests call
// Start from TestMain and Stop when the tests are done.
package kubetest
