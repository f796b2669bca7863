// Package kubefencertest is fencer's test kit for Kubernetes: it installs
// fencer's admission policy and RBAC Role into any API server, and
// supersedes a held Lease on demand, so that a controller's envtest suite
// can test what its fenced writes do once another replica has taken over.
// It is apart from package fencertest, in the Kubernetes module, so that
// etcd-only users do not depend on Kubernetes and Kubernetes users do not
// depend on etcd's server.
//
//   - InstallPolicy installs kubeadapter/deploy/admission/policy.yaml
//     (from package kubeadapter/deploy, embedded in the module) and waits until the API server
//     enforces it; InstallLiveLeasePolicy does the same for the opt-in
//     kubeadapter/deploy/admission/live-lease.yaml; CreatePolicies creates another
//     manifest's policies without waiting, and WaitEnforced waits until a
//     policy denies a probe update (and admits the ones it must admit).
//   - InstallRole installs kubeadapter/deploy/rbac/role.yaml in a
//     namespace and binds it.
//   - Supersede makes another identity take a kubeadapter.Held's Lease over
//     at once: leaseTransitions+1, a new holder, no wait for expiry.
//
// In an envtest suite:
//
//	cfg, _ := testEnv.Start()                   // envtest.Environment
//	_ = kubefencertest.InstallPolicy(ctx, cfg)  // the API server now refuses stale stamps
//	_ = kubefencertest.InstallRole(ctx, cfg, "team-a",
//		rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Namespace: "team-a", Name: "controller"})
//
//	// in a test, with held from the controller's kubeadapter.Elector:
//	taken := kubefencertest.Supersede(t, cfg, held)
//	theirs, _ := fenced.NewClient(k8sClient, taken)
//	_ = theirs.Update(ctx, gateway)             // the new holder writes first
//	err := reconciler.Reconcile(ctx, req)       // its fenced write: token.ErrStale
//
// # Getting a kube-apiserver
//
// The helpers take a *rest.Config, so any API server will do:
//
//   - controller-runtime's envtest: install its binaries with setup-envtest
//     (go install sigs.k8s.io/controller-runtime/tools/setup-envtest@latest),
//     export KUBEBUILDER_ASSETS="$(setup-envtest use -p path 1.35.x)", start an
//     envtest.Environment and pass its Config. The policy needs Kubernetes
//     1.30 or later (ValidatingAdmissionPolicy v1), and fencer's tokens
//     compare resourceVersions as integers, which needs 1.35.
//   - built from modules, as fencer's own tests do: a module of its own that
//     requires k8s.io/kubernetes at the version wanted and replaces every
//     k8s.io staging module (k8s.io/api, k8s.io/apimachinery, ...) with its
//     v0.x twin, then go build k8s.io/kubernetes/cmd/kube-apiserver. That
//     takes about 6 minutes on 2 cores with an empty Go build cache, and
//     seconds afterwards; the command is `time make kube-apiserver` in
//     fencer's repository (see tools/kube-apiserver and
//     scripts/build-kube-apiserver.sh). envtest runs such a binary when
//     TEST_ASSET_KUBE_APISERVER (or Environment.ControlPlane.APIServer.Path)
//     names it.
//
// # envtest needs an etcd binary
//
// envtest.Environment always starts etcd as a separate process, so it
// needs an etcd binary as well as the kube-apiserver: setup-envtest
// installs one beside the API server in KUBEBUILDER_ASSETS, or
// TEST_ASSET_ETCD (Environment.ControlPlane.Etcd.Path) names one. In
// fencer's repository, make kube-apiserver builds both into .cache/bin,
// etcd from the go.etcd.io/etcd/server module that fencer's root module
// requires; BinaryForTest and EtcdForTest return them.
//
// # An API server of the kit's own
//
// StartAPIServer (APIServerForTest in a test) runs those two binaries as
// child processes on loopback: an admin and a limited user with bearer
// tokens, RBAC and admission policies as in a cluster, and no
// controller-manager (nothing garbage-collects, finalizes namespaces or
// issues service-account tokens). This module holds no etcd server code:
// etcd is always a process, so requiring it costs a controller author no
// etcd server, raft or bbolt in their module graph.
//
// # What is not guaranteed
//
//   - InstallPolicy, InstallLiveLeasePolicy and InstallRole create objects
//     and fail if they exist; they are for a fresh API server, once per
//     suite.
//   - Supersede does not wait for the superseded Held to notice; see its
//     doc for what is refused before and after it does.
package kubefencertest
