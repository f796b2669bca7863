package kubeadapter_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fencer-dev/fencer/kubeadapter"
	"github.com/fencer-dev/fencer/kubeadapter/fenced"
	"github.com/fencer-dev/fencer/kubeadapter/internal/kubetest"
	"github.com/fencer-dev/fencer/kubeadapter/kubefencertest"
	"github.com/fencer-dev/fencer/token"
)

func stallableElector(k *kube, t *testing.T, identity string) (*kubeadapter.Elector, *kubetest.Stallable) {
	t.Helper()
	s := &kubetest.Stallable{LeasesGetter: k.CS.CoordinationV1()}
	e, err := kubeadapter.NewElector(s, k.Fast(identity))
	require.NoError(t, err)
	return e, s
}

func waitEnded(t *testing.T, h *kubeadapter.Held, reason error) {
	t.Helper()
	select {
	case <-h.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("Held did not end")
	}
	require.ErrorIs(t, h.Err(), reason)
	require.ErrorIs(t, h.Err(), token.ErrNotHeld)
}

// TestIncident replays the incident fencer exists for: replica A holds the
// Lease and writes object O, stalls without releasing, B takes over and
// writes O, and A wakes up and writes O again. A's late writes must fail
// in the store, whichever way they arrive, and O must keep B's data.
func TestIncident(t *testing.T) {
	t.Parallel()
	k := newKube(t)
	ctx := t.Context()
	shared.InstallPolicy(t)

	ea, stallA := stallableElector(k, t, "replica-a")
	eb := k.Elector(t, "replica-b")
	ha := acquire(t, ea)
	ca := k.Client(t, ha)
	o := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: k.NS, Name: "o"}, Data: map[string]string{"by": "a"}}
	require.NoError(t, ca.Create(ctx, o))
	aView := o.DeepCopy() // what A holds in memory when it stalls

	stallA.Stalled.Store(true)
	hb := acquire(t, eb)
	require.Error(t, ha.Err(), "A still believed it held the lease when B acquired it")
	require.ErrorIs(t, ha.Err(), kubeadapter.ErrRenewDeadline)
	requireGreater(t, hb.Token(), ha.Token())
	cb := k.Client(t, hb)
	bo := k.ConfigMap(t, "o")
	bo.Data["by"] = "b"
	require.NoError(t, cb.Update(ctx, bo))
	afterB := bo.ResourceVersion

	// A's fenced client knows A lost the lease.
	late := aView.DeepCopy()
	late.Data["by"] = "a-late"
	err := ca.Update(ctx, late)
	require.ErrorIs(t, err, token.ErrNotHeld)

	// A that has not noticed: the local held check is bypassed, so the
	// store decides. A's write is conditional on the version A read, which
	// B's write replaced: the API server rejects it, and the re-read
	// classifies the rejection as stale.
	stale := k.Client(t, staticHolder{Tok: ha.Token()})
	err = stale.Update(ctx, late.DeepCopy())
	var se *token.StaleError
	require.ErrorAs(t, err, &se)
	require.ErrorIs(t, err, token.ErrStale)
	require.Equal(t, hb.Token(), se.Newer)
	require.Equal(t, ha.Token(), se.Token)

	// An unconditional update (no resourceVersion) and a live read are
	// refused before writing.
	uncond := late.DeepCopy()
	uncond.ResourceVersion = ""
	require.ErrorIs(t, stale.Update(ctx, uncond), token.ErrStale)
	require.ErrorIs(t, k.Client(t, staticHolder{Tok: ha.Token()}, fenced.WithLiveRead()).Update(ctx, late.DeepCopy()), token.ErrStale)

	cur := k.ConfigMap(t, "o")
	require.Equal(t, "b", cur.Data["by"])
	require.Equal(t, afterB, cur.ResourceVersion)

	// A writer that skips the library: a raw client-go update of the
	// current version, carrying A's old token, is denied by the API server.
	raw := cur.DeepCopy()
	raw.Annotations = ha.Token().Stamp(raw.Annotations)
	raw.Data["by"] = "a-raw"
	_, err = k.CS.CoreV1().ConfigMaps(k.NS).Update(ctx, raw, metav1.UpdateOptions{})
	require.True(t, apierrors.IsForbidden(err), "raw stale update: %v", err)
	require.Contains(t, err.Error(), "stale fencing token")
	cur = k.ConfigMap(t, "o")
	require.Equal(t, "b", cur.Data["by"])
	require.Equal(t, afterB, cur.ResourceVersion)

	stallA.Stalled.Store(false)
}

