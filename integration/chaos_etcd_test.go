package integration_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencer-dev/fencer/etcdstore"
	"github.com/fencer-dev/fencer/internal/etcdproc"
	"github.com/fencer-dev/fencer/internal/etcdtest"
	"github.com/fencer-dev/fencer/internal/faultproxy"
	"github.com/fencer-dev/fencer/internal/history"
	"github.com/fencer-dev/fencer/token"
)

var chaosOps = flag.Int("chaos.ops", 0,
	"run etcd chaos rounds until at least this many operations are recorded, with a broken-guard control round in every four, "+
		"and print the counts (make chaos); 0 runs one round of each fault and one control round")

// The etcd chaos test runs the leased-register history (see
// leasedregister_test.go) on a 3-member etcd cluster whose members are
// separate processes (internal/etcdproc). Three holders compete for one
// lease per round, each through its own etcd client and its own fault
// proxies (one per member), acquiring, writing a register with guarded
// Puts and releasing; a reader reads the register. Each round injects
// one fault while one holder is paused:
//
//   - a holder pause longer than the TTL, in every round: the harness stops
//     the holder just before a write and pauses its network, so its
//     keepalives stop; it waits until another holder has acquired the
//     lease and written with the newer token; then the paused write is
//     released. In the "process" form the write is issued only then (a GC
//     pause between deciding and writing), in the "network" form it was
//     issued before the handover and held in the proxy (a stalled link).
//     Either way the write reaches etcd after the handover, always, so
//     the store must refuse it;
//   - during the pause: the raft leader or a follower killed with SIGKILL
//     (and restarted before the late write), the leader or a follower
//     isolated from its peers (healed before the late write), or the
//     leadership moved with MoveLeader.
//
// The control is the same round with a broken guard: the paused holder's
// late write is a raw etcd Put of the same key and value, without the
// guard's compare. Its write is called after the newer holder's
// acquisition returned, so no linearization can make its token current, and
// the checker must find every control round not linearizable.

const chaosTTL = time.Second

type chaosFault int

const (
	faultNone chaosFault = iota
	faultLeaderKill
	faultFollowerKill
	faultIsolateLeader
	faultIsolateFollower
	faultMoveLeader
)

func (f chaosFault) String() string {
	return [...]string{"none", "leader killed (SIGKILL) and restarted", "follower killed (SIGKILL) and restarted",
		"leader isolated from its peers", "follower isolated from its peers", "leadership moved (MoveLeader)"}[f]
}

// severs reports whether f cuts the paused holder's connections, so that a
// write held in the network would be lost rather than delivered late.
func (f chaosFault) severs() bool { return f == faultLeaderKill || f == faultFollowerKill }

type roundSpec struct {
	fault    chaosFault
	inFlight bool // the late write is held in the network, not in the process
	broken   bool // the control: the late write skips the guard
}

func (s roundSpec) String() string {
	form := "process"
	if s.inFlight {
		form = "network"
	}
	str := fmt.Sprintf("pause (%s) + %s", form, s.fault)
	if s.broken {
		str += ", broken guard"
	}
	return str
}

// TestChaosEtcdFencedRegister runs the etcd chaos rounds and checks each
// round's history against the leased register: every round with the store's
// guard must be linearizable, and every control round must not be.
func TestChaosEtcdFencedRegister(t *testing.T) {
	if !etcdproc.CanIsolate {
		t.Skip("partitioning a member process needs Linux's /proc")
	}
	var specs []roundSpec
	if *chaosOps == 0 {
		specs = []roundSpec{
			{fault: faultLeaderKill},
			{fault: faultFollowerKill},
			{fault: faultIsolateLeader, inFlight: true},
			{fault: faultIsolateFollower},
			{fault: faultMoveLeader, inFlight: true},
			{fault: faultNone, broken: true},
		}
	}
	c := startEtcdChaos(t)
	start := time.Now()
	for i := 0; ; i++ {
		var spec roundSpec
		if *chaosOps == 0 {
			if i == len(specs) {
				break
			}
			spec = specs[i]
		} else {
			if c.ops() >= *chaosOps {
				break
			}
			spec = longRunSpec(i)
		}
		c.round(spec)
	}
	c.stop()
	elapsed := time.Since(start)

	rep := c.check()
	t.Logf("etcd chaos, %s on a 3-member cluster of member processes:\n%s", elapsed.Round(time.Second), rep)
	for _, r := range c.rounds {
		if r.spec.broken {
			require.Equal(t, porcupine.Illegal, r.verdict,
				"round %d (%s): the checker did not catch the unguarded late write", r.n, r.spec)
		} else {
			require.Equal(t, porcupine.Ok, r.verdict,
				"round %d (%s) is not linearizable as a leased register%s", r.n, r.spec, r.viz)
		}
		if !r.spec.broken {
			require.Equal(t, 1, r.late.refused, "round %d (%s): the late write was not refused as stale", r.n, r.spec)
		}
	}
	require.Positive(t, rep.accepted, "no write was accepted")
}

