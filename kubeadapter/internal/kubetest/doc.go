// Package kubetest is the harness of the Kubernetes module's own tests, on
// the kit's API server (kubefencertest.StartAPIServer: etcd and
// kube-apiserver as child processes on loopback).
//
// Packages that share one API server across tests keep a Shared, which
// starts it on first use, installs the admission policy on request, and is
// stopped, with a goroutine-leak check, by Shared.Main from TestMain.
// Stallable is a Lease client that a test can pause or kill, as a
// process's link to the API server; CreateNamespace gives a test a
// namespace of its own; StaticHolder, Acquire, RequireGreater and
// AdminClients are the holders and clients most tests start from. Its own
// tests attack the admission policy with every kind of raw write.
//
// It lives under kubeadapter/internal, not in the root module's
// internal/testkit, because the Kubernetes module must not require the
// root module (and with it etcd's server).
package kubetest
