package ring_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fencer-dev/fencer/fencertest"
	"github.com/fencer-dev/fencer/ring"
	"github.com/fencer-dev/fencer/token"
)

// TestDeath: a member whose session is revoked, or expires by TTL, loses
// its shards to the others, and a late write with an old token is refused.
func TestDeath(t *testing.T) {
	for _, how := range []string{"revoked", "expired"} {
		t.Run(how, func(t *testing.T) {
			ctx := fencertest.Context(t)
			st := fencertest.SharedStore(t)
			const r = "death"
			shards := define(t, st, r, 300)
			a := join(t, st, r, "a", true, ring.Config{})
			b := join(t, st, r, "b", true, ring.Config{})
			var c *tmember
			if how == "revoked" {
				c = join(t, st, r, "c", false, ring.Config{})
			} else {
				// A lease nobody keeps alive: it expires after its TTL.
				lease, err := st.Client().Grant(ctx, 8)
				require.NoError(t, err)
				c = joinWith(t, st, r, "c", false, ring.Config{}, lease.ID, "principal/000000000000002a") // the service's form
			}
			waitAssigned(t, st, r, shards, []*tmember{a, b, c}, 20*time.Second)
			var victim string
			var old token.Token
			for _, s := range shards {
				if tok, ok := c.Owns(s); ok {
					victim, old = s, tok
					break
				}
			}
			require.NotEmpty(t, victim)
			_, err := st.Put(ctx, old, "k-"+victim, []byte("c"))
			require.NoError(t, err)

			start := time.Now()
			if how == "revoked" {
				_, err := st.Client().Revoke(ctx, c.lease)
				require.NoError(t, err)
			}
			waitAssigned(t, st, r, shards, []*tmember{a, b}, 20*time.Second)
			t.Logf("re-owned %d shards %s after the %s", len(shards), time.Since(start), how)
			fencertest.WaitClosed(t, c.Done(), 10*time.Second, "c stops")
			require.ErrorIs(t, c.Err(), token.ErrSessionExpired)
			<-c.read
			require.Len(t, c.changes(ring.Lost), len(c.changes(ring.Gained)), "every gained shard is reported lost")
			_, still := c.Owns(victim)
			require.False(t, still)

			owner := a
			if _, ok := b.Owns(victim); ok {
				owner = b
			}
			var now token.Token
			require.Eventually(t, func() bool {
				var ok bool
				now, ok = owner.Owns(victim)
				return ok
			}, 10*time.Second, 10*time.Millisecond)
			_, err = st.Put(ctx, now, "k-"+victim, []byte("new owner"))
			require.NoError(t, err)
			_, err = st.Put(ctx, old, "k-"+victim, []byte("late c"))
			require.ErrorIs(t, err, token.ErrStale)
			v, _, err := st.Get(ctx, "k-"+victim)
			require.NoError(t, err)
			require.Equal(t, "new owner", string(v.Data))
		})
	}
}