// longRunSpec is the i-th round of make chaos: the faults in turn, with
// the late write held in the network where the fault leaves the holder's
// connections alone, and the control every fourth round.
func longRunSpec(i int) roundSpec {
	faults := []chaosFault{faultLeaderKill, faultIsolateFollower, faultMoveLeader, faultFollowerKill, faultIsolateLeader, faultNone}
	s := roundSpec{fault: faults[i%len(faults)], broken: i%4 == 3}
	s.inFlight = !s.broken && !s.fault.severs() && (i/len(faults))%2 == 0
	return s
}

type etcdChaos struct {
	t       *testing.T
	ctx     context.Context
	cancel  context.CancelFunc
	cluster *etcdproc.Cluster
	holders []*chaosHolder
	reader  *etcdstore.Store
	pauses  chan *pauseRequest
	cur     atomic.Pointer[chaosRound]
	nextVal atomic.Int64
	wg      sync.WaitGroup

	traffic time.Duration // of normal operation, before and after each pause

	rounds []*chaosRound // written by the test goroutine only
	faults map[string]int
}

type chaosHolder struct {
	id      int
	proxies []*faultproxy.Proxy // one per member
	cli     *clientv3.Client
	st      *etcdstore.Store
}

// chaosRound is one lease, one register key and one history.
type chaosRound struct {
	n    int
	spec roundSpec
	name string // the lease name and the register's key
	h    *history.History
	ctx  context.Context // ends with the round: holders leave its lease
	end  context.CancelFunc

	mu      sync.Mutex
	changed chan struct{} // closed when newest changes
	newest  leaseTok      // the greatest token with an accepted write

	late  struct{ refused, landed, unknown int }
	pause time.Duration // how long the late writer was paused
	// after check:
	verdict porcupine.CheckResult
	viz     string
}

// pauseRequest asks the next holder about to write in round to stop
// before the write until proceed is closed.
type pauseRequest struct {
	round   *chaosRound
	paused  chan pausedHolder
	proceed chan struct{}
	done    chan writeOutcome
}

type pausedHolder struct {
	h   *chaosHolder
	tok token.Token
}

type writeOutcome int

const (
	writeOK writeOutcome = iota
	writeStale
	writeUnknown
)

func (o writeOutcome) String() string {
	return [...]string{"accepted", "refused as stale", "unknown outcome"}[o]
}

func startEtcdChaos(t *testing.T) *etcdChaos {
	cluster := etcdproc.Start(t, 3)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	c := &etcdChaos{t: t, ctx: ctx, cancel: cancel, cluster: cluster, pauses: make(chan *pauseRequest, 1), faults: map[string]int{}}
	c.traffic = 300 * time.Millisecond
	if *chaosOps > 0 {
		c.traffic = time.Second
	}
	for id := 1; id <= 3; id++ {
		h := &chaosHolder{id: id}
		var eps []string
		for i := range cluster.Len() {
			p := faultproxy.New(t, cluster.ClientAddr(i))
			h.proxies = append(h.proxies, p)
			eps = append(eps, p.Endpoint())
		}
		h.cli = etcdtest.Client(t, eps...)
		h.st = newEtcdStore(t, h.cli)
		c.holders = append(c.holders, h)
	}
	c.reader = newEtcdStore(t, etcdtest.Client(t, cluster.Endpoints()...))
	c.newRound(roundSpec{}, false) // warm-up, never checked
	for _, h := range c.holders {
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			c.runHolder(h)
		}()
	}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		c.runReader()
	}()
	t.Cleanup(c.stop) // also when the test fails early
	return c
}

