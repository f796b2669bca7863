package client_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fencer-dev/fencer/fencertest"
)

// BenchmarkRingOwns measures the latency of asking whether a member owns
// a shard, through the Go client, three ways in the same run on one
// server and etcd member:
//
//   - local: Ring.Owns, from the Ring's memory (no I/O);
//   - rpc: Ring.CheckOwns, the Owns RPC, answered from the memory of the
//     server that runs the member's stream;
//   - check: Client.Check of the shard's token, one linearizable etcd
//     read behind the server: for scale only, not a baseline, as it does
//     work the other two do not.
//
// Each b.N round asks locally of every shard (timed as one batch, so that
// reading the clock does not dominate), and by RPC and Check of one shard,
// the shards in turn, and reports the mean latency of each (local-ns,
// rpc-us, check-us).
func BenchmarkRingOwns(b *testing.B) {
	ctx := fencertest.Context(b)
	_, c := service(b)
	const shards = 64
	_, err := c.CreateRingCount(ctx, "bench", shards)
	require.NoError(b, err)
	r, err := newSession(b, c).JoinRing(ctx, "bench")
	require.NoError(b, err)
	defer r.Close()
	require.Eventually(b, func() bool { return len(r.Owned()) == shards }, 20*time.Second, 10*time.Millisecond)
	owned := r.Owned()
	names := make([]string, 0, shards)
	for s := range owned {
		names = append(names, s)
	}
	var local, rpc, check time.Duration
	b.ResetTimer()
	for i := range b.N {
		shard := names[i%shards]
		start := time.Now()
		for _, s := range names { // a batch, so that reading the clock does not dominate
			if _, ok := r.Owns(s); !ok {
				b.Fatalf("Owns(%q) reports the shard not owned", s)
			}
		}
		local += time.Since(start) / shards
		start = time.Now()
		_, ok, err := r.CheckOwns(ctx, shard)
		rpc += time.Since(start)
		if err != nil || !ok {
			b.Fatalf("CheckOwns(%q): %v, %v", shard, ok, err)
		}
		start = time.Now()
		err = c.Check(ctx, owned[shard])
		check += time.Since(start)
		if err != nil {
			b.Fatalf("Check of %q's token: %v", shard, err)
		}
	}
	b.StopTimer()
	n := float64(b.N)
	b.ReportMetric(float64(local.Nanoseconds())/n, "local-ns")
	b.ReportMetric(float64(rpc.Microseconds())/n, "rpc-us")
	b.ReportMetric(float64(check.Microseconds())/n, "check-us")
}
