package client_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencer-dev/fencer/client"
	"github.com/fencer-dev/fencer/client/clienttest"
	"github.com/fencer-dev/fencer/fencertest"
	"github.com/fencer-dev/fencer/internal/holderkey"
	"github.com/fencer-dev/fencer/token"
)

// nextChange returns the Ring's next change, failing the test after
// waitFor.
func nextChange(t *testing.T, r *client.Ring) client.RingChange {
	t.Helper()
	select {
	case c, ok := <-r.Changes():
		require.True(t, ok, "Changes closed; the Ring ended: %v", r.Err())
		return c
	case <-time.After(waitFor):
		t.Fatalf("no change of the ring within %s", waitFor)
		return client.RingChange{}
	}
}

// gainAll takes n Gained changes and returns the tokens they reported.
func gainAll(t *testing.T, r *client.Ring, n int) map[string]token.Token {
	t.Helper()
	got := map[string]token.Token{}
	for len(got) < n {
		c := nextChange(t, r)
		require.Equal(t, client.Gained, c.Kind, "%+v", c)
		got[c.Shard] = c.Token
	}
	return got
}

// A Ring whose stream breaks joins again and compares the new snapshot
// with what it owned: a shard lost while it was away (its holder key
// deleted, at a moment the test picks: while the reconnect waits at a
// gate) is reported Lost with its old token, then Gained with its new
// one, and Owns follows.
func TestRingReconnectReportsWhatChangedMeanwhile(t *testing.T) {
	ctx := fencertest.Context(t)
	st := fencertest.SharedStore(t)
	p, c := newReplicas(t, st)
	_, err := c.CreateRingCount(ctx, "recon", 4)
	require.NoError(t, err)
	rejoin := newGate()
	s := newSession(t, c, clienttest.WithHooks(clienttest.SessionHooks{JoinRing: func(string) { rejoin.pass() }}))
	r, err := s.JoinRing(ctx, "recon", client.WithMember("w"))
	require.NoError(t, err)
	defer r.Close()
	require.Equal(t, "w", r.Name())
	before := gainAll(t, r, 4)
	for shard, tok := range before {
		owned, ok := r.Owns(shard)
		require.True(t, ok)
		require.Equal(t, tok, owned)
	}

	p.failover() // the stream ends SHUTTING_DOWN; the Ring joins again, through the gate
	fencertest.WaitClosed(t, rejoin.reached, waitFor, "the Ring's second join")
	_, err = st.Client().Delete(ctx, holderkey.Key(st.Prefix(), "ring:recon:2"))
	require.NoError(t, err)
	close(rejoin.open)

	lost := nextChange(t, r)
	require.Equal(t, client.RingChange{Kind: client.Lost, Shard: "2", Token: before["2"]}, lost)
	gained := nextChange(t, r)
	require.Equal(t, client.Gained, gained.Kind)
	require.Equal(t, "2", gained.Shard)
	require.Greater(t, gained.Token.Revision, before["2"].Revision)
	owned, ok := r.Owns("2")
	require.True(t, ok)
	require.Equal(t, gained.Token, owned)
	require.ErrorIs(t, c.Check(ctx, before["2"]), token.ErrStale)
	require.NoError(t, c.Check(ctx, owned))
	for _, shard := range []string{"0", "1", "3"} {
		tok, ok := r.Owns(shard)
		require.True(t, ok)
		require.Equal(t, before[shard], tok, "a shard kept over the reconnect keeps its token")
	}
	require.NoError(t, r.Err())
}

// When the session ends, the Ring reports every shard Lost, Owns reports
// nothing, and the Ring ends with the session's error.
func TestRingOwnsNothingAfterTheSessionEnds(t *testing.T) {
	ctx := fencertest.Context(t)
	st, c := service(t)
	_, err := c.CreateRing(ctx, "gone", "a", "b")
	require.NoError(t, err)
	s := newSession(t, c)
	r, err := s.JoinRing(ctx, "gone")
	require.NoError(t, err)
	defer r.Close()
	gainAll(t, r, 2)
	_, err = st.Client().Revoke(ctx, clientv3.LeaseID(s.ID()))
	require.NoError(t, err)
	for range 2 {
		require.Equal(t, client.Lost, nextChange(t, r).Kind)
	}
	fencertest.WaitClosed(t, r.Done(), waitFor, "the Ring of an ended session")
	_, open := <-r.Changes()
	require.False(t, open, "Changes closes once everything is reported")
	for _, shard := range []string{"a", "b"} {
		_, ok := r.Owns(shard)
		require.False(t, ok)
	}
	require.ErrorIs(t, r.Err(), token.ErrSessionExpired)
	require.ErrorIs(t, r.Err(), client.ErrSessionNotFound)
	fencertest.WaitClosed(t, s.Done(), waitFor, "the session")
}

// Leave hands everything off: each shard Losing, released by the
// caller, then Lost, and the Ring ends with ErrRingLeft. Releasing a
// shard that is not being handed off is refused.
func TestRingLeaveHandsOffAndEnds(t *testing.T) {
	ctx := fencertest.Context(t)
	_, c := service(t)
	_, err := c.CreateRingCount(ctx, "leave", 3)
	require.NoError(t, err)
	s := newSession(t, c)
	_, err = s.JoinRing(ctx, "nowhere")
	require.ErrorIs(t, err, client.ErrRingNotFound)
	r, err := s.JoinRing(ctx, "leave", client.WithDrain(time.Minute))
	require.NoError(t, err)
	defer r.Close()
	gainAll(t, r, 3)
	_, err = r.Release(ctx, "0")
	require.ErrorIs(t, err, client.ErrNotLosing)

	other := newSession(t, c)
	_, err = other.JoinRing(ctx, "leave", client.WithMember(r.Name()))
	require.ErrorIs(t, err, client.ErrRingConflict)

	require.NoError(t, r.Leave(ctx))
	lost := 0
	for lost < 3 {
		ch := nextChange(t, r)
		switch ch.Kind {
		case client.Losing:
			require.Equal(t, time.Minute, ch.Drain)
			n, err := r.Release(ctx, ch.Shard)
			require.NoError(t, err)
			require.Equal(t, 1, n)
		case client.Lost:
			lost++
		default:
			t.Fatalf("unexpected change %+v", ch)
		}
	}
	fencertest.WaitClosed(t, r.Done(), waitFor, "the Ring after Leave")
	require.ErrorIs(t, r.Err(), client.ErrRingLeft)
	st, err := c.RingStatus(ctx, "leave")
	require.NoError(t, err)
	require.Equal(t, client.RingStatus{Shards: 3, Unowned: 3, Revision: st.Revision}, st)
	require.NoError(t, s.Err(), "leaving ends the membership, not the session")
}