// replicaHolder is a replica's view of its lease: the last token it
// acquired, and no local loss detection, so that only the store fences
// it. A replica that never acquired holds nothing.
type replicaHolder struct {
	mu  sync.Mutex
	tok token.Token
}

func (h *replicaHolder) set(t token.Token) { h.mu.Lock(); h.tok = t; h.mu.Unlock() }

func (h *replicaHolder) Token() token.Token { h.mu.Lock(); defer h.mu.Unlock(); return h.tok }

// Context is never done: fenced writes consult Err, and the replica's
// loss is left to the store to find.
func (h *replicaHolder) Context() context.Context { return context.Background() }

func (h *replicaHolder) Err() error {
	if h.Token().IsZero() {
		return token.ErrNotHeld
	}
	return nil
}

var errUpToDate = errors.New("target already up to date")

// TestThreeReplicasOneOwner runs the sharded-controller incident: three
// replicas share one Lease, and every downstream change triggers a
// reconcile on all three. Exactly one write per change lands, also across
// a handover to a new owner while the old one, stalled, keeps reconciling
// with its old token; and the landed writes' tokens never go down.
func TestThreeReplicasOneOwner(t *testing.T) {
	t.Parallel()
	k := newKube(t)
	ctx := t.Context()
	type replica struct {
		name  string
		e     *kubeadapter.Elector
		stall *kubetest.Stallable
		view  *replicaHolder
		c     *fenced.Client
	}
	var rs []*replica
	for _, name := range []string{"r0", "r1", "r2"} {
		e, s := stallableElector(k, t, name)
		view := &replicaHolder{}
		rs = append(rs, &replica{name: name, e: e, stall: s, view: view, c: k.Client(t, view)})
	}
	source := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: k.NS, Name: "source"}, Data: map[string]string{"n": "0"}}
	require.NoError(t, k.CRC.Create(ctx, source))

	reconcile := func(r *replica) (string, error) {
		var src, tgt corev1.ConfigMap
		if err := r.c.Get(ctx, client.ObjectKey{Namespace: k.NS, Name: "source"}, &src); err != nil {
			return "", err
		}
		if err := r.c.Get(ctx, client.ObjectKey{Namespace: k.NS, Name: "target"}, &tgt); err != nil {
			return "", err
		}
		if tgt.Data["n"] == src.Data["n"] {
			return "", errUpToDate
		}
		tgt.Data["n"], tgt.Data["by"] = src.Data["n"], r.name
		err := r.c.Update(ctx, &tgt)
		return tgt.ResourceVersion, err
	}
	type landed struct {
		rv  int64
		tok token.Token
	}
	var history []landed
	change := func(n int, owner *replica) {
		t.Helper()
		source.Data["n"] = strconv.Itoa(n)
		require.NoError(t, k.CRC.Update(ctx, source))
		var wg sync.WaitGroup
		errs := make([]error, len(rs))
		rvs := make([]string, len(rs))
		for i, r := range rs {
			wg.Go(func() { rvs[i], errs[i] = reconcile(r) })
		}
		wg.Wait()
		for i, r := range rs {
			if r == owner {
				require.NoError(t, errs[i], "owner %s", r.name)
				rv, err := strconv.ParseInt(rvs[i], 10, 64)
				require.NoError(t, err)
				history = append(history, landed{rv, r.view.Token()})
				continue
			}
			require.Error(t, errs[i], "non-owner %s wrote change %d", r.name, n)
			if !errors.Is(errs[i], errUpToDate) {
				require.True(t, errors.Is(errs[i], token.ErrNotHeld) || errors.Is(errs[i], token.ErrStale), "%s: %v", r.name, errs[i])
			}
		}
		tgt := k.ConfigMap(t, "target")
		require.Equal(t, strconv.Itoa(n), tgt.Data["n"])
		require.Equal(t, owner.name, tgt.Data["by"])
	}

	h0 := acquire(t, rs[0].e)
	rs[0].view.set(h0.Token())
	require.NoError(t, rs[0].c.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: k.NS, Name: "target"}, Data: map[string]string{"n": "0"}}))
	for n := 1; n <= 5; n++ {
		change(n, rs[0])
	}

	// r0 stalls; r1 takes over and stamps the object it now owns, so that
	// the stalled r0's later writes are fenced.
	rs[0].stall.Stalled.Store(true)
	h1 := acquire(t, rs[1].e)
	requireGreater(t, h1.Token(), h0.Token())
	rs[1].view.set(h1.Token())
	claim := k.ConfigMap(t, "target")
	require.NoError(t, rs[1].c.Update(ctx, claim))
	for n := 6; n <= 10; n++ {
		change(n, rs[1])
	}
	rs[0].stall.Stalled.Store(false)

	for i := 1; i < len(history); i++ {
		require.Greater(t, history[i].rv, history[i-1].rv)
		c, err := history[i].tok.Compare(history[i-1].tok)
		require.NoError(t, err)
		require.GreaterOrEqual(t, c, 0, "an older token landed after a newer one: %v", history)
	}
}

