package server_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fencer-dev/fencer/client"
	"github.com/fencer-dev/fencer/embedetcd"
	"github.com/fencer-dev/fencer/fencertest"
	"github.com/fencer-dev/fencer/token"
)

// TestTwoServersOverThreeMembers runs two servers, each with its own etcd
// client, over a 3-member cluster. A client's calls are spread round-robin
// over both servers. Killing the etcd leader mid-run loses no
// acknowledged write, and the superseded holder's writes are all rejected.
func TestTwoServersOverThreeMembers(t *testing.T) {
	// Starting three members, an election and a leader change take longer
	// than fencertest.Context allows on a loaded 2-core machine.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	members := make([]embedetcd.Member, 3)
	for i := range members {
		members[i] = embedetcd.Member{Name: fmt.Sprintf("m%d", i), Dir: t.TempDir()}
	}
	servers, err := embedetcd.StartCluster(ctx, members)
	require.NoError(t, err)
	for _, s := range servers {
		t.Cleanup(s.Close)
	}
	eps := embedetcd.Endpoints(servers)
	st1 := fencertest.StoreOn(t, eps)
	st2 := sameStore(t, st1, eps...)
	addr1, _ := startServer(t, st1)
	addr2, _ := startServer(t, st2)
	c := client.New(dial(t, alice, addr1, addr2))

	old, err := newSession(t, c).Acquire(ctx, "jobs")
	require.NoError(t, err)

	var (
		mu    sync.Mutex
		acked = map[string]int64{} // key → revision of an acknowledged write
	)
	write := func(tok token.Token, i int) error {
		key := fmt.Sprintf("k%03d", i)
		rev, err := c.Put(ctx, tok, key, []byte(tok.String()))
		if err == nil {
			mu.Lock()
			acked[key] = rev
			mu.Unlock()
		}
		return err
	}
	for i := 0; i < 20; i++ {
		require.NoError(t, write(old.Token(), i))
	}
	// Kill the leader while writing.
	var leader *embedetcd.Server
	for _, s := range servers {
		if s.IsLeader() {
			leader = s
		}
	}
	require.NotNil(t, leader)
	leader.Close()
	for i := 20; i < 40; i++ {
		// Writes may fail while a new leader is elected; only acknowledged ones count.
		_ = write(old.Token(), i)
	}

	// A new holder supersedes the old one (through either server).
	_, err = st1.Client().Delete(ctx, st1.Prefix()+"leases/jobs")
	require.NoError(t, err)
	newer, err := newSession(t, c).Acquire(ctx, "jobs")
	require.NoError(t, err)
	for i := 40; i < 60; i++ {
		require.NoError(t, write(newer.Token(), i))
	}
	for i := 0; i < 60; i++ {
		err := write(old.Token(), i)
		require.ErrorIs(t, err, token.ErrStale, "stale write %d accepted", i)
	}
	fencertest.WaitClosed(t, old.Done(), 5*time.Second, "old holder's loss")

	for key, rev := range acked {
		v, found, err := c.Get(ctx, key)
		require.NoError(t, err)
		require.True(t, found, "acknowledged write of %s lost", key)
		require.GreaterOrEqual(t, v.ModRevision, rev)
	}
	require.GreaterOrEqual(t, len(acked), 40)
}
