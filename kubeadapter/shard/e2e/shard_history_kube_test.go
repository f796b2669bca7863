package e2e_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fencer-dev/fencer/internal/testkit/history"
	"github.com/fencer-dev/fencer/kubeadapter"
	"github.com/fencer-dev/fencer/kubeadapter/fenced"
	"github.com/fencer-dev/fencer/token"
)

var shardHistoryRounds = flag.Int("shard-history-rounds", 1, "rounds of join, leave, pause, partition and kill in TestShardHistory (make test runs 1)")

// shardHistory records the operations on the registers, by register name,
// on one monotonic clock, for the fenced register model
// (history.FencedRegister): one register per shard, written with the
// writer's shard token.
type shardHistory struct {
	start time.Time
	mu    sync.Mutex
	regs  map[string]*history.History
	vals  atomic.Int64
}

func newShardHistory() *shardHistory {
	return &shardHistory{start: time.Now(), regs: map[string]*history.History{}}
}

// reg returns the history of register name.
func (h *shardHistory) reg(name string) *history.History {
	h.mu.Lock()
	defer h.mu.Unlock()
	r := h.regs[name]
	if r == nil {
		r = history.New(h.start)
		h.regs[name] = r
	}
	return r
}

func (h *shardHistory) now() int64 { return time.Since(h.start).Nanoseconds() }

// acceptedTokens returns the tokens of the writes to reg that were
// accepted.
func (h *shardHistory) acceptedTokens(reg string) (accepted []int64) {
	for _, op := range h.reg(reg).Ops() {
		in, out := op.Input.(history.Input), op.Output.(history.Output)
		if in.Write && out.OK {
			accepted = append(accepted, in.Tok)
		}
	}
	return accepted
}

// accepted reports whether reg has an accepted write with a token
// greater than tok.
func (h *shardHistory) accepted(reg string, tok int64) bool {
	return slices.ContainsFunc(h.acceptedTokens(reg), func(t int64) bool { return t > tok })
}

func (h *shardHistory) check(t *testing.T, reg string) porcupine.CheckResult {
	t.Helper()
	r := h.reg(reg)
	res := r.Check(history.FencedRegister, 30*time.Second)
	ops, _ := r.Len()
	t.Logf("%s: %d operations: %s", reg, ops, res)
	return res
}

// registers writes and reads the two registers of each shard: fenced-<shard>
// through the fenced client, and plain-<shard>, the tokenless baseline,
// with a plain read-modify-write (conditional on the resourceVersion read,
// as client.Update is, but carrying no token).
type registers struct {
	k *kube
	h *shardHistory
}

// write writes both registers of shard as m with holder's token, and
// returns whether the API server refused the fenced one.
func (r *registers) write(ctx context.Context, m *ringMember, cid int, shard string, holder kubeadapter.Holder) (fencedRefused bool) {
	tok := holder.Token().Revision
	fencedRefused = r.writeOne(ctx, "fenced-"+shard, cid, tok, func(ctx context.Context, cm *corev1.ConfigMap) error {
		fc, err := fenced.NewClient(m.crc, holder)
		if err != nil {
			return err
		}
		return fc.Update(ctx, cm)
	}, m)
	r.writeOne(ctx, "plain-"+shard, cid, tok, func(ctx context.Context, cm *corev1.ConfigMap) error { return m.crc.Update(ctx, cm) }, m)
	return fencedRefused
}

// writeOne records one write of reg and returns whether update was sent
// and refused.
func (r *registers) writeOne(ctx context.Context, reg string, cid int, tok int64, update func(context.Context, *corev1.ConfigMap) error, m *ringMember) (refused bool) {
	val := int(r.h.vals.Add(1))
	call := r.h.now()
	var cm corev1.ConfigMap
	if err := m.crc.Get(ctx, client.ObjectKey{Namespace: r.k.ns, Name: reg}, &cm); err != nil {
		r.h.reg(reg).Add(cid, history.Input{Write: true, Tok: tok, Val: val}, call, history.Output{})
		return false
	}
	cm.Data = map[string]string{"v": strconv.Itoa(val)}
	err := update(ctx, &cm)
	out := history.Output{OK: err == nil}
	switch {
	case err == nil, errors.Is(err, token.ErrStale), errors.Is(err, token.ErrNotHeld), apierrors.IsConflict(err), apierrors.IsForbidden(err):
	default:
		out.Unknown = true
	}
	r.h.reg(reg).Add(cid, history.Input{Write: true, Tok: tok, Val: val}, call, out)
	return !out.OK && !out.Unknown
}

func (r *registers) read(ctx context.Context, reg string) {
	call := r.h.now()
	var cm corev1.ConfigMap
	if err := r.k.crc.Get(ctx, client.ObjectKey{Namespace: r.k.ns, Name: reg}, &cm); err != nil {
		return
	}
	v, _ := strconv.Atoi(cm.Data["v"])
	r.h.reg(reg).Add(0, history.Input{}, call, history.Output{OK: true, Val: v})
}

