package shard

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/fencer-dev/fencer/internal/rendezvous"
	"github.com/fencer-dev/fencer/kubeadapter"
	"github.com/fencer-dev/fencer/kubeadapter/internal/leaserecord"
	"github.com/fencer-dev/fencer/token"
)

// These tests drive Sharder passes (step) by hand on a fake clock over
// the fake Lease store of elector_unit_test.go. They pin down decisions
// whose naive versions are wrong; behaviour on a real API server is in
// sharder_kube_test.go.

const unitRing = "r"

// trackerRing serves a Sharder its ring from the fake store, as a Watcher
// that has seen every write would. frozen, when set, is served instead:
// a Watcher that lags.
type trackerRing struct {
	f      *fakeLeases
	mu     sync.Mutex
	frozen []*coordinationv1.Lease
}

func (r *trackerRing) current() []*coordinationv1.Lease {
	r.f.Mu.Lock()
	defer r.f.Mu.Unlock()
	objs, err := r.f.Tracker().List(leasesGVR, coordinationv1.SchemeGroupVersion.WithKind("Lease"), "ns")
	if err != nil {
		panic(err)
	}
	var out []*coordinationv1.Lease
	for i := range objs.(*coordinationv1.LeaseList).Items {
		l := objs.(*coordinationv1.LeaseList).Items[i]
		if l.Labels[RingLabel] == unitRing {
			out = append(out, &l)
		}
	}
	return out
}

func (r *trackerRing) Labelled(string, string, string) ([]*coordinationv1.Lease, int64, bool) {
	r.mu.Lock()
	frozen := r.frozen
	r.mu.Unlock()
	if frozen != nil {
		return frozen, 0, true
	}
	return r.current(), 0, true
}

// freeze makes the ring serve what the store holds now until thaw.
func (r *trackerRing) freeze() {
	cur := r.current()
	r.mu.Lock()
	r.frozen = cur
	r.mu.Unlock()
}

func (r *trackerRing) thaw() {
	r.mu.Lock()
	r.frozen = nil
	r.mu.Unlock()
}

func (r *trackerRing) Subscribe() (<-chan struct{}, func()) { return nil, func() {} }

// put stores l as another process would write it, with a new
// resourceVersion, and returns the stored copy.
func (f *fakeLeases) put(t *testing.T, l *coordinationv1.Lease) *coordinationv1.Lease {
	t.Helper()
	f.Mu.Lock()
	defer f.Mu.Unlock()
	l = l.DeepCopy()
	f.RV++
	l.ResourceVersion = strconv.FormatInt(f.RV, 10)
	if l.UID == "" {
		l.UID = types.UID("uid-" + l.Name)
	}
	if _, err := f.Tracker().Get(leasesGVR, l.Namespace, l.Name); apierrors.IsNotFound(err) {
		require.NoError(t, f.Tracker().Create(leasesGVR, l, l.Namespace))
	} else {
		require.NoError(t, f.Tracker().Update(leasesGVR, l, l.Namespace))
	}
	return l
}

func (f *fakeLeases) lease(t *testing.T, name string) *coordinationv1.Lease {
	t.Helper()
	l, err := f.CoordinationV1().Leases("ns").Get(context.Background(), name, metav1.GetOptions{})
	require.NoError(t, err)
	return l
}

// unitSharder is a Sharder on the fake store whose heartbeat is acquired
// and whose passes the test makes. Its own heartbeat's deadline is long,
// so that stepping the clock by another member's lease duration does
// not end it.
type unitSharder struct {
	*Sharder
	t      *testing.T
	member *kubeadapter.Held
	reg    *prometheus.Registry
	ring   *trackerRing
}

func newUnitSharder(t *testing.T, f *fakeLeases, clk *clocktesting.FakeClock, identity string) *unitSharder {
	t.Helper()
	reg := prometheus.NewRegistry()
	w, err := kubeadapter.NewWatcher(f.CoordinationV1(), kubeadapter.WithRegisterer(reg))
	require.NoError(t, err)
	m, err := NewMetrics(reg)
	require.NoError(t, err)
	cfg := Config{
		Namespace: "ns", Ring: unitRing, Identity: identity,
		LeaseDuration: 60 * time.Second, RenewDeadline: 50 * time.Second, RetryPeriod: 20 * time.Second,
		HandoffTimeout: 3 * time.Second, MovesPerSecond: 1000, Watcher: w, Metrics: m, Clock: clk,
	}
	require.NoError(t, cfg.Validate())
	ring := &trackerRing{f: f}
	s, err := newSharder(f.CoordinationV1(), cfg, ring)
	require.NoError(t, err)
	member, err := s.join(context.Background())
	require.NoError(t, err)
	t.Cleanup(func() {
		s.endAll(kubeadapter.ErrReleased)
		_ = member.Release(context.Background())
	})
	return &unitSharder{Sharder: s, t: t, member: member, reg: reg, ring: ring}
}

