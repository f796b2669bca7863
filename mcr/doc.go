// Package mcr is a fencing Coordinator for sigs.k8s.io/multicluster-runtime
// (mcr): a replica engages a cluster's controllers only while it owns the
// cluster as a shard of a fencer shard.Sharder, and its writes to shared
// downstream objects carry the cluster's fencing token, so that a paused
// former owner's late write is refused by the store.
//
// Use New for the Coordinator (mcmanager.WithCoordinator), Gated for a
// manager whose GetCluster refuses clusters this replica does not own
// (ErrNotOwner), Gate for a reconciler that drops requests of clusters
// this replica does not own at dispatch, and AcquiredSource to enqueue a
// cluster's requests when this replica gains it. Gate passes a
// reconcile the cluster's shard.Held for fenced.NewClient;
// Coordinator.Shard returns the current one. See
// docs/multicluster.md.
//
// # What is not guaranteed
//
// Two replicas may run a cluster's controllers at the same instant: a
// paused or partitioned former owner runs them until it notices. Its
// writes through fenced.NewClient, and raw writes with its stamp where the
// admission policy is installed, are then refused per object. Writes
// through an unfenced client are not fenced at all.
//
// # Versions and imports
//
// Built and tested with multicluster-runtime v0.24.1 and controller-runtime
// v0.25.2; mcr's Coordinator interface is experimental upstream and may
// change. This module requires kubeadapter, token and the Kubernetes
// libraries, never fencer's root module (the etcd server).
package mcr
