package integration_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fencer-dev/fencer/internal/testkit/history"
	"github.com/fencer-dev/fencer/kubeadapter"
	"github.com/fencer-dev/fencer/kubeadapter/fenced"
	"github.com/fencer-dev/fencer/kubeadapter/kubefencertest"
	"github.com/fencer-dev/fencer/token"
)

// The Kubernetes chaos test plays the incident from fencer's design: the
// Lease passes from replica A to replica B while A is still active, and both
// keep reconciling one ConfigMap (read, then Update). The same harness runs
// twice:
//
//   - stock client-go leader election with plain Updates, the baseline: A
//     stays leader until its RenewDeadline and its writes land after B's, so
//     the history is NOT linearizable as a fenced register;
//   - fencer's elector and fenced client, with A's local "still held" check
//     bypassed so that only the API server can stop it: the history must be
//     linearizable.
//
// The writes' token is the resourceVersion of the Lease when the writer
// became leader (fencer's token revision), so a later leader's token is
// greater.

type kubeChaos struct {
	cs  *kubernetes.Clientset
	crc client.Client
	ns  string
	h   *history.History

	nextVal  atomic.Int64
	accepted atomic.Int64
	rejected atomic.Int64
}

func newKubeChaos(t *testing.T, env *kubefencertest.APIServer, ns string) *kubeChaos {
	cs, err := kubernetes.NewForConfig(env.Admin())
	require.NoError(t, err)
	crc, err := client.New(env.Admin(), client.Options{Scheme: clientgoscheme.Scheme})
	require.NoError(t, err)
	ctx := context.Background()
	_, err = cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "register"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	return &kubeChaos{cs: cs, crc: crc, ns: ns, h: history.New(time.Now())}
}

// reconcile reads the register and writes the next value through write,
// recording the write in the history with token tok.
func (k *kubeChaos) reconcile(ctx context.Context, replica int, tok int64, write func(context.Context, *corev1.ConfigMap) error) {
	var cm corev1.ConfigMap
	if err := k.crc.Get(ctx, client.ObjectKey{Namespace: k.ns, Name: "register"}, &cm); err != nil {
		return
	}
	in := history.Input{Write: true, Tok: tok, Val: int(k.nextVal.Add(1))}
	cm.Data = map[string]string{"val": strconv.Itoa(in.Val)}
	call := k.h.Now()
	err := write(ctx, &cm)
	var out history.Output
	switch {
	case err == nil:
		out.OK = true
		k.accepted.Add(1)
	case apierrors.IsConflict(err) || errors.Is(err, token.ErrStale) || errors.Is(err, token.ErrNotHeld):
		k.rejected.Add(1)
	default:
		out.Unknown = true
	}
	k.h.Add(replica, in, call, out)
}

// read records reads of the register until ctx ends.
func (k *kubeChaos) read(ctx context.Context) {
	for ctx.Err() == nil {
		call := k.h.Now()
		cm, err := k.cs.CoreV1().ConfigMaps(k.ns).Get(ctx, "register", metav1.GetOptions{})
		if err == nil {
			v, _ := strconv.Atoi(cm.Data["val"])
			k.h.Add(0, history.Input{}, call, history.Output{OK: true, Val: v})
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestChaosKubeClientGoBaselineIsNotFenced(t *testing.T) {
	env := kubefencertest.APIServerForTest(t)
	k := newKubeChaos(t, env, "chaos-baseline")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	var leaders sync.Map // identity -> leader since
	run := func(replica int, identity string) (stopped chan struct{}) {
		stopped = make(chan struct{})
		lock := &resourcelock.LeaseLock{
			LeaseMeta:  metav1.ObjectMeta{Namespace: k.ns, Name: "fence"},
			Client:     k.cs.CoordinationV1(),
			LockConfig: resourcelock.ResourceLockConfig{Identity: identity},
		}
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock: lock, LeaseDuration: 4 * time.Second, RenewDeadline: 3 * time.Second, RetryPeriod: 250 * time.Millisecond,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(lctx context.Context) {
					lease, err := k.cs.CoordinationV1().Leases(k.ns).Get(lctx, "fence", metav1.GetOptions{})
					if err != nil {
						return
					}
					term, _ := strconv.ParseInt(lease.ResourceVersion, 10, 64)
					leaders.Store(identity, term)
					for lctx.Err() == nil {
						k.reconcile(lctx, replica, term, func(c context.Context, cm *corev1.ConfigMap) error { return k.crc.Update(c, cm) })
						time.Sleep(30 * time.Millisecond)
					}
				},
				OnStoppedLeading: func() { close(stopped) },
			},
		})
		require.NoError(t, err)
		go le.Run(ctx)
		return stopped
	}
	readCtx, stopReading := context.WithCancel(ctx)
	defer stopReading()
	go k.read(readCtx)

	stoppedA := run(1, "replica-a")
	require.Eventually(t, func() bool { _, ok := leaders.Load("replica-a"); return ok }, 20*time.Second, 10*time.Millisecond)
	run(2, "replica-b")
	time.Sleep(300 * time.Millisecond)

	// The Lease passes to B while A is active (an operator's handover, or
	// A's renewals stalled): B becomes leader at its next retry, and A
	// carries on until its RenewDeadline.
	// A renews every RetryPeriod, so the handover retries on a conflict.
	require.NoError(t, retry.RetryOnConflict(retry.DefaultRetry, func() error {
		lease, err := k.cs.CoordinationV1().Leases(k.ns).Get(ctx, "fence", metav1.GetOptions{})
		if err != nil {
			return err
		}
		handOver(lease, "replica-b")
		_, err = k.cs.CoordinationV1().Leases(k.ns).Update(ctx, lease, metav1.UpdateOptions{})
		return err
	}))
	require.Eventually(t, func() bool { _, ok := leaders.Load("replica-b"); return ok }, 20*time.Second, 10*time.Millisecond)
	select {
	case <-stoppedA:
	case <-time.After(20 * time.Second):
		t.Fatal("client-go replica A never stopped leading")
	}
	time.Sleep(200 * time.Millisecond)
	stopReading()
	cancel()

	t.Logf("writes: %d accepted, %d rejected", k.accepted.Load(), k.rejected.Load())
	require.Equal(t, porcupine.Illegal, checkFenced(t, k.h),
		"the baseline's history was linearizable: the harness did not reproduce the stale write")
}

