package kubeadapter_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/fencer-dev/fencer/kubeadapter"
)

// BenchmarkFencedUpdate compares, on the real API server and in the same
// run, a plain client.Update with a fenced Update given the object just
// read (the same single write plus a stamp check) and a fenced Update with
// WithLiveRead (a GET before the write). The three are interleaved on the
// same objects so that drift in the server affects them alike, and the
// ratios to plain are reported as fenced/plain and live/plain.
func BenchmarkFencedUpdate(b *testing.B) {
	k := newKube(b)
	ctx := context.Background()
	e := k.elector(b, "bench")
	h, err := e.TryAcquire(ctx)
	require.NoError(b, err)
	defer h.Release(ctx)
	fenced := k.client(b, h)
	live := k.client(b, h, kubeadapter.WithLiveRead())

	const objects = 8
	objs := make([]*corev1.ConfigMap, objects)
	for i := range objs {
		objs[i] = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: k.ns, Name: "bench-" + strconv.Itoa(i)}, Data: map[string]string{"n": "0"}}
		require.NoError(b, fenced.Create(ctx, objs[i]))
	}
	var plainT, fencedT, liveT time.Duration
	for i := 0; b.Loop(); i++ {
		obj := objs[i%objects]
		for j, w := range []struct {
			d      *time.Duration
			update func(context.Context, *corev1.ConfigMap) error
		}{
			{&plainT, func(ctx context.Context, o *corev1.ConfigMap) error { return k.crc.Update(ctx, o) }},
			{&fencedT, func(ctx context.Context, o *corev1.ConfigMap) error { return fenced.Update(ctx, o) }},
			{&liveT, func(ctx context.Context, o *corev1.ConfigMap) error { return live.Update(ctx, o) }},
		} {
			obj.Data["n"] = strconv.Itoa(3*i + j)
			start := time.Now()
			if err := w.update(ctx, obj); err != nil {
				b.Fatal(err)
			}
			*w.d += time.Since(start)
		}
	}
	n := float64(b.N)
	b.ReportMetric(float64(plainT.Nanoseconds())/n, "plain-ns/update")
	b.ReportMetric(float64(fencedT.Nanoseconds())/n, "fenced-ns/update")
	b.ReportMetric(float64(liveT.Nanoseconds())/n, "live-ns/update")
	b.ReportMetric(float64(fencedT)/float64(plainT), "fenced/plain")
	b.ReportMetric(float64(liveT)/float64(plainT), "live/plain")
}
