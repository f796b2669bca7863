package etcdstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fencer-dev/fencer/embedetcd"
	"github.com/fencer-dev/fencer/etcdstore"
	"github.com/fencer-dev/fencer/fencertest"
	"github.com/fencer-dev/fencer/token"
)

func TestRestartOnSameDataDirKeepsState(t *testing.T) {
	ctx := fencertest.Context(t)
	srv := fencertest.Etcd(t)
	st := fencertest.StoreOn(t, []string{srv.Endpoint()})
	s, err := st.NewSession(ctx)
	require.NoError(t, err)
	l, err := s.Acquire(ctx, "jobs")
	require.NoError(t, err)
	_, err = st.Put(ctx, l.Token(), "k", []byte("v"))
	require.NoError(t, err)
	require.NoError(t, st.Advance(ctx, "bucket", l.Token()))
	require.NoError(t, s.Close(ctx))
	member := srv.Member()
	srv.Close()

	srv2, err := embedetcd.Start(ctx, member)
	require.NoError(t, err)
	t.Cleanup(srv2.Close)
	st2, err := etcdstore.New(fencertest.Client(t, srv2.Endpoint()), etcdstore.WithPrefix(st.Prefix()))
	require.NoError(t, err)
	require.Equal(t, "v", get(t, st2, "k"))
	rec, ok, err := st2.Fence(ctx, "bucket")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, l.Token(), rec)
	stat, err := st2.Status(ctx, "jobs")
	require.NoError(t, err)
	require.Equal(t, uint64(1), stat.Epoch)

	s2 := newSession(t, st2)
	l2, err := s2.Acquire(ctx, "jobs")
	require.NoError(t, err)
	require.Equal(t, uint64(2), l2.Token().Epoch)
	require.Greater(t, l2.Token().Revision, l.Token().Revision)
	require.NoError(t, st2.Advance(ctx, "bucket", l2.Token()))
}

func TestClusterLeaderKill(t *testing.T) {
	ctx := fencertest.Context(t)
	base := t.TempDir()
	var members []embedetcd.Member
	for i := 0; i < 3; i++ {
		members = append(members, embedetcd.Member{Name: fmt.Sprintf("m%d", i), Dir: fmt.Sprintf("%s/m%d", base, i)})
	}
	servers, err := embedetcd.StartCluster(ctx, members)
	require.NoError(t, err)
	t.Cleanup(func() {
		for _, s := range servers {
			s.Close()
		}
	})
	st := fencertest.StoreOn(t, embedetcd.Endpoints(servers))
	a := newSession(t, st)
	la, err := a.Acquire(ctx, "jobs")
	require.NoError(t, err)
	_, err = st.Put(ctx, la.Token(), "k", []byte("A1"))
	require.NoError(t, err)

	var leader *embedetcd.Server
	require.Eventually(t, func() bool {
		for _, s := range servers {
			if s.IsLeader() {
				leader = s
				return true
			}
		}
		return false
	}, 10*time.Second, 10*time.Millisecond)
	leader.Close()

	// After re-election the holder keeps writing...
	require.Eventually(t, func() bool {
		wctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		_, err := st.Put(wctx, la.Token(), "k", []byte("A2"))
		return err == nil
	}, 15*time.Second, 50*time.Millisecond)
	require.Equal(t, "A2", get(t, st, "k"))

	// ...a handover works, and the old token is refused from then on.
	require.NoError(t, la.Release(ctx))
	b := newSession(t, st)
	lb, err := b.Acquire(ctx, "jobs")
	require.NoError(t, err)
	_, err = st.Put(ctx, lb.Token(), "k", []byte("B1"))
	require.NoError(t, err)
	_, err = st.Put(ctx, la.Token(), "k", []byte("stale A"))
	require.ErrorIs(t, err, token.ErrStale)
	require.NoError(t, st.Advance(ctx, "bucket", lb.Token()))
	require.ErrorIs(t, st.Advance(ctx, "bucket", la.Token()), token.ErrStale)
	require.Equal(t, "B1", get(t, st, "k"))
}
