package ring_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencer-dev/fencer/etcdstore"
	"github.com/fencer-dev/fencer/fencertest"
	"github.com/fencer-dev/fencer/ring"
)

// judge checks, with the store as the judge, that no member claims a shard
// the store has given to another: it reads the ring's holder keys at a
// revision R, then asks every judged member's Owns; a claim of a token
// older than the holder key at R is a member believing it owns a shard
// that another acquired before the claim was sampled. It also watches the
// holder keys: every acquisition creates its key (version 1), so no
// holder key is ever written over.
type judge struct {
	t  testing.TB
	st *etcdstore.Store
	r  string

	mu         sync.Mutex
	members    map[string]*tmember
	violations []string
	samples    int
	creates    int

	stop chan struct{}
	done sync.WaitGroup
}

func newJudge(t testing.TB, st *etcdstore.Store, r string) *judge {
	j := &judge{t: t, st: st, r: r, members: map[string]*tmember{}, stop: make(chan struct{})}
	resp, err := st.Client().Get(fencertest.Context(t), "x")
	require.NoError(t, err)
	wch := st.Client().Watch(fencertest.Context(t), st.HolderKey(ring.ShardLease(r, "")), clientv3.WithPrefix(), clientv3.WithRev(resp.Header.Revision+1))
	j.done.Add(2)
	go j.sample()
	go j.watch(wch)
	return j
}

// judged adds (or, with nil, removes) a member to check.
func (j *judge) judged(name string, m *tmember) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if m == nil {
		delete(j.members, name)
	} else {
		j.members[name] = m
	}
}

func (j *judge) fail(format string, args ...any) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.violations = append(j.violations, fmt.Sprintf(format, args...))
}

func (j *judge) sample() {
	defer j.done.Done()
	p := j.st.HolderKey(ring.ShardLease(j.r, ""))
	for {
		select {
		case <-j.stop:
			return
		case <-time.After(5 * time.Millisecond):
		}
		resp, err := j.st.Client().Get(fencertest.Context(j.t), p, clientv3.WithPrefix())
		if err != nil {
			continue // a leader change, say
		}
		at := map[string]*mvccpb.KeyValue{}
		for _, kv := range resp.Kvs {
			at[strings.TrimPrefix(string(kv.Key), p)] = kv
		}
		j.mu.Lock()
		members := make([]*tmember, 0, len(j.members))
		for _, m := range j.members {
			members = append(members, m)
		}
		j.samples++
		j.mu.Unlock()
		for _, m := range members {
			for shard, kv := range at {
				tok, ok := m.Owns(shard)
				if ok && kv.CreateRevision > tok.Revision {
					j.fail("%s claims %s with %s after revision %d, when its holder key was created at %d on lease %x", m.Name(), shard, tok, resp.Header.Revision, kv.CreateRevision, kv.Lease)
				}
				if ok && kv.CreateRevision == tok.Revision && clientv3.LeaseID(kv.Lease) != m.lease {
					j.fail("%s claims %s with %s, held on lease %x", m.Name(), shard, tok, kv.Lease)
				}
			}
		}
	}
}

func (j *judge) watch(wch clientv3.WatchChan) {
	defer j.done.Done()
	for {
		select {
		case <-j.stop:
			return
		case resp, ok := <-wch:
			if !ok || resp.Err() != nil {
				j.fail("the judge's watch broke: %v", resp.Err())
				return
			}
			for _, ev := range resp.Events {
				if ev.Type != mvccpb.PUT {
					continue
				}
				j.mu.Lock()
				j.creates++
				j.mu.Unlock()
				if ev.Kv.Version != 1 {
					j.fail("holder key %s written over (version %d) at %d", ev.Kv.Key, ev.Kv.Version, ev.Kv.ModRevision)
				}
			}
		}
	}
}

// verdict stops the judge and fails t on any violation.
func (j *judge) verdict(t testing.TB) {
	close(j.stop)
	j.done.Wait()
	j.mu.Lock()
	defer j.mu.Unlock()
	t.Logf("judge: %d samples, %d acquisitions", j.samples, j.creates)
	require.Empty(t, j.violations[:min(len(j.violations), 10)], "%d violations", len(j.violations))
	require.Positive(t, j.samples)
}

// TestExactlyOneOwner: through joins, leaves and a death, no member claims
// a shard another holds, and no holder key is written over.
func TestExactlyOneOwner(t *testing.T) {
	st := fencertest.SharedStore(t)
	const r = "one"
	shards := define(t, st, r, 300)
	j := newJudge(t, st, r)
	fast := ring.Config{Drain: 50 * time.Millisecond}
	all := map[string]*tmember{}
	add := func(name string, auto bool) {
		all[name] = join(t, st, r, name, auto, fast)
		j.judged(name, all[name])
	}
	live := func(names ...string) []*tmember {
		var out []*tmember
		for _, n := range names {
			out = append(out, all[n])
		}
		return out
	}
	add("a", true)
	add("b", false)
	add("c", true)
	waitAssigned(t, st, r, shards, live("a", "b", "c"), 20*time.Second)
	add("d", false)
	add("e", true)
	waitAssigned(t, st, r, shards, live("a", "b", "c", "d", "e"), 20*time.Second)
	require.NoError(t, all["b"].Leave(fencertest.Context(t)))
	add("f", false)
	waitAssigned(t, st, r, shards, live("a", "c", "d", "e", "f"), 20*time.Second)
	j.judged("c", nil) // a dead member's view lags etcd until it sees its death
	_, err := st.Client().Revoke(fencertest.Context(t), all["c"].lease)
	require.NoError(t, err)
	require.NoError(t, all["d"].Leave(fencertest.Context(t)))
	waitAssigned(t, st, r, shards, live("a", "e", "f"), 20*time.Second)
	j.verdict(t)
}