// TestShardHistory records the writes of a ring's members to a register
// per shard while members join, leave gracefully, pause (heartbeat
// stalled past the lease duration while a goroutine keeps writing with
// the token it had, then restarted), are partitioned from the API server
// past the lease duration and healed, and are killed and restarted at
// once under the same identity, and checks the histories with
// porcupine against the fenced register. Every member writes two
// registers per shard with the same ownership: through the fenced
// client, and without a token (the tokenless one-Lease-per-shard
// baseline of the peers). Each fault's
// late write, after the new owner's, is made explicitly, so the
// baseline's histories must be illegal and the fenced ones legal.
// -shard-history-rounds repeats the churn.
func TestShardHistory(t *testing.T) {
	k := newKube(t)
	shared.InstallPolicy(t)
	ctx := t.Context()
	shards := []string{"reg-a", "reg-b"}
	for _, sh := range shards {
		for _, reg := range []string{"fenced-" + sh, "plain-" + sh} {
			require.NoError(t, k.crc.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: k.ns, Name: reg}}))
		}
	}
	h := newShardHistory()
	r := &registers{k: k, h: h}
	var members []*ringMember
	for i := range 3 {
		members = append(members, k.startMember(t, "hist", fmt.Sprintf("x-%d", i), shards))
	}
	settled(t, members, shards)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	// every runs fn every d until stop is closed.
	every := func(d time.Duration, fn func()) {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				case <-time.After(d):
				}
				fn()
			}
		})
	}
	work := func(m *ringMember, cid int) {
		every(15*time.Millisecond, func() {
			for _, sh := range shards {
				if hd, err := m.s.Shard(sh); err == nil {
					r.write(ctx, m, cid, sh, hd)
				}
			}
		})
	}
	for i, m := range members {
		work(m, i+1)
	}
	every(10*time.Millisecond, func() {
		for _, sh := range shards {
			r.read(ctx, "fenced-"+sh)
			r.read(ctx, "plain-"+sh)
		}
	})

	// ownerOf returns the member that owns shard now, and its index.
	ownerOf := func(shard string) (*ringMember, int) {
		owner := settled(t, members, shards)
		for i, m := range members {
			if m.name == owner[shard] {
				return m, i
			}
		}
		t.Fatalf("no member owns %s", shard)
		return nil, 0
	}
	// late makes m's writes to shard with its old token until a newer
	// owner's writes to both registers were accepted, then one more: the
	// late write, which the fenced register must refuse.
	late := func(m *ringMember, cid int, shard string, old token.Token, why string) {
		t.Helper()
		blind := staticHolder{Tok: old}
		require.True(t, waitFor(20*time.Second, func() bool {
			r.write(ctx, m, cid, shard, blind)
			return h.accepted("fenced-"+shard, old.Revision) && h.accepted("plain-"+shard, old.Revision)
		}), "%s: no new owner wrote %s", why, shard)
		// This write's own outcome: the other members' writers may be
		// refused at the same moment, so a count of refusals would not
		// tell.
		require.True(t, r.write(ctx, m, cid, shard, blind), "%s: the late fenced write to %s was not refused", why, shard)
	}
	for round := range *shardHistoryRounds {
		// Join, then graceful leave, of a fourth member.
		joiner := k.startMember(t, "hist", fmt.Sprintf("j-%d", round), shards)
		work(joiner, 10+round)
		settled(t, append(members[:3:3], joiner), shards)
		time.Sleep(200 * time.Millisecond)
		joiner.stop()

		// Pause the owner of reg-a: its heartbeat stalls, and a goroutine
		// of it keeps writing with the ownership it had. The paused
		// process is then restarted under its identity (a stalled
		// request of it would hang until its context ends).
		paused, at := ownerOf("reg-a")
		old, err := paused.s.Shard("reg-a")
		require.NoError(t, err)
		paused.leases.Stalled.Store(true)
		late(paused, 100+round, "reg-a", old.Token(), "pause")
		paused.stop()
		members[at] = k.startMember(t, "hist", paused.name, shards)
		work(members[at], 200+round)

		// Partition the owner of reg-b from the API server, past the
		// lease duration, then heal it: it must have ended its ownership
		// on its own clock before the new owner wrote, its late write
		// with the token it had is refused, and it rejoins by itself.
		cut, _ := ownerOf("reg-b")
		old, err = cut.s.Shard("reg-b")
		require.NoError(t, err)
		cut.net.set(true)
		require.True(t, waitFor(20*time.Second, func() bool {
			return h.accepted("fenced-reg-b", old.Token().Revision) && h.accepted("plain-reg-b", old.Token().Revision)
		}), "partition: no new owner wrote reg-b")
		require.Error(t, old.Context().Err(), "partition: the cut owner's shard.Held had not ended when the new owner wrote")
		cut.net.set(false)
		late(cut, 300+round, "reg-b", old.Token(), "partition")

		// Kill the owner of reg-a: its Lease calls fail at once and it
		// stops without release or handoff; a worker that outlived it
		// keeps its token. The same identity starts again at once, while
		// its old heartbeat is still live.
		killed, at := ownerOf("reg-a")
		old, err = killed.s.Shard("reg-a")
		require.NoError(t, err)
		killed.leases.Killed.Store(true)
		killed.stop()
		members[at] = k.startMember(t, "hist", killed.name, shards)
		work(members[at], 400+round)
		late(killed, 500+round, "reg-a", old.Token(), "kill")
		settled(t, members, shards)
	}
	time.Sleep(200 * time.Millisecond)
	close(stop)
	wg.Wait()

	for _, sh := range shards {
		require.Equal(t, porcupine.Ok, h.check(t, "fenced-"+sh), "the fenced history of %s is not a fenced register", sh)
		require.Equal(t, porcupine.Illegal, h.check(t, "plain-"+sh), "the tokenless baseline's history of %s passed: the check does not bite", sh)
	}
}
