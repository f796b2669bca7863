package e2e_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/fencer-dev/fencer/kubeadapter/fenced"
	"github.com/fencer-dev/fencer/kubeadapter/shard"
	"github.com/fencer-dev/fencer/token"
)

// reconciled is what the replicas' reconcilers did: for each project and
// downstream value, which replicas wrote it.
type reconciled struct {
	mu    sync.Mutex
	wrote map[[2]string][]string
}

func (r *reconciled) add(project, value, replica string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := [2]string{project, value}
	r.wrote[k] = append(r.wrote[k], replica)
}

func (r *reconciled) by(project, value string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.wrote[[2]string{project, value}]...)
}

// runReplica runs a replica's controller: a queue fed by a watch on the
// shared downstream ConfigMap, which enqueues every project on every
// change (the raw-source pattern that caused the incident), and by an
// AcquiredSource; one worker dispatches through Gate to a reconciler
// that copies the downstream value into dns-record-<project> through the
// fenced client of the project's shard.Held.
func runReplica(t *testing.T, k *kube, m *ringMember, projects []string, fromRV string, log *reconciled) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); q.ShutDown(); wg.Wait() })

	gate := shard.Gate(m.s, func(p string) string { return p }, shard.ReconcilerFunc[string](
		func(ctx context.Context, project string, h *shard.Held) (reconcile.Result, error) {
			var down corev1.ConfigMap
			if err := m.crc.Get(ctx, client.ObjectKey{Namespace: k.ns, Name: "downstream"}, &down); err != nil {
				return reconcile.Result{}, err
			}
			fc, err := fenced.NewClient(m.crc, h)
			if err != nil {
				return reconcile.Result{}, err
			}
			v := down.Data["v"]
			var rec corev1.ConfigMap
			err = m.crc.Get(ctx, client.ObjectKey{Namespace: k.ns, Name: "dns-record-" + project}, &rec)
			switch {
			case apierrors.IsNotFound(err):
				rec = corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: k.ns, Name: "dns-record-" + project}}
				rec.Data = map[string]string{"v": v, "by": m.name}
				err = fc.Create(ctx, &rec)
			case err == nil:
				rec.Data = map[string]string{"v": v, "by": m.name}
				err = fc.Update(ctx, &rec)
			}
			if err == nil {
				log.add(project, v, m.name)
			}
			return reconcile.Result{}, err
		}))
	acquired := shard.AcquiredSource(m.s, func(_ context.Context, shard string) ([]string, error) { return []string{shard}, nil })
	require.NoError(t, acquired.Start(ctx, q))

	cs, err := kubernetes.NewForConfig(k.env.Admin())
	require.NoError(t, err)
	w, err := cs.CoreV1().ConfigMaps(k.ns).Watch(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("metadata.name", "downstream").String(), ResourceVersion: fromRV,
	})
	require.NoError(t, err)
	wg.Go(func() {
		defer w.Stop()
		for ev := range w.ResultChan() {
			if ev.Type == watch.Modified {
				for _, p := range projects {
					q.Add(p)
				}
			}
		}
	})
	wg.Go(func() {
		for {
			p, shutdown := q.Get()
			if shutdown {
				return
			}
			if _, err := gate.Reconcile(ctx, p); err != nil {
				q.AddRateLimited(p)
			} else {
				q.Forget(p)
			}
			q.Done(p)
		}
	})
}