func (u *unitSharder) step() { u.Sharder.step(context.Background(), u.member) }

// writes returns the Lease writes of kind the Watcher's metrics counted.
func (u *unitSharder) writes(kind string) float64 {
	u.t.Helper()
	mfs, err := u.reg.Gather()
	require.NoError(u.t, err)
	for _, mf := range mfs {
		if mf.GetName() != kubeadapter.MetricLeaseWrites {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "kind" && l.GetValue() == kind {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// otherMember is the heartbeat Lease of a member that is not under test,
// renewed (as far as its renewTime says) at renew.
func otherMember(identity, holder string, renew time.Time) *coordinationv1.Lease {
	d, n := int32(10), int32(0)
	t := metav1.NewMicroTime(renew)
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: memberLeaseName(unitRing, identity), Labels: leaserecord.FenceLabels(nil, ringLabels(unitRing, RoleMember))},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &d, LeaseTransitions: &n, AcquireTime: &t, RenewTime: &t},
	}
}

// shardOwnedBy returns a shard name whose rendezvous owner among ids is
// want.
func shardOwnedBy(t *testing.T, want string, ids ...string) string {
	t.Helper()
	ms := make([]rendezvous.Member, len(ids))
	for i, id := range ids {
		ms[i] = rendezvous.Member{Name: id, Weight: 1}
	}
	for i := range 1000 {
		shard := fmt.Sprintf("project-%d", i)
		if o, _ := rendezvous.Owner(shard, ms); o == want {
			return shard
		}
	}
	t.Fatalf("no shard owned by %s", want)
	return ""
}

func newUnitClock() *clocktesting.FakeClock {
	return clocktesting.NewFakeClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
}

// TestOrphanRuleReadsNoClock: whether a shard is orphaned depends only on
// the records, never on a timestamp. Shard Leases are not renewed, so a
// rule that expired them by renewTime+leaseDurationSeconds (the peer's)
// would call every shard orphaned after its first lease duration, and one
// whose renewTime is in the future held however dead its member.
func TestOrphanRuleReadsNoClock(t *testing.T) {
	past := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	future := time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC)
	shardNaming := func(holder, member string, renew time.Time) *coordinationv1.Lease {
		l := assigned("ns", unitRing, "s", nil, incarnation{holder: holder, lease: member}, time.Second, renew)
		return l
	}
	live := map[string]*coordinationv1.Lease{"r-m-a": otherMember("a", "a_1", past)}
	released := map[string]*coordinationv1.Lease{"r-m-a": otherMember("a", "", future)}
	reborn := map[string]*coordinationv1.Lease{"r-m-a": otherMember("a", "a_2", future)}
	for _, tc := range []struct {
		name    string
		shard   *coordinationv1.Lease
		members map[string]*coordinationv1.Lease
		want    bool
	}{
		{"held, renewTime decades old", shardNaming("a_1", "r-m-a", past), live, false},
		{"member released, renewTime in the future", shardNaming("a_1", "r-m-a", future), released, true},
		{"member is a newer incarnation", shardNaming("a_1", "r-m-a", future), reborn, true},
		{"member Lease missing", shardNaming("a_1", "r-m-a", future), map[string]*coordinationv1.Lease{}, true},
		{"no holder", shardNaming("", "", future), live, true},
		{"names another member's Lease", shardNaming("a_1", "r-m-b", future), live, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, orphaned(tc.shard, tc.members))
		})
	}
}