func newEtcdStore(t *testing.T, cli *clientv3.Client) *etcdstore.Store {
	t.Helper()
	st, err := etcdstore.New(cli, etcdstore.WithPrefix("/chaos/"))
	require.NoError(t, err)
	return st
}

// newRound makes a new round current and ends the previous one. Only
// checked rounds are kept for the check.
func (c *etcdChaos) newRound(spec roundSpec, checked bool) *chaosRound {
	r := &chaosRound{n: len(c.rounds), spec: spec, h: history.New(time.Now()), changed: make(chan struct{})}
	if checked {
		r.n++
		c.rounds = append(c.rounds, r)
	}
	r.name = fmt.Sprintf("register-%d", r.n)
	r.ctx, r.end = context.WithCancel(c.ctx)
	if prev := c.cur.Swap(r); prev != nil {
		prev.end()
	}
	return r
}

// round runs one round: traffic, a holder paused with a fault injected
// while it is, its late write, and traffic again.
func (c *etcdChaos) round(spec roundSpec) {
	t := c.t
	r := c.newRound(spec, true)
	sleepCtx(c.ctx, c.traffic)

	req := &pauseRequest{round: r, paused: make(chan pausedHolder, 1), proceed: make(chan struct{}), done: make(chan writeOutcome, 1)}
	c.pauses <- req
	var victim pausedHolder
	select {
	case victim = <-req.paused:
	case <-time.After(time.Minute):
		t.Fatalf("round %d (%s): no holder reached a write within a minute", r.n, spec)
	}
	for _, p := range victim.h.proxies {
		p.Pause()
	}
	paused := time.Now()
	if spec.inFlight {
		close(req.proceed) // the write leaves now and waits in the proxies
	}
	c.count(fmt.Sprintf("holder paused past its %s TTL, late write held in the %s", chaosTTL, map[bool]string{false: "process", true: "network"}[spec.inFlight]))
	heal := c.inject(r, spec.fault, victim.h)
	if err := r.waitNewer(victim.tok, 2*time.Minute); err != nil {
		t.Fatalf("round %d (%s): %v", r.n, spec, err)
	}
	handover := time.Since(paused)
	// Etcd may have expired the lease before the TTL had passed since the
	// pause (the last keepalive was earlier); the pause still lasts longer.
	sleepCtx(c.ctx, time.Until(paused.Add(chaosTTL+chaosTTL/2)))
	heal()
	for _, p := range victim.h.proxies {
		p.Resume()
	}
	r.pause = time.Since(paused)
	if !spec.inFlight {
		close(req.proceed) // the write leaves only now
	}
	var res writeOutcome
	select {
	case res = <-req.done:
	case <-time.After(2 * time.Minute):
		t.Fatalf("round %d (%s): the late write did not return", r.n, spec)
	}
	switch res {
	case writeStale:
		r.late.refused++
	case writeOK:
		r.late.landed++
	default:
		r.late.unknown++
	}
	if *chaosOps == 0 {
		t.Logf("round %d (%s): holder h%d paused %s, handover after %s, late write with %s: %s",
			r.n, spec, victim.h.id, r.pause.Round(time.Millisecond), handover.Round(time.Millisecond), victim.tok, res)
	}
	sleepCtx(c.ctx, c.traffic)
}