// TestShardIncident replays the DNS incident on the real API server with
// the admission policy installed: three replicas, each with its own
// clientset and Watcher, share projects as shards, and one shared
// downstream object enqueues every project on every replica.
func TestShardIncident(t *testing.T) {
	t.Parallel()
	k := newKube(t)
	ctx := t.Context()
	shared.InstallPolicy(t)
	ids := []string{"r0", "r1", "r2"}
	var projects []string
	for _, id := range ids {
		projects = append(projects, shardsOwnedBy("project-", id, 1, ids...)...)
	}
	down := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: k.ns, Name: "downstream"}, Data: map[string]string{"v": "0"}}
	require.NoError(t, k.crc.Create(ctx, down))

	var members []*ringMember
	for _, id := range ids {
		members = append(members, k.startMember(t, "dns", id, projects))
	}
	owner := settled(t, members, projects)
	log := &reconciled{wrote: map[[2]string][]string{}}
	for _, m := range members {
		runReplica(t, k, m, projects, down.ResourceVersion, log)
	}

	// Each AcquiredSource enqueued its member's projects at start.
	require.True(t, waitFor(10*time.Second, func() bool {
		for _, p := range projects {
			if len(log.by(p, "0")) == 0 {
				return false
			}
		}
		return true
	}), "the AcquiredSources did not enqueue the owned projects")
	for _, p := range projects {
		require.Equal(t, []string{owner[p]}, log.by(p, "0"))
	}

	// Each change is reconciled once per project, by its owner; the other
	// two replicas skip it at dispatch.
	for _, v := range []string{"1", "2"} {
		skipped0 := map[string]float64{}
		for _, m := range members {
			skipped0[m.name] = m.metric(t, shard.MetricDispatchSkipped)
		}
		down.Data["v"] = v
		require.NoError(t, k.crc.Update(ctx, down))
		require.True(t, waitFor(10*time.Second, func() bool {
			for _, p := range projects {
				if len(log.by(p, v)) == 0 {
					return false
				}
			}
			for _, m := range members {
				if m.metric(t, shard.MetricDispatchSkipped)-skipped0[m.name] < 2 {
					return false
				}
			}
			return true
		}), "change %s was not reconciled everywhere", v)
		time.Sleep(200 * time.Millisecond)
		for _, p := range projects {
			require.Equal(t, []string{owner[p]}, log.by(p, v), "change %s of %s", v, p)
			rec := k.configMap(t, "dns-record-"+p)
			require.Equal(t, v, rec.Data["v"])
			require.Equal(t, owner[p], rec.Data["by"])
		}
		for _, m := range members {
			require.Equal(t, 2.0, m.metric(t, shard.MetricDispatchSkipped)-skipped0[m.name], "%s skipped", m.name)
		}
	}

	// A replica that does not own a project has no shard.Held for it.
	pa, r0 := projects[0], members[0]
	_, err := members[1].s.Shard(pa)
	require.ErrorIs(t, err, shard.ErrNotOwner)
	require.ErrorIs(t, err, token.ErrNotHeld)

	// The incident: r0 reads project-a's record, keeps its shard.Held, and
	// its Lease traffic stalls past its lease duration.
	hOld, err := r0.s.Shard(pa)
	require.NoError(t, err)
	aView := k.configMap(t, "dns-record-"+pa)
	r0.leases.Stalled.Store(true)
	select {
	case <-hOld.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the stalled owner's shard.Held did not end")
	}
	require.ErrorIs(t, hOld.Err(), shard.ErrMemberLost)
	// A survivor takes the project with a greater token, and its
	// AcquiredSource has it write fresh state.
	var fresh token.Token
	var newOwner *ringMember
	require.True(t, waitFor(15*time.Second, func() bool {
		for _, m := range members[1:] {
			if tok, ok := m.s.Owns(pa); ok {
				fresh, newOwner = tok, m
			}
		}
		return newOwner != nil && k.configMap(t, "dns-record-"+pa).Data["by"] == newOwner.name
	}), "no survivor took %s over and wrote it", pa)
	requireGreater(t, fresh, hOld.Token())
	afterNew := k.configMap(t, "dns-record-"+pa)
	got, stamped, err := token.FromAnnotations(afterNew.Annotations)
	require.NoError(t, err)
	require.True(t, stamped)
	require.Equal(t, fresh, got)

	// r0 resumes. Its fenced client knows its shard.Held ended.
	late := aView.DeepCopy()
	late.Data = map[string]string{"v": "stale", "by": "r0-late"}
	fc, err := fenced.NewClient(r0.crc, hOld)
	require.NoError(t, err)
	require.ErrorIs(t, fc.Update(ctx, late.DeepCopy()), token.ErrNotHeld)
	// An r0 that has not noticed: the store decides, and the fenced client
	// reports the typed stale error.
	blind, err := fenced.NewClient(r0.crc, staticHolder{Tok: hOld.Token()})
	require.NoError(t, err)
	err = blind.Update(ctx, late.DeepCopy())
	require.ErrorIs(t, err, token.ErrStale)
	// A raw PUT of the current version with r0's old stamp is denied by
	// the API server.
	raw := afterNew.DeepCopy()
	raw.Annotations = hOld.Token().Stamp(raw.Annotations)
	raw.Data = map[string]string{"v": "stale", "by": "r0-raw"}
	_, err = k.cs.CoreV1().ConfigMaps(k.ns).Update(ctx, raw, metav1.UpdateOptions{})
	require.True(t, apierrors.IsForbidden(err), "raw stale update: %v", err)
	require.Contains(t, err.Error(), "stale fencing token")

	final := k.configMap(t, "dns-record-"+pa)
	require.Equal(t, afterNew.ResourceVersion, final.ResourceVersion, "a stale write landed")
	require.Equal(t, newOwner.name, final.Data["by"])
	r0.leases.Stalled.Store(false)
}