// TestFutureRenewTimeIgnored: a member whose heartbeat claims a renewTime
// an hour ahead, but whose resourceVersion has not changed for its
// leaseDurationSeconds on the survivor's clock, is declared dead, and its
// shard taken over with a greater token. Not one second earlier.
func TestFutureRenewTimeIgnored(t *testing.T) {
	clk := newUnitClock()
	f := newFakeLeases(t)
	a := newUnitSharder(t, f, clk, "a")
	shard := shardOwnedBy(t, "b", "a", "b")
	f.put(t, otherMember("b", "b_1", clk.Now().Add(time.Hour)))
	old := f.put(t, assigned("ns", unitRing, shard, nil, incarnation{identity: "b", holder: "b_1", lease: "r-m-b"}, 10*time.Second, clk.Now()))
	oldTok, err := kubeadapter.TokenOf(old)
	require.NoError(t, err)
	a.Track(shard)

	a.step()
	clk.Step(10*time.Second - time.Millisecond)
	a.step()
	require.Equal(t, "b_1", leaserecord.Holder(&f.lease(t, "r-m-b").Spec), "declared dead before its lease duration")
	_, owns := a.Owns(shard)
	require.False(t, owns)

	clk.Step(time.Millisecond)
	a.step()
	require.Empty(t, leaserecord.Holder(&f.lease(t, "r-m-b").Spec), "a renewTime in the future kept a dead member alive")
	require.Equal(t, 1.0, a.writes(kubeadapter.WriteTombstone))
	tok, owns := a.Owns(shard)
	require.True(t, owns, "the survivor did not take the orphaned shard")
	c, err := tok.Compare(oldTok)
	require.NoError(t, err)
	require.Equal(t, 1, c)
}

// TestTombstoneCASRace: a tombstone is conditional on the exact
// resourceVersion observed unchanged. A survivor whose view lags behind a
// renewal does not kill the live member; two survivors that both find a
// member dead land one tombstone between them.
func TestTombstoneCASRace(t *testing.T) {
	clk := newUnitClock()
	f := newFakeLeases(t)
	a := newUnitSharder(t, f, clk, "a")
	c := newUnitSharder(t, f, clk, "c")
	f.put(t, otherMember("b", "b_1", clk.Now()))

	a.ring.freeze() // a's watch lags from here
	a.step()
	c.step()
	clk.Step(10 * time.Second)
	// b renews; a does not see it.
	f.put(t, f.lease(t, "r-m-b"))
	a.step()
	require.Equal(t, "b_1", leaserecord.Holder(&f.lease(t, "r-m-b").Spec), "a tombstone written over a renewal it had not seen killed a live member")
	require.Equal(t, 0.0, a.writes(kubeadapter.WriteTombstone))

	// Now b stops. Both survivors see the same last renewal.
	a.ring.thaw()
	a.step()
	c.step()
	clk.Step(10 * time.Second)
	a.ring.freeze()
	c.ring.freeze()
	var wg sync.WaitGroup
	wg.Go(a.step)
	wg.Go(c.step)
	wg.Wait()
	require.Empty(t, leaserecord.Holder(&f.lease(t, "r-m-b").Spec))
	require.Equal(t, 1.0, a.writes(kubeadapter.WriteTombstone)+c.writes(kubeadapter.WriteTombstone), "both tombstones landed")
}

// TestHandoffDrainsFirst: a handoff ends the Held at once, then waits
// for in-flight work before the one write that names the new owner; with
// work that never finishes it writes after HandoffTimeout and counts it.
func TestHandoffDrainsFirst(t *testing.T) {
	for _, tc := range []struct {
		name   string
		finish func(clk *clocktesting.FakeClock, h *Held)
		forced float64
	}{
		{"drained", func(_ *clocktesting.FakeClock, h *Held) { h.exit() }, 0},
		{"timeout", func(clk *clocktesting.FakeClock, _ *Held) { clk.Step(3 * time.Second) }, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := newUnitClock()
			f := newFakeLeases(t)
			a := newUnitSharder(t, f, clk, "a")
			shard := shardOwnedBy(t, "d", "a", "d")
			a.Track(shard)
			a.step()
			h, err := a.Shard(shard)
			require.NoError(t, err)
			require.True(t, h.enter(), "a reconcile in flight")
			before := f.lease(t, LeaseName(unitRing, shard))

			f.put(t, otherMember("d", "d_1", clk.Now()))
			done := make(chan struct{})
			go func() { a.step(); close(done) }()
			select {
			case <-h.Done():
			case <-time.After(5 * time.Second):
				t.Fatal("the handoff did not end the Held first")
			}
			require.ErrorIs(t, h.Err(), ErrMoved)
			_, owns := a.Owns(shard)
			require.False(t, owns)
			// The drain's timer is armed beside the heartbeat's two.
			require.Eventually(t, func() bool { return clk.Waiters() == 3 }, 5*time.Second, time.Millisecond)
			require.Equal(t, before.ResourceVersion, f.lease(t, before.Name).ResourceVersion, "the handoff wrote while work was in flight")

			tc.finish(clk, h)
			<-done
			after := f.lease(t, before.Name)
			require.Equal(t, "d_1", leaserecord.Holder(&after.Spec))
			require.Equal(t, "r-m-d", after.Annotations[MemberAnnotation])
			require.Equal(t, leaserecord.Transitions(&before.Spec)+1, leaserecord.Transitions(&after.Spec))
			require.Equal(t, tc.forced, testutil.ToFloat64(a.cfg.Metrics.handoffForced))
			require.Equal(t, 1.0, testutil.ToFloat64(a.cfg.Metrics.moves.WithLabelValues(MoveHandoff)))
		})
	}
}

