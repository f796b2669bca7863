package ring_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencer-dev/fencer/etcdstore"
	"github.com/fencer-dev/fencer/fencertest"
	"github.com/fencer-dev/fencer/internal/testkit/history"
	"github.com/fencer-dev/fencer/ring"
	"github.com/fencer-dev/fencer/token"
)

// pausableLease is an etcd lease the test keeps alive until it pauses,
// as a process frozen past its TTL would.
type pausableLease struct {
	id     clientv3.LeaseID
	paused atomic.Bool
}

func grantPausable(t *testing.T, st *etcdstore.Store, ttl int64) *pausableLease {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	resp, err := st.Client().Grant(fencertest.Context(t), ttl)
	require.NoError(t, err)
	l := &pausableLease{id: resp.ID}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(time.Duration(ttl) * time.Second / 4)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			if !l.paused.Load() {
				kctx, kcancel := context.WithTimeout(ctx, time.Second)
				_, _ = st.Client().KeepAliveOnce(kctx, l.id)
				kcancel()
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	return l
}

// registerOps writes a fenced register (guarded Puts with shard tokens)
// and a tokenless baseline (plain etcd Puts of another key) by the same
// schedule, recording both histories.
type registerOps struct {
	t        *testing.T
	st       *etcdstore.Store
	key      string
	fenced   *history.History
	baseline *history.History
}

func (r *registerOps) write(client int, tok token.Token, val int) error {
	ctx := fencertest.Context(r.t)
	in := history.Input{Write: true, Tok: tok.Revision, Val: val}
	call := r.fenced.Now()
	_, err := r.st.Put(ctx, tok, r.key, []byte{byte(val)})
	out := history.Output{OK: err == nil}
	if err != nil && !errors.Is(err, token.ErrStale) {
		out.Unknown = true
	}
	r.fenced.Add(client, in, call, out)

	call = r.baseline.Now()
	_, berr := r.st.Client().Put(ctx, r.st.DataKey("plain-"+r.key), string([]byte{byte(val)}))
	r.baseline.Add(client, in, call, history.Output{OK: berr == nil, Unknown: berr != nil})
	return err
}

func (r *registerOps) read(client int) {
	ctx := fencertest.Context(r.t)
	for _, h := range []struct {
		h   *history.History
		key string
	}{{r.fenced, r.st.DataKey(r.key)}, {r.baseline, r.st.DataKey("plain-" + r.key)}} {
		call := h.h.Now()
		resp, err := r.st.Client().Get(ctx, h.key)
		require.NoError(r.t, err)
		val := 0
		if len(resp.Kvs) == 1 {
			val = int(resp.Kvs[0].Value[0])
		}
		h.h.Add(client, history.Input{}, call, history.Output{OK: true, Val: val})
	}
}

// TestFaultStaleMember, on a 3-member etcd cluster: a member's session
// stops being renewed past its TTL (its process frozen), its shards move,
// and when it resumes it writes with its old tokens while the new owner
// writes. porcupine finds fencer's guarded writes linearizable as a fenced
// register, and the tokenless baseline of the same schedule not.
func TestFaultStaleMember(t *testing.T) {
	cl := fencertest.Cluster(t, 3)
	st := cl.Store(t)
	const r = "fault"
	shards := define(t, st, r, 30)
	a := join(t, st, r, "a", true, ring.Config{})
	b := join(t, st, r, "b", true, ring.Config{})
	lease := grantPausable(t, st, 4)
	c := joinWith(t, st, r, "c", false, ring.Config{}, lease.id, "frozen")
	waitAssigned(t, st, r, shards, []*tmember{a, b, c}, 30*time.Second)

	var victims []string
	old := map[string]token.Token{}
	for _, s := range shards {
		if tok, ok := c.Owns(s); ok && len(victims) < 3 {
			victims = append(victims, s)
			old[s] = tok
		}
	}
	require.NotEmpty(t, victims)
	start := time.Now()
	regs := map[string]*registerOps{}
	for _, s := range victims {
		regs[s] = &registerOps{t: t, st: st, key: "reg-" + s, fenced: history.New(start), baseline: history.New(start)}
		require.NoError(t, regs[s].write(2, old[s], 1))
		regs[s].read(2)
	}

	// c's process freezes past its TTL: its loop stops reacting (Close
	// keeps what it holds) and its session is no longer renewed.
	c.Close()
	lease.paused.Store(true)
	waitAssigned(t, st, r, shards, []*tmember{a, b}, 30*time.Second)

	var wg sync.WaitGroup
	for _, s := range victims {
		owner, client := a, 0
		if _, ok := b.Owns(s); ok {
			owner, client = b, 1
		}
		tok, ok := owner.Owns(s)
		require.True(t, ok)
		reg := regs[s]
		require.NoError(t, reg.write(client, tok, 2), "the new owner writes first")
		wg.Add(2)
		go func() { // the new owner keeps writing
			defer wg.Done()
			for v := 10; v < 20; v++ {
				require.NoError(t, reg.write(client, tok, v))
				reg.read(client)
			}
		}()
		go func() { // c resumes, unaware, with its old token
			defer wg.Done()
			for v := 100; v < 110; v++ {
				require.ErrorIs(t, reg.write(2, old[s], v), token.ErrStale)
				reg.read(2)
			}
		}()
	}
	wg.Wait()
	for _, s := range victims {
		require.Equal(t, porcupine.Ok, regs[s].fenced.Check(history.FencedRegister, time.Minute), "fenced history of %s", s)
		require.Equal(t, porcupine.Illegal, regs[s].baseline.Check(history.FencedRegister, time.Minute), "baseline history of %s", s)
	}
}

// TestFaultLeaderChange, on a 3-member etcd cluster: the raft leader is
// killed while shards move to a newcomer, and restarted; every shard ends
// with its owner, no holder key is written over, and no member claims a
// shard another holds.
func TestFaultLeaderChange(t *testing.T) {
	cl := fencertest.Cluster(t, 3)
	st := cl.Store(t)
	const r = "leader"
	shards := define(t, st, r, 300)
	j := newJudge(t, st, r)
	cfg := ring.Config{Drain: 100 * time.Millisecond}
	var ms []*tmember
	for _, name := range []string{"a", "b", "c"} {
		m := join(t, st, r, name, name == "a", cfg, etcdstore.WithTTL(15*time.Second))
		j.judged(name, m)
		ms = append(ms, m)
	}
	waitAssigned(t, st, r, shards, ms, 30*time.Second)
	d := join(t, st, r, "d", false, cfg, etcdstore.WithTTL(15*time.Second))
	j.judged("d", d)
	ms = append(ms, d)
	leader := cl.Leader(t)
	time.Sleep(20 * time.Millisecond) // moves under way
	cl.Stop(leader)
	time.Sleep(2 * time.Second)
	cl.Restart(t, leader)
	waitAssigned(t, st, r, shards, ms, 60*time.Second)
	for _, m := range ms {
		require.NoError(t, m.Err())
	}
	j.verdict(t)
}

// TestFaultPartition, on a 3-member etcd cluster: the etcd member that a
// ring member talks to is cut off from the others. Its session cannot be
// renewed and expires, the other ring members take its shards, and when
// the partition heals, the cut-off member reads the ring again, finds its
// member key gone and stops, reporting every shard lost.
func TestFaultPartition(t *testing.T) {
	cl := fencertest.Cluster(t, 3)
	cut := (cl.Leader(t) + 1) % 3
	var majority []string
	for i, ep := range cl.Endpoints() {
		if i != cut {
			majority = append(majority, ep)
		}
	}
	// a, b and the test talk to the majority side only, c to the cut member.
	st := fencertest.StoreOn(t, majority, etcdstore.WithPrefix("/partition/"))
	stC := fencertest.StoreOn(t, cl.Endpoints()[cut:cut+1], etcdstore.WithPrefix("/partition/"))
	const r = "partition"
	shards := define(t, st, r, 100)
	j := newJudge(t, st, r)
	a := join(t, st, r, "a", true, ring.Config{})
	b := join(t, st, r, "b", true, ring.Config{})
	j.judged("a", a)
	j.judged("b", b)
	c := join(t, stC, r, "c", false, ring.Config{}, etcdstore.WithTTL(5*time.Second))
	waitAssigned(t, st, r, shards, []*tmember{a, b, c}, 30*time.Second)

	cl.Partition(cut)
	waitAssigned(t, st, r, shards, []*tmember{a, b}, 30*time.Second)
	require.NoError(t, c.Err(), "c cannot tell its session ended while it is cut off")
	cl.Heal()
	fencertest.WaitClosed(t, c.Done(), 30*time.Second, "c stops once it reads the ring again")
	require.ErrorIs(t, c.Err(), token.ErrSessionExpired)
	<-c.read
	require.Len(t, c.changes(ring.Lost), len(c.changes(ring.Gained)))
	j.verdict(t)
}
