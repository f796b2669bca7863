// Package deploy is the home of the service's deployment files, whose
// tests check them against the real tools that consume them. The
// Kubernetes library's own manifests (its admission policies and Role) are
// in kubeadapter/deploy, in the Kubernetes module.
//
//   - service/: kustomize manifests for fencer serve against an external
//     etcd cluster; rendered with kustomize and applied with server-side
//     apply to a real kube-apiserver in the tests; the commands that
//     docs/operations.md gives before applying them (the Secrets the
//     Deployment mounts, the image build and kustomize edit set image) are
//     checked against the manifests.
//   - monitoring/: Prometheus alert rules and a Grafana dashboard, checked
//     by the PromQL test in tools/promcheck.
//   - ../Dockerfile: the container image; the tests run its build stage's
//     go build with the VERSION and COMMIT build arguments and check that
//     the binary is static and prints them.
package deploy