// inject starts fault f and returns the function that ends it.
func (c *etcdChaos) inject(r *chaosRound, f chaosFault, victim *chaosHolder) (heal func()) {
	t := c.t
	ctx, cancel := context.WithTimeout(c.ctx, 2*time.Minute)
	defer cancel()
	if f == faultNone {
		return func() {}
	}
	leader, err := c.cluster.Leader(ctx)
	require.NoError(t, err)
	follower := (leader + 1 + rand.IntN(c.cluster.Len()-1)) % c.cluster.Len()
	c.count(f.String())
	switch f {
	case faultLeaderKill, faultFollowerKill:
		i := leader
		if f == faultFollowerKill {
			i = follower
		}
		c.cluster.Kill(i)
		return func() {
			ctx, cancel := context.WithTimeout(c.ctx, 2*time.Minute)
			defer cancel()
			require.NoError(t, c.cluster.Restart(ctx, i), "round %d: restart member %s", r.n, c.cluster.Name(i))
		}
	case faultIsolateLeader, faultIsolateFollower:
		i := leader
		if f == faultIsolateFollower {
			i = follower
		}
		// The member is cut off from its peers, and from the client of one
		// of the two holders that are not paused: the other stays on the
		// member's side of the partition. The paused holder's connections
		// are left alone, so that a write it has in flight is delivered
		// late rather than lost.
		c.cluster.Isolate(i)
		var others []*chaosHolder
		for _, h := range c.holders {
			if h != victim {
				others = append(others, h)
			}
		}
		others[rand.IntN(len(others))].proxies[i].Isolate()
		return func() {
			c.cluster.Heal()
			for _, h := range c.holders {
				h.proxies[i].Heal()
			}
		}
	case faultMoveLeader:
		// etcd refuses a transfer to a member that is behind, or while
		// another is under way; try again.
		var err error
		for range 5 {
			if err = c.cluster.MoveLeader(ctx, follower); err == nil {
				break
			}
			sleepCtx(ctx, 200*time.Millisecond)
		}
		require.NoError(t, err)
	}
	return func() {}
}

func (c *etcdChaos) count(fault string) { c.faults[fault]++ }

// ops returns the number of operations recorded so far.
func (c *etcdChaos) ops() int {
	n := 0
	for _, r := range c.rounds {
		if r != nil {
			ops, _ := r.h.Len()
			n += ops
		}
	}
	return n
}

// stop ends the last round and waits for the holders and the reader.
func (c *etcdChaos) stop() {
	c.cancel()
	c.wg.Wait()
}

// wrote notes an accepted write with tok.
func (r *chaosRound) wrote(tok token.Token) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if tok.Revision > r.newest.rev {
		r.newest = leaseTokOf(tok)
		close(r.changed)
		r.changed = make(chan struct{})
	}
}

// waitNewer waits until a token newer than tok has an accepted write: the
// lease has passed to another acquisition, which has used it.
func (r *chaosRound) waitNewer(tok token.Token, d time.Duration) error {
	deadline := time.After(d)
	for {
		r.mu.Lock()
		newer, changed := r.newest.rev > tok.Revision, r.changed
		r.mu.Unlock()
		if newer {
			return nil
		}
		select {
		case <-changed:
		case <-deadline:
			return fmt.Errorf("no write with a token newer than %s within %s", tok, d)
		}
	}
}

func leaseTokOf(tok token.Token) leaseTok { return leaseTok{rev: tok.Revision, epoch: tok.Epoch} }

// runHolder acquires the current round's lease, writes it a few times and
// releases it, until the test ends.
func (c *etcdChaos) runHolder(h *chaosHolder) {
	var sess *etcdstore.Session
	closeSession := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_ = sess.Close(ctx)
		sess = nil
	}
	defer func() {
		if sess != nil {
			closeSession()
		}
	}()
	for c.ctx.Err() == nil {
		r := c.cur.Load()
		if sess != nil && sess.Err() != nil {
			closeSession()
		}
		if sess == nil {
			ctx, cancel := context.WithTimeout(c.ctx, 5*time.Second)
			s, err := h.st.NewSession(ctx, etcdstore.WithTTL(chaosTTL), etcdstore.WithHolder("h"+strconv.Itoa(h.id)))
			cancel()
			if err != nil {
				sleepCtx(c.ctx, 50*time.Millisecond)
				continue
			}
			sess = s
		}
		l, definite := c.acquire(r, h, sess)
		if l == nil {
			if !definite {
				// It may hold the lease unknowingly: revoke the session.
				closeSession()
			}
			continue
		}
		c.writeSome(r, h, l)
		ctx, cancel := context.WithTimeout(c.ctx, 3*time.Second)
		call := r.h.Now()
		err := l.Release(ctx)
		cancel()
		r.h.Record(h.id, leaseInput{kind: opRelease, tok: leaseTokOf(l.Token())}, call, leaseOutput{ok: err == nil, unknown: err != nil}, err != nil)
		if err != nil {
			closeSession()
		}
	}
}

