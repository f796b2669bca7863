// Package deploy holds no code: it is the home of fencer's deployment
// files, whose tests check them against the real tools that consume them.
//
//   - service/: kustomize manifests for fencer serve against an external
//     etcd cluster; rendered with kustomize and applied with server-side
//     apply to a real kube-apiserver in the tests.
//   - admission/ and rbac/: the admission policies and the Role of fencer's
//     Kubernetes library.
//   - monitoring/: Prometheus alert rules and a Grafana dashboard, checked
//     by the PromQL test in tools/promcheck.
//   - ../Dockerfile: the container image; the tests run its build stage's
//     go build and check that the binary is static.
package deploy