// TestHandoffWaitsOnlyForItsOwnShard: a pass that hands off two shards
// ends, drains and writes each on its own, so work in flight on one holds
// back only that shard's handoff, and the other is handed to its new
// owner meanwhile. A pass that ended every shard first and drained them
// all before writing would leave both ownerless until the slow one
// drained: at 10,000 shards, seconds for every shard of a rebalance.
func TestHandoffWaitsOnlyForItsOwnShard(t *testing.T) {
	clk := newUnitClock()
	f := newFakeLeases(t)
	a := newUnitSharder(t, f, clk, "a")
	slowShard := shardOwnedBy(t, "d", "a", "d")
	var fastShard string
	ms := []rendezvous.Member{{Name: "a", Weight: 1}, {Name: "d", Weight: 1}}
	for i := 0; fastShard == ""; i++ {
		if sh := fmt.Sprintf("other-%d", i); func() bool { o, _ := rendezvous.Owner(sh, ms); return o == "d" }() {
			fastShard = sh
		}
	}
	a.Track(slowShard, fastShard)
	a.step()
	slow, err := a.Shard(slowShard)
	require.NoError(t, err)
	require.True(t, slow.enter(), "a reconcile in flight on the slow shard")
	slowName, fastName := LeaseName(unitRing, slowShard), LeaseName(unitRing, fastShard)
	before := f.lease(t, slowName)

	f.put(t, otherMember("d", "d_1", clk.Now()))
	done := make(chan struct{})
	go func() { a.step(); close(done) }()
	require.Eventually(t, func() bool { return leaserecord.Holder(&f.lease(t, fastName).Spec) == "d_1" }, 5*time.Second, time.Millisecond,
		"the other shard's handoff waited for the slow shard's work")
	require.ErrorIs(t, slow.Err(), ErrMoved)
	require.Equal(t, before.ResourceVersion, f.lease(t, slowName).ResourceVersion, "the slow shard was handed off while its work was in flight")

	slow.exit()
	<-done
	require.Equal(t, "d_1", leaserecord.Holder(&f.lease(t, slowName).Spec))
	require.Equal(t, 2.0, testutil.ToFloat64(a.cfg.Metrics.moves.WithLabelValues(MoveHandoff)))
}

// TestHandoffConditional: a handoff written from a view that missed a
// newer assignment of the shard is refused by the store and changes
// nothing; an unconditional write would hand another member's shard away.
func TestHandoffConditional(t *testing.T) {
	clk := newUnitClock()
	f := newFakeLeases(t)
	a := newUnitSharder(t, f, clk, "a")
	shard := shardOwnedBy(t, "d", "a", "c", "d")
	a.Track(shard)
	a.step()
	_, owns := a.Owns(shard)
	require.True(t, owns)
	f.put(t, otherMember("d", "d_1", clk.Now()))
	f.put(t, otherMember("c", "c_1", clk.Now()))
	a.ring.freeze()
	name := LeaseName(unitRing, shard)
	taken := f.put(t, assigned("ns", unitRing, shard, f.lease(t, name), incarnation{identity: "c", holder: "c_1", lease: "r-m-c"}, 10*time.Second, clk.Now()))

	a.step()
	cur := f.lease(t, name)
	require.Equal(t, "c_1", leaserecord.Holder(&cur.Spec), "a handoff from a stale view overwrote a newer assignment")
	require.Equal(t, taken.ResourceVersion, cur.ResourceVersion)
	require.Equal(t, 0.0, testutil.ToFloat64(a.cfg.Metrics.moves.WithLabelValues(MoveHandoff)))
}

// TestOwnsFalseAfterMemberLost: when the heartbeat's renewals fail until
// its renew deadline, Owns is false and Shard refuses at that instant,
// before any pass of the Sharder notices, and the Held says why.
func TestOwnsFalseAfterMemberLost(t *testing.T) {
	clk := newUnitClock()
	f := newFakeLeases(t)
	a := newUnitSharder(t, f, clk, "a")
	a.Track("s")
	a.step()
	h, err := a.Shard("s")
	require.NoError(t, err)
	_, owns := a.Owns("s")
	require.True(t, owns)

	f.SetFailing(true)
	clk.Step(a.cfg.RenewDeadline)
	require.ErrorIs(t, a.member.Err(), kubeadapter.ErrRenewDeadline)
	_, owns = a.Owns("s")
	require.False(t, owns, "Owns still true after the member was lost")
	_, err = a.Shard("s")
	require.ErrorIs(t, err, ErrNotOwner)
	require.ErrorIs(t, err, token.ErrNotHeld)
	require.ErrorIs(t, h.Err(), ErrMemberLost)
	require.ErrorIs(t, h.Err(), token.ErrNotHeld)
	f.SetFailing(false)
}

