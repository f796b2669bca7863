package e2e_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/kubernetes"

	"github.com/fencer-dev/fencer/kubeadapter"
	"github.com/fencer-dev/fencer/kubeadapter/shard"
	"github.com/fencer-dev/fencer/token"
)

// startView starts a ShardView of operator in ring, with its own clientset
// and Watcher (a delegate pod), and stops it when the test ends.
func (k *kube) startView(t *testing.T, ring, operator string) *shard.View {
	t.Helper()
	cs, err := kubernetes.NewForConfig(k.env.Admin())
	require.NoError(t, err)
	w, err := kubeadapter.NewWatcher(cs.CoordinationV1(), kubeadapter.WatchNamespaces(k.ns), kubeadapter.WithRegisterer(prometheus.NewRegistry()))
	require.NoError(t, err)
	v, err := shard.NewView(shard.ViewConfig{Namespace: k.ns, Ring: ring, Operator: operator, RenewDeadline: 1500 * time.Millisecond, Watcher: w})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, 2)
	go func() { _ = w.Start(ctx); done <- struct{}{} }()
	go func() { _ = v.Start(ctx); done <- struct{}{} }()
	t.Cleanup(func() { cancel(); <-done; <-done })
	return v
}

// TestShardView: read-only delegates of an operator act on its shards
// with the shards' tokens and add no Lease write; when the operator's
// heartbeat stops changing they stop within RenewDeadline, and once
// another member owns the shard and writes, a delegate's writes with the
// old token are refused by the store.
func TestShardView(t *testing.T) {
	// Not parallel: it counts every Lease write the API server accepts.
	k := newKube(t)
	shared.InstallPolicy(t)
	ctx := t.Context()
	ids := []string{"x-0", "x-1"}
	sh := shardsOwnedBy("view-", "x-0", 1, ids...)[0]
	x0 := k.startMember(t, "view", "x-0", []string{sh})
	settled(t, []*ringMember{x0}, []string{sh})
	without := steadyWrites(t, k, x0)

	var views []*shard.View
	for range 10 {
		views = append(views, k.startView(t, "view", "x-0"))
	}
	var d *shard.Delegate
	require.True(t, waitFor(10*time.Second, func() bool {
		var err error
		d, err = views[0].Shard(sh)
		return err == nil
	}), "the delegate never saw the operator's sh")
	tok, owns := x0.s.Owns(sh)
	require.True(t, owns)
	require.Equal(t, tok, d.Token(), "the delegate's token is not the operator's")
	with := steadyWrites(t, k, x0)
	t.Logf("Lease writes over 8 renewal periods of one operator: %.0f without delegates, %.0f with 10", without, with)
	// The API server's count covers every namespace; writes elsewhere
	// can only add to a window, so delegates must not add more than the
	// phase of one renewal.
	require.LessOrEqual(t, with, without+1, "delegates added Lease writes")
	require.NoError(t, writeRecord(ctx, k, x0, d, "record", "delegate"))
	require.NoError(t, d.Context().Err(), "the Context of a delegate that may act")

	// The operator pauses: its heartbeat stops changing.
	x0.leases.Stalled.Store(true)
	require.True(t, waitFor(10*time.Second, func() bool { return d.Err() != nil }), "the delegate kept acting after the operator's heartbeat stopped")
	require.ErrorIs(t, d.Err(), shard.ErrMemberLost)
	select {
	case <-d.Context().Done():
		require.ErrorIs(t, context.Cause(d.Context()), shard.ErrMemberLost)
	case <-time.After(10 * time.Second):
		t.Fatal("the delegate's Context did not end after its Err did")
	}
	require.ErrorIs(t, writeRecord(ctx, k, x0, d, "record", "delegate-late"), token.ErrNotHeld)
	_, err := views[0].Shard(sh)
	require.ErrorIs(t, err, token.ErrNotHeld)

	// Another member takes the sh over and writes: the delegate's
	// token is refused by the store.
	x1 := k.startMember(t, "view", "x-1", []string{sh})
	require.True(t, waitFor(20*time.Second, func() bool { _, ok := x1.s.Owns(sh); return ok }), "x-1 did not take the sh over")
	h1, err := x1.s.Shard(sh)
	require.NoError(t, err)
	require.NoError(t, writeRecord(ctx, k, x1, h1, "record", "x-1"))
	requireFencedOut(t, k, x0, d.Token(), "record")

	// The operator comes back as a new incarnation (restarted under its
	// identity: a request it had stalled would hang until its context
	// ends) and gets its sh back: its delegates follow it with a
	// greater token.
	x0.stop()
	k.startMember(t, "view", "x-0", []string{sh})
	require.True(t, waitFor(60*time.Second, func() bool {
		d2, err := views[0].Shard(sh)
		if err != nil {
			return false
		}
		c, err := d2.Token().Compare(h1.Token())
		return err == nil && c > 0
	}), "the delegate did not follow the operator's new incarnation")
}