func TestChaosKubeFencerIsFenced(t *testing.T) {
	env := kubefencertest.APIServerForTest(t)
	k := newKubeChaos(t, env, "chaos-fencer")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := func(identity string) kubeadapter.Config {
		return kubeadapter.Config{Namespace: k.ns, Name: "fence", Identity: identity,
			LeaseDuration: 4 * time.Second, RenewDeadline: 3 * time.Second, RetryPeriod: 250 * time.Millisecond}
	}
	elector := func(identity string) *kubeadapter.Elector {
		e, err := kubeadapter.NewElector(k.cs.CoordinationV1(), cfg(identity))
		require.NoError(t, err)
		return e
	}
	readCtx, stopReading := context.WithCancel(ctx)
	defer stopReading()
	go k.read(readCtx)

	var wg sync.WaitGroup
	work := func(replica int, h kubeadapter.Holder, until <-chan struct{}) {
		defer wg.Done()
		fc, err := fenced.NewClient(k.crc, h)
		if err != nil {
			t.Error(err)
			return
		}
		for {
			select {
			case <-until:
				return
			default:
			}
			k.reconcile(ctx, replica, h.Token().Revision, func(c context.Context, cm *corev1.ConfigMap) error { return fc.Update(c, cm) })
			time.Sleep(30 * time.Millisecond)
		}
	}

	heldA, err := elector("replica-a").Acquire(ctx)
	require.NoError(t, err)
	stopA := make(chan struct{})
	wg.Add(1)
	// A never looks at whether it still holds the Lease: only the API
	// server can stop its writes.
	go work(1, oblivious{heldA}, stopA)
	time.Sleep(300 * time.Millisecond)

	// The Lease passes to B while A is active: deleted and acquired anew.
	require.NoError(t, k.cs.CoordinationV1().Leases(k.ns).Delete(ctx, "fence", metav1.DeleteOptions{}))
	heldB, err := elector("replica-b").Acquire(ctx)
	require.NoError(t, err)
	stopB := make(chan struct{})
	wg.Add(1)
	go work(2, heldB, stopB)
	rejectedBefore := k.rejected.Load()
	time.Sleep(3 * time.Second) // as long as client-go's A stays active
	close(stopA)
	close(stopB)
	wg.Wait()
	require.NoError(t, heldB.Release(ctx))
	_ = heldA.Release(ctx) // lost already: changes nothing
	time.Sleep(100 * time.Millisecond)
	stopReading()
	cancel()

	t.Logf("writes: %d accepted, %d rejected (%d after B took over)", k.accepted.Load(), k.rejected.Load(), k.rejected.Load()-rejectedBefore)
	require.Equal(t, porcupine.Ok, checkFenced(t, k.h), "fencer's history is not linearizable as a fenced register")
	require.Positive(t, k.rejected.Load()-rejectedBefore, "A's writes after the handover were not exercised")
}

// oblivious is a Holder that never admits to having lost its lease, like a
// process that does not notice: fencing must then come from the API server.
type oblivious struct{ kubeadapter.Holder }

func (oblivious) Err() error { return nil }

// handOver rewrites a Lease record for identity, as a takeover by another
// holder would.
func handOver(lease *coordinationv1.Lease, identity string) {
	now := metav1.NewMicroTime(time.Now())
	transitions := int32(1)
	if lease.Spec.LeaseTransitions != nil {
		transitions = *lease.Spec.LeaseTransitions + 1
	}
	lease.Spec.HolderIdentity = &identity
	lease.Spec.AcquireTime = &now
	lease.Spec.RenewTime = &now
	lease.Spec.LeaseTransitions = &transitions
}

// checkFenced returns porcupine's verdict on h as a fenced register, and
// logs it.
func checkFenced(t *testing.T, h *history.History) porcupine.CheckResult {
	t.Helper()
	res := h.Check(history.FencedRegister, time.Minute)
	ops, unknown := h.Len()
	t.Logf("history: %d operations, %d of unknown outcome: %s", ops, unknown, res)
	return res
}