// TestPlanWeights: a member of weight 2 plans the creates of about half
// of the shards among members of weights 1, 1 and 2, and the members'
// plans never overlap: each shard is created by exactly one.
func TestPlanWeights(t *testing.T) {
	live := []incarnation{
		{identity: "a", holder: "a_1", lease: "r-m-a", weight: 1},
		{identity: "b", holder: "b_1", lease: "r-m-b", weight: 1},
		{identity: "c", holder: "c_1", lease: "r-m-c", weight: 2},
	}
	var shards []string
	for i := range 3000 {
		shards = append(shards, fmt.Sprintf("project-%d", i))
	}
	v := ringView{members: map[string]*coordinationv1.Lease{}, shards: map[string]*coordinationv1.Lease{}}
	creates := map[string]int{}
	planned := map[string]int{}
	for _, me := range live {
		for _, mv := range plan(v, shards, live, me) {
			require.Equal(t, MoveCreate, mv.kind)
			creates[me.identity]++
			planned[mv.shard]++
		}
	}
	require.Len(t, planned, len(shards))
	for sh, n := range planned {
		require.Equal(t, 1, n, "shard %s planned by %d members", sh, n)
	}
	t.Logf("creates by weight 1/1/2: %v", creates)
	require.InDelta(t, 0.5, float64(creates["c"])/float64(len(shards)), 0.03)
}

// TestWeightLabel: the heartbeat carries the configured weight, and a
// missing or bad label weighs 1.
func TestWeightLabel(t *testing.T) {
	c := DefaultConfig("ns", "r", "a")
	require.Equal(t, "1", c.memberLabels()[WeightLabel])
	c.Weight = 3
	require.Equal(t, 3.0, weightOf(&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Labels: c.memberLabels()}}))
	for _, bad := range []string{"", "0", "-2", "x", "99999999999"} {
		require.Equal(t, 1.0, weightOf(&coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{WeightLabel: bad}}}), bad)
	}
}

// configCase makes one field of a valid config invalid.
type configCase[C any] struct {
	field  string
	change func(*C)
}

// requireConfigErrors checks that each case's config fails Validate with
// a *kubeadapter.ConfigError naming its field and matching kubeadapter.ErrInvalidConfig, and that
// build (the constructor) refuses it.
func requireConfigErrors[C interface{ Validate() error }](t *testing.T, valid C, build func(C) error, cases []configCase[C]) {
	t.Helper()
	require.NoError(t, valid.Validate())
	for _, tc := range cases {
		t.Run(tc.field, func(t *testing.T) {
			c := valid
			tc.change(&c)
			var ce *kubeadapter.ConfigError
			require.ErrorAs(t, c.Validate(), &ce)
			require.Equal(t, tc.field, ce.Field)
			require.ErrorIs(t, c.Validate(), kubeadapter.ErrInvalidConfig)
			require.ErrorIs(t, build(c), kubeadapter.ErrInvalidConfig)
		})
	}
}

func TestShardConfigValidate(t *testing.T) {
	w, err := kubeadapter.NewWatcher(newFakeLeases(t).CoordinationV1())
	require.NoError(t, err)
	valid := DefaultConfig("ns", "ring", "x-0")
	valid.Watcher = w
	build := func(c Config) error { _, err := NewSharder(newFakeLeases(t).CoordinationV1(), c); return err }
	requireConfigErrors(t, valid, build, []configCase[Config]{
		{"Ring", func(c *Config) { c.Ring = "Not_A_Label" }},
		{"Ring", func(c *Config) { c.Ring = "a-ring-name-that-is-far-too-long-for-shard-leases" }},
		{"Identity", func(c *Config) { c.Identity = "" }},
		{"Identity", func(c *Config) { c.Identity = "Pod_0" }},
		{"Watcher", func(c *Config) { c.Watcher = nil }},
		{"HandoffTimeout", func(c *Config) { c.HandoffTimeout = 0 }},
		{"MovesPerSecond", func(c *Config) { c.MovesPerSecond = 0 }},
		{"RenewDeadline", func(c *Config) { c.RenewDeadline = c.LeaseDuration }},
		{"Namespace", func(c *Config) { c.Namespace = "" }},
	})
}
