package fenced_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fencer-dev/fencer/kubeadapter"
	"github.com/fencer-dev/fencer/kubeadapter/fenced"
)

// benchObjects is how many ConfigMaps BenchmarkFencedUpdate writes round
// robin. Each arm starts a third of the way round from the previous one,
// so about benchObjects writes separate two writes of the same object:
// time enough for the cache to see the earlier one.
const benchObjects = 33

// BenchmarkFencedUpdate compares, on the real API server and in the same
// run, three updates of a caller's object that carries the resourceVersion
// of its last write, each conditional on that version:
//
//   - plain: client.Update of the inner client, the safe path of a plain
//     client (one PUT);
//   - fenced-cache: a fenced Update whose first read is from a started
//     controller-runtime cache (WithReader), with a live API reader
//     (WithAPIReader) for when the cache has not seen that version yet;
//   - fenced-live: a fenced Update with WithLiveRead (a GET, then the PUT).
//
// The arms take turns, in a rotating order, on the same benchObjects
// objects: in each iteration every arm updates one object, a third of the
// way round from the others', so that drift in the server affects them
// alike and the cache has caught up with an object's last write by the
// time it is written again (not waited for: live-reads/op, the fenced-cache
// arm's reads through its API reader per update, reports how often it had
// not). Time per update of each arm and the ratios fenced-cache/plain and
// fenced-live/plain are reported.
func BenchmarkFencedUpdate(b *testing.B) {
	f := newBenchFixture(b)
	arms := []benchArm{
		{write: func(ctx context.Context, o *corev1.ConfigMap, i int) error {
			o.Data["n"] = strconv.Itoa(i)
			return f.k.CRC.Update(ctx, o)
		}},
		{write: func(ctx context.Context, o *corev1.ConfigMap, i int) error {
			o.Data["n"] = strconv.Itoa(i)
			return f.fromCache.Update(ctx, o)
		}},
		{write: func(ctx context.Context, o *corev1.ConfigMap, i int) error {
			o.Data["n"] = strconv.Itoa(i)
			return f.live.Update(ctx, o)
		}},
	}
	rotate(b, f.objs, arms)
	n := float64(b.N)
	plain, fenced, liveT := arms[0].d, arms[1].d, arms[2].d
	b.ReportMetric(float64(plain.Nanoseconds())/n, "plain-ns/update")
	b.ReportMetric(float64(fenced.Nanoseconds())/n, "fenced-cache-ns/update")
	b.ReportMetric(float64(liveT.Nanoseconds())/n, "fenced-live-ns/update")
	b.ReportMetric(float64(fenced)/float64(plain), "fenced-cache/plain")
	b.ReportMetric(float64(liveT)/float64(plain), "fenced-live/plain")
	b.ReportMetric(float64(f.apiReads.gets)/n, "live-reads/op")
}

// BenchmarkFencedPatch compares, on the real API server and in the same
// run, merge patches of one field of the same objects:
//
//   - plain: client.Patch of the inner client with the resourceVersion of
//     the object's last write in the patch (client.MergeFromWithOptimisticLock
//     sends the same), the safe path of a plain client (one PATCH);
//   - plain-unconditional: the same patch without a resourceVersion,
//     which may write over anything (one PATCH);
//   - fenced-cache: a fenced Patch of the unconditional patch, reading
//     from a started cache (WithReader) with a live API reader for
//     versions the cache has not seen (a read from memory, then the PATCH
//     with the stamp and the checked resourceVersion).
//
// The arms take turns as in BenchmarkFencedUpdate. fenced-cache/plain is
// the cost of fencing against a plain write of the same safety; live-
// reads/op is how often the cache had not caught up.
func BenchmarkFencedPatch(b *testing.B) {
	f := newBenchFixture(b)
	patch := func(w client.Writer, pinned bool) func(context.Context, *corev1.ConfigMap, int) error {
		return func(ctx context.Context, o *corev1.ConfigMap, i int) error {
			body := fmt.Sprintf(`{"data":{"n":"%d"}}`, i)
			if pinned {
				body = fmt.Sprintf(`{"metadata":{"resourceVersion":%q},"data":{"n":"%d"}}`, o.ResourceVersion, i)
			}
			return w.Patch(ctx, o, client.RawPatch(types.MergePatchType, []byte(body)))
		}
	}
	arms := []benchArm{{write: patch(f.k.CRC, true)}, {write: patch(f.k.CRC, false)}, {write: patch(f.fromCache, false)}}
	rotate(b, f.objs, arms)
	n := float64(b.N)
	plain, unconditional, fenced := arms[0].d, arms[1].d, arms[2].d
	b.ReportMetric(float64(plain.Nanoseconds())/n, "plain-ns/patch")
	b.ReportMetric(float64(unconditional.Nanoseconds())/n, "plain-unconditional-ns/patch")
	b.ReportMetric(float64(fenced.Nanoseconds())/n, "fenced-cache-ns/patch")
	b.ReportMetric(float64(fenced)/float64(plain), "fenced-cache/plain")
	b.ReportMetric(float64(fenced)/float64(unconditional), "fenced-cache/plain-unconditional")
	b.ReportMetric(float64(f.apiReads.gets)/n, "live-reads/op")
}

