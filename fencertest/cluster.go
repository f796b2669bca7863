package fencertest

import (
	"sync/atomic"

	"github.com/fencer-dev/fencer/etcdstore"
	"github.com/fencer-dev/fencer/internal/testkit/etcdproc"
)

// memberReady records that RunIfMember has run in this process, which
// Cluster needs: its members are this test binary, re-executed.
var memberReady atomic.Bool

// RunIfMember runs an etcd member and exits if this process was started by
// Cluster as one; otherwise it returns at once. A test binary that uses
// Cluster calls it first thing in TestMain, or calls Main, which does.
func RunIfMember() {
	etcdproc.RunIfMember()
	memberReady.Store(true)
}

// EtcdCluster is an etcd cluster whose members are separate processes, so
// that one can be killed, restarted or cut off from the others. Cluster
// starts one. Members are numbered from 0.
type EtcdCluster struct {
	c *etcdproc.Cluster
}

// Cluster starts an n-member etcd cluster on loopback, waits until every
// member serves and a leader is elected, and kills every member when t
// ends. Each member is a process of its own: the test binary re-executed as
// etcd (etcdmain), so TestMain must call RunIfMember or Main first; Cluster
// fails t otherwise. All raft traffic between members crosses a proxy,
// which is what Partition cuts.
func Cluster(t TB, n int) *EtcdCluster {
	t.Helper()
	if !memberReady.Load() {
		t.Fatalf("fencertest: Cluster needs TestMain to call fencertest.RunIfMember or fencertest.Main first")
	}
	if n < 1 {
		t.Fatalf("fencertest: Cluster of %d members", n)
	}
	return &EtcdCluster{c: etcdproc.Start(t, n)}
}

// Endpoints returns the members' client URLs.
func (c *EtcdCluster) Endpoints() []string { return c.c.Endpoints() }

// Store returns an etcdstore.Store on every member of c, made with opts,
// through a client that is closed when t ends.
func (c *EtcdCluster) Store(t TB, opts ...etcdstore.Option) *etcdstore.Store {
	t.Helper()
	return StoreOn(t, c.Endpoints(), opts...)
}

// Stop kills member i with SIGKILL, as a crash would, and waits for its
// process to exit. Stopping a stopped member does nothing. What the member
// wrote survives in the page cache: Stop does not lose unsynced data.
func (c *EtcdCluster) Stop(i int) { c.c.Kill(i) }

// Restart starts stopped member i again on its data directory and ports
// and waits until it serves; it fails t if it does not within Timeout.
func (c *EtcdCluster) Restart(t TB, i int) {
	t.Helper()
	ctx, cancel := stepContext()
	defer cancel()
	if err := c.c.Restart(ctx, i); err != nil {
		t.Fatalf("fencertest: restart member %d: %v", i, err)
	}
}

// Partition cuts member i off from the other members until Heal: raft
// messages stop in both directions. Clients still reach every member, so
// a client of member i sees what a client on the wrong side of a network
// partition sees. On systems other than Linux only connections to member i
// are cut.
func (c *EtcdCluster) Partition(i int) { c.c.Isolate(i) }

// Heal ends every partition.
func (c *EtcdCluster) Heal() { c.c.Heal() }

// Leader returns the raft leader's index, waiting up to Timeout while there
// is none; it fails t then.
func (c *EtcdCluster) Leader(t TB) int {
	t.Helper()
	ctx, cancel := stepContext()
	defer cancel()
	i, err := c.c.Leader(ctx)
	if err != nil {
		t.Fatalf("fencertest: %v", err)
	}
	return i
}
