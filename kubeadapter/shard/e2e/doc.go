// Package e2e holds the Sharder's tests against a real API server
// (kubefencertest.StartAPIServer): rings of members in one process and as
// separate processes, takeovers, red-team writes, the sharded-manager
// example, the linearizability check of each shard's register (porcupine)
// and the benchmarks (Owns, renewal writes, balance).
//
// It is a module of its own, github.com/fencer-dev/fencer/kubeadapter/shard/e2e,
// because its checker and fault harnesses (internal/testkit/history and
// faultproxy, in fencer's root module) would otherwise put porcupine and
// etcd's server into the module graph of every controller that requires
// the Kubernetes module. It holds tests only: nothing here is for import.
package e2e
