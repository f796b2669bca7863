package kubeadapter_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fencer-dev/fencer/kubeadapter"
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
	k := newKube(b)
	ctx := context.Background()
	e, err := kubeadapter.NewElector(k.cs.CoordinationV1(), kubeadapter.DefaultConfig(k.ns, "fence", "bench"))
	require.NoError(b, err)
	h, err := e.TryAcquire(ctx)
	require.NoError(b, err)
	defer h.Release(ctx)

	objs := make([]*corev1.ConfigMap, benchObjects)
	creator := k.client(b, h)
	for i := range objs {
		objs[i] = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: k.ns, Name: "bench-" + strconv.Itoa(i)}, Data: map[string]string{"n": "0"}}
		require.NoError(b, creator.Create(ctx, objs[i]))
	}
	cached := startCache(b, k)
	apiReads := &countingReader{Reader: k.crc}
	fromCache := k.client(b, h, kubeadapter.WithReader(cached), kubeadapter.WithAPIReader(apiReads))
	live := k.client(b, h, kubeadapter.WithLiveRead())

	arms := []struct {
		update func(context.Context, client.Object) error
		d      time.Duration
	}{
		{update: func(ctx context.Context, o client.Object) error { return k.crc.Update(ctx, o) }},
		{update: func(ctx context.Context, o client.Object) error { return fromCache.Update(ctx, o) }},
		{update: func(ctx context.Context, o client.Object) error { return live.Update(ctx, o) }},
	}
	for i := 0; b.Loop(); i++ {
		for j := range arms {
			a := (i + j) % len(arms)
			obj := objs[(i+a*benchObjects/len(arms))%benchObjects]
			obj.Data["n"] = strconv.Itoa(i)
			start := time.Now()
			if err := arms[a].update(ctx, obj); err != nil {
				b.Fatal(err)
			}
			arms[a].d += time.Since(start)
		}
	}
	n := float64(b.N)
	plain, fenced, liveT := arms[0].d, arms[1].d, arms[2].d
	b.ReportMetric(float64(plain.Nanoseconds())/n, "plain-ns/update")
	b.ReportMetric(float64(fenced.Nanoseconds())/n, "fenced-cache-ns/update")
	b.ReportMetric(float64(liveT.Nanoseconds())/n, "fenced-live-ns/update")
	b.ReportMetric(float64(fenced)/float64(plain), "fenced-cache/plain")
	b.ReportMetric(float64(liveT)/float64(plain), "fenced-live/plain")
	b.ReportMetric(float64(apiReads.gets)/n, "live-reads/op")
}

// startCache starts a controller-runtime cache of k's namespace with a
// synced ConfigMap informer, as a manager's cache would be, and stops it
// when tb ends.
func startCache(tb testing.TB, k *kube) cache.Cache {
	tb.Helper()
	c, err := cache.New(k.env.Admin(), cache.Options{
		Scheme:            clientgoscheme.Scheme,
		DefaultNamespaces: map[string]cache.Config{k.ns: {}},
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
