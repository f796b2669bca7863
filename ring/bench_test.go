package ring_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/fencer-dev/fencer/etcdstore"
	"github.com/fencer-dev/fencer/fencertest"
	"github.com/fencer-dev/fencer/ring"
)

// benchShards is the ring size of the benchmarks: FENCER_RING_SHARDS, or
// 1,000.
func benchShards(b *testing.B) int {
	if v := os.Getenv("FENCER_RING_SHARDS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > ring.MaxShards {
			b.Fatalf("FENCER_RING_SHARDS=%q: want 1 to %d", v, ring.MaxShards)
		}
		return n
	}
	return 1000
}

// writeCounter counts the requests of an etcd client that write: unary
// calls other than Range, and every message sent on a LeaseKeepAlive
// stream (a renewal).
type writeCounter struct{ n atomic.Int64 }

func (c *writeCounter) unary(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if !strings.HasSuffix(method, "/Range") {
		c.n.Add(1)
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

func (c *writeCounter) stream(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	s, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil || !strings.HasSuffix(method, "/LeaseKeepAlive") {
		return s, err
	}
	return countedStream{ClientStream: s, n: &c.n}, nil
}

type countedStream struct {
	grpc.ClientStream
	n *atomic.Int64
}

func (s countedStream) SendMsg(m any) error {
	s.n.Add(1)
	return s.ClientStream.SendMsg(m)
}

// countedStore returns a store on the shared etcd member, under a prefix of
// its own, whose client counts its writes.
func countedStore(b *testing.B, prefix string) (*etcdstore.Store, *writeCounter) {
	c := &writeCounter{}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{fencertest.SharedEtcd(b)},
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(c.unary), grpc.WithChainStreamInterceptor(c.stream)},
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cli.Close() })
	st, err := etcdstore.New(cli, etcdstore.WithPrefix(prefix))
	if err != nil {
		b.Fatal(err)
	}
	return st, c
}

// BenchmarkSteadyWrites measures what reaches etcd while nothing moves:
// N shards over 3 ring members (sessions of TTL 10 s), beside a baseline
// of one etcd lease per shard (TTL 10 s, each holding its shard's lease
// and kept alive by etcd's client, which renews each lease every third of
// its TTL), over a 10 s window per iteration. It reports both in writes/s
// (renewals and Txns) and their ratio.
func BenchmarkSteadyWrites(b *testing.B) {
	n := benchShards(b)
	const window = 10 * time.Second
	ringSt, ringCount := countedStore(b, "/bench-ring-writes/")
	baseSt, baseCount := countedStore(b, "/bench-base-writes/")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	shards := define(b, ringSt, "steady", n)
	var ms []*tmember
	for _, name := range []string{"a", "b", "c"} {
		ms = append(ms, join(b, ringSt, "steady", name, true, ring.Config{}, etcdstore.WithTTL(10*time.Second)))
	}
	waitAssigned(b, ringSt, "steady", shards, ms, 2*time.Minute)
	kctx, stop := context.WithCancel(context.Background())
	b.Cleanup(stop)
	for _, s := range shards {
		l, err := baseSt.Client().Grant(ctx, 10)
		if err != nil {
			b.Fatal(err)
		}
		if _, _, err := baseSt.AcquireOn(ctx, l.ID, "base", ring.ShardLease("base", s), 0); err != nil {
			b.Fatal(err)
		}
		if _, err := baseSt.Client().KeepAlive(kctx, l.ID); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	var ringW, baseW int64
	for i := 0; i < b.N; i++ {
		r0, b0 := ringCount.n.Load(), baseCount.n.Load()
		time.Sleep(window)
		ringW += ringCount.n.Load() - r0
		baseW += baseCount.n.Load() - b0
	}
	secs := (window * time.Duration(b.N)).Seconds()
	b.ReportMetric(float64(ringW)/secs, "ring-writes/s")
	b.ReportMetric(float64(baseW)/secs, "lease-per-shard-writes/s")
	b.ReportMetric(float64(baseW)/max(float64(ringW), 1), "baseline/ring")
	b.ReportMetric(float64(n), "shards")
}

// BenchmarkDeathReown measures the time from a member's death (its
// session revoked) to every one of its shards acquired again by the
// others, at N shards over 3 members.
func BenchmarkDeathReown(b *testing.B) {
	n := benchShards(b)
	st := fencertest.SharedStore(b)
	var total time.Duration
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		r := fmt.Sprintf("death-%d", i)
		shards := define(b, st, r, n)
		var ms []*tmember
		for _, name := range []string{"a", "b", "c"} {
			ms = append(ms, join(b, st, r, name, true, ring.Config{}))
		}
		waitAssigned(b, st, r, shards, ms, 2*time.Minute)
		victim := ms[2]
		got, rev := holders(b, st, r)
		left := map[string]bool{}
		for s, l := range got {
			if l == victim.lease {
				left[s] = true
			}
		}
		p := st.HolderKey(ring.ShardLease(r, ""))
		wctx, cancel := context.WithCancel(fencertest.Context(b))
		wch := st.Client().Watch(wctx, p, clientv3.WithPrefix(), clientv3.WithRev(rev+1), clientv3.WithFilterDelete())
		b.StartTimer()
		start := time.Now()
		if _, err := st.Client().Revoke(wctx, victim.lease); err != nil {
			b.Fatal(err)
		}
		for len(left) > 0 {
			resp, ok := <-wch
			if !ok || resp.Err() != nil {
				b.Fatalf("watch: %v", resp.Err())
			}
			for _, ev := range resp.Events {
				if ev.Type == mvccpb.PUT {
					delete(left, strings.TrimPrefix(string(ev.Kv.Key), p))
				}
			}
		}
		total += time.Since(start)
		b.StopTimer()
		cancel()
		for _, m := range ms {
			m.Close()
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "ms-to-reown")
	b.ReportMetric(float64(n), "shards")
}