// TestLeaseDeletedAndRecreated checks that deleting the Lease ends its
// holder's token and that the holder of the recreated Lease gets a greater
// token, although leaseTransitions restarts at 0, and fences the old one.
func TestLeaseDeletedAndRecreated(t *testing.T) {
	t.Parallel()
	k := newKube(t)
	ctx := t.Context()
	ea := k.Elector(t, "a")
	first := acquire(t, ea)
	require.NoError(t, first.Release(ctx))
	ha := acquire(t, ea) // leaseTransitions 1
	require.Equal(t, uint64(1), ha.Token().Epoch)
	ca := k.Client(t, ha)
	require.NoError(t, ca.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: k.NS, Name: "o"}, Data: map[string]string{"by": "a"}}))

	require.NoError(t, k.CS.CoordinationV1().Leases(k.NS).Delete(ctx, "fence", metav1.DeleteOptions{}))
	waitEnded(t, ha, kubeadapter.ErrLeaseDeleted)

	hb, err := k.Elector(t, "b").TryAcquire(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = hb.Release(context.Background()) })
	require.Equal(t, uint64(0), hb.Token().Epoch, "a recreated Lease restarts leaseTransitions")
	requireGreater(t, hb.Token(), ha.Token())

	bo := k.ConfigMap(t, "o")
	bo.Data["by"] = "b"
	require.NoError(t, k.Client(t, hb).Update(ctx, bo))

	late := k.ConfigMap(t, "o")
	late.Data["by"] = "a"
	require.ErrorIs(t, ca.Update(ctx, late.DeepCopy()), token.ErrNotHeld)
	require.ErrorIs(t, k.Client(t, staticHolder{Tok: ha.Token()}).Update(ctx, late.DeepCopy()), token.ErrStale)
	require.ErrorIs(t, k.Client(t, staticHolder{Tok: ha.Token()}).Delete(ctx, late.DeepCopy()), token.ErrStale)
	require.Equal(t, "b", k.ConfigMap(t, "o").Data["by"])
}

// TestRestartedProcessSameName checks that a process restarted with the
// same configured identity is a new holder: it must wait for the old
// process's lease to expire, and then gets a greater token. Re-acquiring
// with the same identity also yields a greater token and epoch.
func TestRestartedProcessSameName(t *testing.T) {
	t.Parallel()
	k := newKube(t)
	ctx := t.Context()
	e1, stall := stallableElector(k, t, "pod-a")
	h1 := acquire(t, e1)
	c1 := k.Client(t, staticHolder{Tok: h1.Token()})
	require.NoError(t, c1.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: k.NS, Name: "o"}}))

	stall.Stalled.Store(true) // the process dies without releasing
	e2 := k.Elector(t, "pod-a")
	require.NotEqual(t, e1.Identity(), e2.Identity())
	_, err := e2.TryAcquire(ctx)
	var he *token.HeldError
	require.ErrorAs(t, err, &he)
	require.Equal(t, e1.Identity(), he.Holder)

	h2 := acquire(t, e2)
	requireGreater(t, h2.Token(), h1.Token())
	require.Equal(t, h1.Token().Epoch+1, h2.Token().Epoch)
	require.Error(t, h1.Err())
	o := k.ConfigMap(t, "o")
	require.NoError(t, k.Client(t, h2).Update(ctx, o))
	require.ErrorIs(t, c1.Update(ctx, o.DeepCopy()), token.ErrStale)
	stall.Stalled.Store(false)

	require.NoError(t, h2.Release(ctx))
	h3, err := e2.TryAcquire(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = h3.Release(context.Background()) })
	requireGreater(t, h3.Token(), h2.Token())
	require.Equal(t, h2.Token().Epoch+1, h3.Token().Epoch, "re-acquisition by the same identity counts as a transition")
}

