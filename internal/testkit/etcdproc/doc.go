// Package etcdproc runs etcd clusters whose members are separate
// processes, for fencer's chaos tests: a member can be killed with SIGKILL
// and restarted on its data directory, partitioned from its peers, and the
// raft leadership moved.
//
// The member processes are the test binary itself, re-executed with etcd's
// own flags: a test binary that uses Start must call RunIfMember first thing
// in TestMain, which runs etcd (etcdmain.Main, the etcd binary's main) when
// the process was started as a member and returns otherwise.
//
// Every member advertises its peer URL through a faultproxy.Proxy, so all
// raft traffic between members crosses a proxy that knows which member
// process opened each connection (on Linux, from /proc; see CanIsolate).
// Isolate cuts one member's connections in both directions.
//
// Not simulated: a machine crash. SIGKILL ends the process, but what it
// wrote is in the kernel's page cache and survives, synced or not. Members
// listen on loopback only. Clients speak plaintext unless the cluster is
// started WithClientTLS, which serves them over TLS and requires client
// certificates; EnableAuth then turns on etcd's users and roles. Raft
// traffic between members is always plaintext.
package etcdproc