// acquire acquires round r's lease. When it returns no lease, definite
// reports that no acquisition can have happened.
func (c *etcdChaos) acquire(r *chaosRound, h *chaosHolder, sess *etcdstore.Session) (l *etcdstore.Lease, definite bool) {
	// Not r.ctx: an acquisition cut short at the end of the round would
	// be of unknown outcome, and cost the holder its session.
	ctx, cancel := context.WithTimeout(c.ctx, 10*time.Second)
	defer cancel()
	call := r.h.Now()
	l, err := sess.Acquire(ctx, r.name)
	switch {
	case err == nil:
		r.h.Record(h.id, leaseInput{kind: opAcquire}, call, leaseOutput{ok: true, tok: leaseTokOf(l.Token())}, false)
		return l, true
	case errors.Is(err, etcdstore.ErrAlreadyHeld):
		return nil, false
	case errors.Is(err, etcdstore.ErrSessionExpired), errors.Is(err, etcdstore.ErrSessionClosed):
		// Whatever it acquired ended with the session.
		r.h.Record(h.id, leaseInput{kind: opAcquire}, call, leaseOutput{unknown: true}, true)
		return nil, true
	default:
		// A timeout, or the session ending, can hide an acquisition that
		// committed.
		r.h.Record(h.id, leaseInput{kind: opAcquire}, call, leaseOutput{unknown: true}, true)
		return nil, false
	}
}

// writeSome writes round r's register a few times with l's token, or
// until a write is not accepted. A write that finds a pause request of
// this round pending is the paused holder's late write.
func (c *etcdChaos) writeSome(r *chaosRound, h *chaosHolder, l *etcdstore.Lease) {
	tok := l.Token()
	for i, n := 0, 3+rand.IntN(10); i < n && r.ctx.Err() == nil; i++ {
		var res writeOutcome
		select {
		case req := <-c.pauses:
			if req.round != r {
				c.pauses <- req // for a holder of the round it is meant for
				res, _ = c.write(r, h, tok, false, 5*time.Second)
				break
			}
			req.paused <- pausedHolder{h: h, tok: tok}
			select {
			case <-req.proceed:
			case <-c.ctx.Done():
				return
			}
			res = c.lateWrite(r, h, tok)
			req.done <- res
		default:
			res, _ = c.write(r, h, tok, false, 5*time.Second)
		}
		if res != writeOK {
			return
		}
		sleepCtx(r.ctx, time.Duration(5+rand.IntN(15))*time.Millisecond)
	}
}

// lateWrite is the paused holder's late write with tok. An attempt of
// unknown outcome (the member its connection used was killed under it)
// is made again, as a caller that retries would, so that the round has a
// definite late write: up to lateAttempts attempts, each recorded.
func (c *etcdChaos) lateWrite(r *chaosRound, h *chaosHolder, tok token.Token) writeOutcome {
	const lateAttempts = 5
	res, err := c.write(r, h, tok, r.spec.broken, 2*time.Minute) // the first may wait in the proxies
	for i := 1; res == writeUnknown && i < lateAttempts && c.ctx.Err() == nil; i++ {
		c.t.Logf("round %d: late write attempt %d of unknown outcome, sent again: %v", r.n, i, err)
		res, err = c.write(r, h, tok, r.spec.broken, 10*time.Second)
	}
	return res
}

// write writes a new value to round r's register with tok, guarded by the
// store, or with a raw etcd Put of the same key and value if unguarded,
// and returns its outcome and error.
func (c *etcdChaos) write(r *chaosRound, h *chaosHolder, tok token.Token, unguarded bool, timeout time.Duration) (writeOutcome, error) {
	val := int(c.nextVal.Add(1))
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	call := r.h.Now()
	var err error
	if unguarded {
		_, err = h.cli.Put(ctx, h.st.DataKey(r.name), strconv.Itoa(val))
	} else {
		_, err = h.st.Put(ctx, tok, r.name, []byte(strconv.Itoa(val)))
	}
	var out leaseOutput
	res := writeUnknown
	switch {
	case err == nil:
		out.ok, res = true, writeOK
		r.wrote(tok)
	case errors.Is(err, token.ErrStale):
		res = writeStale
	default:
		out.unknown = true
	}
	r.h.Record(h.id, leaseInput{kind: opWrite, tok: leaseTokOf(tok), val: val}, call, out, out.unknown)
	return res, err
}

