//go:build !race

package server_test

import (
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fencer-dev/fencer/fencertest"
	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
)

// maxStreamStack bounds the stack bytes that one open stream adds to the
// process, its server handler's and its client's together, once Go has
// shrunk what it can. A handler that called etcd on its own goroutine
// keeps 16 KiB of stack for as long as its stream lasts (about 19 KB a
// stream here); one that calls etcd apart keeps 8 KiB (about 11 KB). The
// race detector's larger frames change the figures, so the test skips
// it.
const maxStreamStack = 15_000

// TestStreamHandlersKeepSmallStacks opens KeepAlive streams that have each
// renewed their session, then WatchLease streams that have each been
// synced, and measures the stack bytes a stream adds.
func TestStreamHandlersKeepSmallStacks(t *testing.T) {
	ctx := fencertest.Context(t)
	addr, _ := startServer(t, fencertest.SharedStore(t))
	rpc := fencerv1.NewFencerServiceClient(dial(t, alice, addr))
	ar, err := rpc.Acquire(ctx, &fencerv1.AcquireRequest{Name: "small-stacks"})
	require.NoError(t, err)
	const n = 200

	before := stackInuse()
	for range n {
		ka, err := rpc.KeepAlive(ctx)
		require.NoError(t, err)
		require.NoError(t, ka.Send(&fencerv1.KeepAliveRequest{SessionId: ar.GetSessionId()}))
		_, err = ka.Recv()
		require.NoError(t, err)
	}
	perStream := float64(stackInuse()-before) / n
	t.Logf("KeepAlive: %.0f stack bytes a stream", perStream)
	require.Less(t, perStream, float64(maxStreamStack), "stack bytes a KeepAlive stream adds")

	before = stackInuse()
	for range n {
		w, err := rpc.WatchLease(ctx, &fencerv1.WatchLeaseRequest{SessionId: ar.GetSessionId()})
		require.NoError(t, err)
		_, err = w.Recv()
		require.NoError(t, err)
	}
	perStream = float64(stackInuse()-before) / n
	t.Logf("WatchLease: %.0f stack bytes a stream", perStream)
	require.Less(t, perStream, float64(maxStreamStack), "stack bytes a WatchLease stream adds")
}

// stackInuse returns the process's stack bytes once garbage collections
// have shrunk every stack they can (each halves a stack at most once).
func stackInuse() uint64 {
	for range 4 {
		runtime.GC()
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.StackInuse
}
