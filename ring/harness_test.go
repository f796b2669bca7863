package ring_test

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencer-dev/fencer/etcdstore"
	"github.com/fencer-dev/fencer/fencertest"
	"github.com/fencer-dev/fencer/internal/rendezvous"
	"github.com/fencer-dev/fencer/ring"
)

// shardNames returns n shard names.
func shardNames(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("s-%05d", i)
	}
	return out
}

// define defines ring r with n shards and returns them.
func define(t testing.TB, st *etcdstore.Store, r string, n int) []string {
	t.Helper()
	shards := shardNames(n)
	created, err := ring.Define(fencertest.Context(t), st, r, shards)
	require.NoError(t, err)
	require.True(t, created)
	return shards
}

// tmember is a joined member whose updates a goroutine records; it
// releases Losing shards at once when autoRelease is set.
type tmember struct {
	*ring.Member
	lease       clientv3.LeaseID
	autoRelease bool

	mu      sync.Mutex
	batches []ring.Batch
	read    chan struct{} // closed when Updates is closed
}

// join joins ring r as name on a new session of st; cfg's Ring, Member,
// Holder and LeaseID are filled in.
func join(t testing.TB, st *etcdstore.Store, r, name string, autoRelease bool, cfg ring.Config, opts ...etcdstore.SessionOption) *tmember {
	t.Helper()
	sess := fencertest.Session(t, st, opts...)
	return joinWith(t, st, r, name, autoRelease, cfg, sess.LeaseID(), sess.Holder())
}

// joinWith joins ring r as name on etcd lease id, as holder.
func joinWith(t testing.TB, st *etcdstore.Store, r, name string, autoRelease bool, cfg ring.Config, id clientv3.LeaseID, holder string) *tmember {
	t.Helper()
	cfg.Ring, cfg.Member, cfg.Holder, cfg.LeaseID = r, name, holder, id
	m, err := ring.Join(fencertest.Context(t), st, cfg)
	require.NoError(t, err)
	tm := &tmember{Member: m, lease: id, autoRelease: autoRelease, read: make(chan struct{})}
	go tm.consume()
	t.Cleanup(func() {
		m.Close()
		<-tm.read
	})
	return tm
}

func (tm *tmember) consume() {
	defer close(tm.read)
	for b := range tm.Updates() {
		tm.mu.Lock()
		tm.batches = append(tm.batches, b)
		tm.mu.Unlock()
		if !tm.autoRelease {
			continue
		}
		var losing []string
		for _, c := range b.Changes {
			if c.Kind == ring.Losing {
				losing = append(losing, c.Shard)
			}
		}
		if len(losing) > 0 {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, _ = tm.Release(ctx, losing...)
			cancel()
		}
	}
}

// changes returns the changes recorded so far, of the given kind.
func (tm *tmember) changes(kind ring.Kind) []ring.Change {
	tm.mu.Lock()
	defer tm.mu.Unlock()
	var out []ring.Change
	for _, b := range tm.batches {
		for _, c := range b.Changes {
			if c.Kind == kind {
				out = append(out, c)
			}
		}
	}
	return out
}

// owners returns each shard's rendezvous owner over members.
func owners(shards, members []string) map[string]string {
	var ms []rendezvous.Member
	for _, m := range members {
		ms = append(ms, rendezvous.Member{Name: m})
	}
	out := map[string]string{}
	for _, s := range shards {
		out[s], _ = rendezvous.Owner(s, ms)
	}
	return out
}

// holders reads ring r's holder keys: shard -> etcd lease, and the
// revision of the read.
func holders(t testing.TB, st *etcdstore.Store, r string) (map[string]clientv3.LeaseID, int64) {
	t.Helper()
	p := st.HolderKey(ring.ShardLease(r, ""))
	resp, err := st.Client().Get(fencertest.Context(t), p, clientv3.WithPrefix())
	require.NoError(t, err)
	out := map[string]clientv3.LeaseID{}
	for _, kv := range resp.Kvs {
		out[strings.TrimPrefix(string(kv.Key), p)] = clientv3.LeaseID(kv.Lease)
	}
	return out, resp.Header.Revision
}

// waitAssigned waits until every shard is held by the session of its
// rendezvous owner among members, and returns the revision it saw that at.
func waitAssigned(t testing.TB, st *etcdstore.Store, r string, shards []string, members []*tmember, within time.Duration) int64 {
	t.Helper()
	var names []string
	lease := map[string]clientv3.LeaseID{}
	for _, m := range members {
		names = append(names, m.Name())
		lease[m.Name()] = m.lease
	}
	want := owners(shards, names)
	var rev int64
	var wrong int
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		var got map[string]clientv3.LeaseID
		got, rev = holders(t, st, r)
		wrong = 0
		for _, s := range shards {
			if got[s] != lease[want[s]] {
				wrong++
			}
		}
		if wrong == 0 {
			return rev
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("after %s, %d of %d shards are not held by their owner", within, wrong, len(shards))
	return 0
}

// holderEvents returns the PUT and DELETE events of ring r's holder keys
// in (from, to], per shard.
func holderEvents(t testing.TB, st *etcdstore.Store, r string, from, to int64) (puts, dels map[string]int) {
	t.Helper()
	return keyEvents(t, st, st.HolderKey(ring.ShardLease(r, "")), from, to)
}

// keyEvents returns the PUT and DELETE events of the keys under prefix p
// in (from, to], per key less p.
func keyEvents(t testing.TB, st *etcdstore.Store, p string, from, to int64) (puts, dels map[string]int) {
	t.Helper()
	ctx, cancel := context.WithCancel(fencertest.Context(t))
	defer cancel()
	puts, dels = map[string]int{}, map[string]int{}
	if to <= from {
		return puts, dels
	}
	cli := st.Client()
	wch := cli.Watch(ctx, p, clientv3.WithPrefix(), clientv3.WithRev(from+1))
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
			require.NoError(t, cli.RequestProgress(ctx))
			continue
		case resp, ok := <-wch:
			require.True(t, ok, "watch ended")
			require.NoError(t, resp.Err())
			for _, ev := range resp.Events {
				if ev.Kv.ModRevision > to {
					return puts, dels
				}
				s := strings.TrimPrefix(string(ev.Kv.Key), p)
				if ev.Type == mvccpb.PUT {
					puts[s]++
				} else {
					dels[s]++
				}
			}
			if resp.IsProgressNotify() && resp.Header.Revision >= to {
				return puts, dels
			}
		}
	}
}

func sortedKeys(m map[string]int) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