// TestBadInput checks that objects whose fencer annotations are malformed,
// partial or another lease's are refused with typed errors and not
// written, and that WithTakeover takes over another lease's object but
// never a malformed one. It runs on an API server of its own, without
// the admission policy, which would refuse to store such stamps at all.
func TestBadInput(t *testing.T) {
	t.Parallel()
	k := kubetest.NewKube(t, kubefencertest.APIServerForTest(t))
	ctx := t.Context()
	tok := k.Tokens(t, 1)[0]
	c := k.Client(t, staticHolder{Tok: tok})
	takeover := k.Client(t, staticHolder{Tok: tok}, fenced.WithTakeover())
	for _, tc := range []struct {
		name         string
		annotations  map[string]string
		want         error
		takeoverWant error
	}{
		{"malformed token", map[string]string{token.AnnotationLease: tok.Lease, token.AnnotationToken: "12abc"}, token.ErrMalformed, token.ErrMalformed},
		{"token without lease", map[string]string{token.AnnotationToken: "5"}, token.ErrMalformed, token.ErrMalformed},
		{"malformed lease", map[string]string{token.AnnotationLease: "a b", token.AnnotationToken: "5"}, token.ErrMalformed, token.ErrMalformed},
		{"another lease", token.Token{Lease: k.NS + "/other", Revision: 1 << 40}.Stamp(nil), token.ErrForeignLease, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := "o-" + strconv.Itoa(int(time.Now().UnixNano()%1e6))
			created, err := k.CS.CoreV1().ConfigMaps(k.NS).Create(ctx, &corev1.ConfigMap{
				ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: tc.annotations}, Data: map[string]string{"v": "0"},
			}, metav1.CreateOptions{})
			require.NoError(t, err)
			rv := created.ResourceVersion

			obj := k.ConfigMap(t, name)
			obj.Data["v"] = "1"
			require.ErrorIs(t, c.Update(ctx, obj.DeepCopy()), tc.want, "update")
			require.ErrorIs(t, c.Patch(ctx, obj.DeepCopy(), client.MergeFrom(k.ConfigMap(t, name))), tc.want, "patch")
			require.ErrorIs(t, c.Delete(ctx, obj.DeepCopy()), tc.want, "delete")
			fresh := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: k.NS, Name: name + "-copy", Annotations: tc.annotations}}
			require.ErrorIs(t, c.Create(ctx, fresh), tc.want, "create")
			require.Equal(t, tc.annotations, fresh.Annotations, "annotations not restored")
			require.Equal(t, rv, k.ConfigMap(t, name).ResourceVersion, "object written")
			var gone corev1.ConfigMap
			require.True(t, apierrors.IsNotFound(k.CRC.Get(ctx, client.ObjectKeyFromObject(fresh), &gone)))

			err = takeover.Update(ctx, obj.DeepCopy())
			if tc.takeoverWant != nil {
				require.ErrorIs(t, err, tc.takeoverWant)
				require.Equal(t, rv, k.ConfigMap(t, name).ResourceVersion, "object written")
				return
			}
			require.NoError(t, err)
			got, ok, err := token.FromAnnotations(k.ConfigMap(t, name).Annotations)
			require.NoError(t, err)
			require.True(t, ok)
			require.Equal(t, tok, got)
		})
	}
}
