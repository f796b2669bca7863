package fencertest_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fencer-dev/fencer/fencertest"
	"github.com/fencer-dev/fencer/token"
)

// TestCluster checks the three-member cluster's faults: with one member
// stopped or partitioned the other two keep serving guarded writes, a
// partitioned member refuses them, and a restarted member serves again.
func TestCluster(t *testing.T) {
	c := ctx(t)
	cl := fencertest.Cluster(t, 3)
	st := cl.Store(t)
	held, err := fencertest.Session(t, st).Acquire(c, "orders")
	require.NoError(t, err)

	victim := (cl.Leader(t) + 1) % 3
	cl.Stop(victim)
	// A write on the connection to the stopped member fails UNAVAILABLE
	// (it may or may not have committed); etcd's client then moves to a
	// live member, so the same write, retried, commits.
	require.Eventually(t, func() bool {
		_, err = st.Put(c, held.Token(), "total", []byte("1"))
		return status.Code(err) != codes.Unavailable
	}, 30*time.Second, 100*time.Millisecond, "the write never reached a live member: %v", err)
	require.NoError(t, err, "two of three members make a quorum")
	cl.Restart(t, victim)

	// The partitioned member cannot commit (it reports no leader, or
	// times out); the other two still do.
	cl.Partition(victim)
	alone := fencertest.StoreOn(t, []string{cl.Endpoints()[victim]})
	_, err = alone.Put(clientv3.WithRequireLeader(c), held.Token(), "total", []byte("2"))
	require.Error(t, err, "a write through the partitioned member must not commit")
	_, err = st.Put(c, held.Token(), "total", []byte("3"))
	require.NoError(t, err)

	cl.Heal()
	v, _, err := alone.Get(c, "total")
	require.NoError(t, err)
	require.Equal(t, "3", string(v.Data), "the partitioned member's write never committed")
	newer := fencertest.Supersede(t, alone, held)
	_, err = st.Put(c, held.Token(), "total", []byte("late"))
	require.ErrorIs(t, err, token.ErrStale)
	_, err = st.Put(c, newer.Token(), "total", []byte("4"))
	require.NoError(t, err)
}