// runReader reads the current round's register until the test ends. A
// read that fails has no effect and is not recorded.
func (c *etcdChaos) runReader() {
	for c.ctx.Err() == nil {
		r := c.cur.Load()
		ctx, cancel := context.WithTimeout(c.ctx, 2*time.Second)
		call := r.h.Now()
		v, found, err := c.reader.Get(ctx, r.name)
		cancel()
		if err == nil {
			out := leaseOutput{ok: true}
			if found {
				if out.val, err = strconv.Atoi(string(v.Data)); err != nil {
					c.t.Errorf("register %s holds %q", r.name, v.Data)
				}
			}
			r.h.Record(0, leaseInput{kind: opRead}, call, out, false)
		}
		sleepCtx(c.ctx, 3*time.Millisecond)
	}
}

func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// chaosReport is what make chaos prints.
type chaosReport struct {
	rounds, controls                         int
	ops, unknown                             int
	acquires, writes, reads, releases        int
	accepted, stale                          int
	lateRefused, lateLanded, lateUnknown     int
	violations, controlViolations, undecided int
	minPause, maxPause                       time.Duration
	faults                                   map[string]int
}

// check checks every round's history and counts what happened.
func (c *etcdChaos) check() chaosReport {
	rep := chaosReport{faults: c.faults}
	for _, r := range c.rounds {
		r.verdict = r.h.Check(leasedRegister, 2*time.Minute)
		ops, unknown := r.h.Len()
		rep.ops += ops
		rep.unknown += unknown
		for _, op := range r.h.Ops() {
			in, out := op.Input.(leaseInput), op.Output.(leaseOutput)
			switch in.kind {
			case opAcquire:
				rep.acquires++
			case opRead:
				rep.reads++
			case opRelease:
				rep.releases++
			case opWrite:
				rep.writes++
				switch {
				case out.ok:
					rep.accepted++
				case !out.unknown:
					rep.stale++
				}
			}
		}
		if rep.minPause == 0 || r.pause < rep.minPause {
			rep.minPause = r.pause
		}
		rep.maxPause = max(rep.maxPause, r.pause)
		if r.spec.broken {
			rep.controls++
			if r.verdict == porcupine.Illegal {
				rep.controlViolations++
			}
			continue
		}
		rep.rounds++
		rep.lateRefused += r.late.refused
		rep.lateLanded += r.late.landed
		rep.lateUnknown += r.late.unknown
		switch r.verdict {
		case porcupine.Illegal:
			rep.violations++
			path := filepath.Join(os.TempDir(), fmt.Sprintf("fencer-chaos-round-%d.html", r.n))
			if err := r.h.Visualize(leasedRegister, path); err == nil {
				r.viz = "; see " + path
			}
		case porcupine.Unknown:
			rep.undecided++
		}
	}
	return rep
}

func (rep chaosReport) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "  operations:            %d (%d acquires, %d writes, %d reads, %d releases; %d of unknown outcome)\n",
		rep.ops, rep.acquires, rep.writes, rep.reads, rep.releases, rep.unknown)
	fmt.Fprintf(&b, "  writes:                %d accepted, %d refused as stale\n", rep.accepted, rep.stale)
	fmt.Fprintf(&b, "  faults injected:\n")
	var kinds []string
	for k := range rep.faults {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	for _, k := range kinds {
		fmt.Fprintf(&b, "    %4d  %s\n", rep.faults[k], k)
	}
	fmt.Fprintf(&b, "  holder pauses:         %s to %s (TTL %s)\n", rep.minPause.Round(time.Millisecond), rep.maxPause.Round(time.Millisecond), chaosTTL)
	fmt.Fprintf(&b, "  late writes (guarded): %d refused as stale, %d accepted, %d of unknown outcome\n", rep.lateRefused, rep.lateLanded, rep.lateUnknown)
	fmt.Fprintf(&b, "  violations:            %d of %d rounds (%d undecided)\n", rep.violations, rep.rounds, rep.undecided)
	fmt.Fprintf(&b, "  broken-guard control:  %d of %d rounds with a violation\n", rep.controlViolations, rep.controls)
	return b.String()
}