// benchFixture is a held lease over benchObjects ConfigMaps, with fenced
// clients that read from a started cache or live.
type benchFixture struct {
	k         *kube
	objs      []*corev1.ConfigMap
	fromCache *fenced.Client
	apiReads  *countingReader
	live      *fenced.Client
}

func newBenchFixture(b *testing.B) *benchFixture {
	k := newKube(b)
	ctx := context.Background()
	e, err := kubeadapter.NewElector(k.CS.CoordinationV1(), kubeadapter.DefaultConfig(k.NS, "fence", "bench"))
	require.NoError(b, err)
	h, err := e.TryAcquire(ctx)
	require.NoError(b, err)
	b.Cleanup(func() { _ = h.Release(ctx) })
	f := &benchFixture{k: k, objs: make([]*corev1.ConfigMap, benchObjects), apiReads: &countingReader{Reader: k.CRC}}
	creator := k.Client(b, h)
	for i := range f.objs {
		f.objs[i] = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: k.NS, Name: "bench-" + strconv.Itoa(i)}, Data: map[string]string{"n": "0"}}
		require.NoError(b, creator.Create(ctx, f.objs[i]))
	}
	f.fromCache = k.Client(b, h, fenced.WithReader(startCache(b, k)), fenced.WithAPIReader(f.apiReads))
	f.live = k.Client(b, h, fenced.WithLiveRead())
	return f
}

// benchArm is one way of writing an object, and the time it took.
type benchArm struct {
	write func(ctx context.Context, obj *corev1.ConfigMap, i int) error
	d     time.Duration
}

// rotate runs the arms in turns until b.Loop ends: in iteration i every
// arm writes one object, a third of the way round objs from the others',
// in a rotating order, so that drift in the server affects them alike and
// the cache has caught up with an object's last write by the time it is
// written again.
func rotate(b *testing.B, objs []*corev1.ConfigMap, arms []benchArm) {
	ctx := context.Background()
	for i := 0; b.Loop(); i++ {
		for j := range arms {
			a := (i + j) % len(arms)
			start := time.Now()
			if err := arms[a].write(ctx, objs[(i+a*len(objs)/len(arms))%len(objs)], i); err != nil {
				b.Fatal(err)
			}
			arms[a].d += time.Since(start)
		}
	}
}

// startCache starts a controller-runtime cache of k's namespace with a
// synced ConfigMap informer, as a manager's cache would be, and stops it
// when tb ends.
func startCache(tb testing.TB, k *kube) cache.Cache {
	tb.Helper()
	c, err := cache.New(k.Env.Admin(), cache.Options{
		Scheme:            clientgoscheme.Scheme,
		DefaultNamespaces: map[string]cache.Config{k.NS: {}},
	})
	require.NoError(tb, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Start(ctx) }()
	tb.Cleanup(func() {
		cancel()
		require.NoError(tb, <-done)
	})
	_, err = c.GetInformer(ctx, &corev1.ConfigMap{})
	require.NoError(tb, err)
	require.True(tb, c.WaitForCacheSync(ctx), "cache did not sync")
	return c
}

// countingReader is a client.Reader that counts its Gets.
type countingReader struct {
	client.Reader
	gets int
}

// Get counts the call and passes it to the wrapped Reader.
func (r *countingReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	r.gets++
	return r.Reader.Get(ctx, key, obj, opts...)
}
