package integration_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencer-dev/fencer/etcdstore"
	"github.com/fencer-dev/fencer/fencertest"
	"github.com/fencer-dev/fencer/internal/freeport"
	"github.com/fencer-dev/fencer/internal/mutant"
	"github.com/fencer-dev/fencer/internal/testkit/etcdproc"
	"github.com/fencer-dev/fencer/internal/testkit/faultproxy"
	"github.com/fencer-dev/fencer/internal/testkit/history"
	"github.com/fencer-dev/fencer/token"
)

var (
	chaosWrites = flag.Int("chaos.writes", 0,
		"run etcd chaos rounds until at least this many writes, and -chaos.late late writes, are recorded, "+
			"with a broken-guard control round in every six (make chaos); 0 runs the bounded version: each fault once, about 2,000 writes")
	chaosLate = flag.Int("chaos.late", 1000, "with -chaos.writes, run until at least this many late writes are recorded as well")
)

// The etcd chaos test runs the leased-register history (see
// leasedregister_test.go) on a 3-member etcd cluster whose members are
// separate processes (internal/testkit/etcdproc). Five holders, each a separate
// process (chaosholder_test.go), compete for one lease per round and write
// its register as fast as they can: three through etcdstore, each over its
// own fault proxy per member, and two through the Go client, each to its
// own fencer serve replica (the built binary, on the same cluster). A
// reader in the test process reads the register. Every operation is
// recorded, timed on the wall clock, and each round's history is checked
// with porcupine.
//
// The history is mostly writes, and many of them are late: a holder does
// not watch its lease, and goes on writing with its token after it was
// superseded, until the store has refused it a few times. Holders are
// superseded by these faults:
//
//   - takeover, many times a round: the test releases the current holder's
//     token with the store's Release (its token released by another
//     caller) and another holder acquires the lease at once;
//   - once a round, in turn: the holder process stopped with SIGSTOP past
//     its TTL and continued; the holder partitioned from etcd by its fault
//     proxies past its TTL, its writes held in the network and delivered
//     late; the raft leader or a follower killed with SIGKILL and
//     restarted; the leader or a follower isolated from its peers by the
//     peer proxies; the leadership moved with MoveLeader; the fencer serve
//     replica of the current holder killed with SIGKILL while it writes,
//     and restarted.
//
// A write is counted late if its token is older than that of an
// acquisition that returned before the write was called: the history
// itself shows that the lease had passed on when the write was sent. The
// holder's own knowledge is not used.
//
// At every takeover, the test also writes through the store with two
// tokens that must never be accepted: a forged one (the current token's
// revision with the next epoch, a token never issued), and the current
// token of another lease, whose holder has not taken the register's key
// over (TakeOver). The first needs the guard's epoch compare, the second
// the key's owner record.
//
// The control is a round in which the test, after a newer acquisition has
// returned, writes the register with a raw etcd Put recorded as a write
// with the superseded token: an accepted write with a token that is not
// current, which the checker must find not linearizable.
//
// In a build with the fencer_mutants tag, the holders (re-executions of
// the test binary) and the fencer serve replicas (built with the same tag)
// run the mutant FENCER_MUTANT names, and the test fails naming the
// violations it saw.

const (
	chaosTTL       = time.Second     // of the etcdstore holders' sessions
	chaosClientTTL = 2 * time.Second // of the Go client holders' sessions (whole seconds)
	chaosPrefix    = "/chaos/"
	takeoverClient = 99 // the client id of the test's takeovers, forged and foreign writes, and control writes
)

type chaosFault int

const (
	faultSIGSTOP chaosFault = iota
	faultLeaderKill
	faultHolderPartition
	faultFollowerKill
	faultIsolateLeader
	faultServeKill
	faultMoveLeader
	faultIsolateFollower
	numFaults
)

func (f chaosFault) String() string {
	return [...]string{
		"holder process stopped (SIGSTOP) past its TTL, then continued",
		"etcd leader killed (SIGKILL) and restarted",
		"holder partitioned from etcd (fault proxies) past its TTL, writes held in the network",
		"etcd follower killed (SIGKILL) and restarted",
		"etcd leader isolated from its peers (peer proxies)",
		"fencer serve replica killed (SIGKILL) with writes in flight, and restarted",
		"etcd leadership moved (MoveLeader)",
		"etcd follower isolated from its peers (peer proxies)",
	}[f]
}

const (
	faultTakeover = "takeover: the current holder's token released by another caller"
	faultForged   = "forged token written (the current revision, the next epoch)"
	faultForeign  = "another lease's current token written, without TakeOver"
)

// TestChaosEtcdFencedRegister runs the etcd chaos rounds and checks each
// round's history against the leased register: every round must be
// linearizable, and every control round must not be.
func TestChaosEtcdFencedRegister(t *testing.T) {
	if !etcdproc.CanIsolate {
		t.Skip("partitioning a member process needs Linux's /proc")
	}
	// The bounded version: 8 rounds of 260 writes, of which 100 late at
	// least (about 600 are).
	perRound, wantWrites, wantLate := 260, 2000, 100
	if *chaosWrites > 0 {
		perRound, wantWrites, wantLate = 500, *chaosWrites, *chaosLate
	}
	c := startEtcdChaos(t)
	start := time.Now()
	for i := 0; ; i++ {
		if *chaosWrites == 0 {
			if i > int(numFaults) {
				break
			}
		} else if w, late := c.writes(); w >= *chaosWrites && late >= *chaosLate {
			break
		}
		control := i == int(numFaults)
		if *chaosWrites > 0 {
			control = i%6 == 5
		}
		c.round(chaosFault(i%int(numFaults)), control, perRound)
	}
	c.stop()
	elapsed := time.Since(start)

	rep := c.check()
	t.Logf("etcd chaos, %s on a 3-member cluster of member processes, holders as processes:\n%s", elapsed.Round(time.Second), rep)
	var failed []string
	for _, r := range c.rounds {
		switch {
		case r.control && r.verdict != porcupine.Illegal:
			failed = append(failed, fmt.Sprintf("control round %d: the checker did not catch the unguarded write with a superseded token (%s)", r.n, r.verdict))
		case !r.control && r.verdict != porcupine.Ok:
			failed = append(failed, fmt.Sprintf("round %d (%s): %s as a leased register%s", r.n, r.fault, verdictText(r.verdict), r.viz))
		}
	}
	if m := os.Getenv(mutant.Env); mutant.Enabled && m != "" {
		t.Logf("mutant %s: %d violations in %d rounds", m, rep.violations, rep.rounds)
	}
	if len(failed) > 0 {
		t.Fatalf("etcd chaos%s:\n%s", mutantNote(), strings.Join(failed, "\n"))
	}
	require.Positive(t, rep.accepted, "no write was accepted")
	require.Zero(t, rep.lateAccepted, "a late write was accepted")
	require.GreaterOrEqual(t, rep.writes, wantWrites, "too few writes")
	require.GreaterOrEqual(t, rep.late, wantLate, "too few late writes")
	for f := range numFaults {
		require.Positive(t, rep.faults[f.String()], "fault %q never injected", f)
	}
}

func verdictText(v porcupine.CheckResult) string {
	if v == porcupine.Illegal {
		return "VIOLATION: not linearizable"
	}
	return "undecided"
}

// mutantNote names the mutant switched on, if any.
func mutantNote() string {
	if m := os.Getenv(mutant.Env); mutant.Enabled && m != "" {
		return " under mutant " + m
	}
	return ""
}

type etcdChaos struct {
	t       *testing.T
	ctx     context.Context
	cancel  context.CancelFunc
	cluster *etcdproc.Cluster
	admin   *etcdstore.Store // takeovers, forged and foreign writes, and the reader
	foreign *etcdstore.Session
	raw     *clientv3.Client // the control's unguarded Put
	bin     string           // the fencer binary
	holders []*holderProc
	serves  []*serveReplica
	start   time.Time // every round's history clock
	wg      sync.WaitGroup

	mu     sync.Mutex
	byName map[string]*chaosRound
	cur    atomic.Pointer[chaosRound]
	nextV  atomic.Int64

	rounds []*chaosRound // written by the test goroutine only
	faults map[string]int
}

// holderProc is one holder process.
type holderProc struct {
	id      int
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	exited  chan struct{}
	proxies []*faultproxy.Proxy // etcdstore holders: one per member
	serve   *serveReplica       // Go client holders: the replica it calls
	ttl     time.Duration
}

// serveReplica is one fencer serve process on the cluster.
type serveReplica struct {
	addr   string
	args   []string
	log    string
	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
}

// chaosRound is one lease, one register key and one history.
type chaosRound struct {
	n       int
	name    string
	fault   chaosFault
	control bool
	h       *history.History

	mu      sync.Mutex
	changed chan struct{} // closed when newest or writes change
	newest  token.Token   // the greatest token an acquisition returned
	holder  int           // the holder that acquired newest
	writes  int
	landed  bool // a holder's write was accepted: the round's lease owns the key

	foreign token.Token // of the round's other lease, "<name>-foreign"

	verdict porcupine.CheckResult
	viz     string
}

func startEtcdChaos(t *testing.T) *etcdChaos {
	cluster := etcdproc.Start(t, 3)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	c := &etcdChaos{t: t, ctx: ctx, cancel: cancel, cluster: cluster, start: time.Now(), byName: map[string]*chaosRound{}, faults: map[string]int{}}
	c.raw = fencertest.Client(t, cluster.Endpoints()...)
	var err error
	c.admin, err = etcdstore.New(c.raw, etcdstore.WithPrefix(chaosPrefix))
	require.NoError(t, err)
	c.bin = buildFencer(t)
	for range 2 {
		c.serves = append(c.serves, c.startServe())
	}
	exe, err := os.Executable()
	require.NoError(t, err)
	logDir := t.TempDir()
	t.Cleanup(func() {
		if t.Failed() {
			for id := 1; id <= 5; id++ {
				b, _ := os.ReadFile(filepath.Join(logDir, fmt.Sprintf("holder-%d.log", id)))
				t.Logf("holder %d's errors:\n%s", id, b)
			}
		}
	})
	for id := 1; id <= 5; id++ {
		hp := &holderProc{id: id, exited: make(chan struct{})}
		cfg := holderConfig{ID: id, Prefix: chaosPrefix}
		if id <= 3 {
			for i := range cluster.Len() {
				p := faultproxy.New(t, cluster.ClientAddr(i))
				hp.proxies = append(hp.proxies, p)
				cfg.Etcd = append(cfg.Etcd, p.Endpoint())
			}
			cfg.TTL, hp.ttl = chaosTTL, chaosTTL
		} else {
			hp.serve = c.serves[id-4]
			cfg.Serve, cfg.TTL, hp.ttl = hp.serve.addr, chaosClientTTL, chaosClientTTL
		}
		conf, err := json.Marshal(cfg)
		require.NoError(t, err)
		hp.cmd = exec.Command(exe)
		hp.cmd.Env = append(os.Environ(), chaosHolderEnv+"="+string(conf))
		log, err := os.Create(filepath.Join(logDir, fmt.Sprintf("holder-%d.log", id)))
		require.NoError(t, err)
		t.Cleanup(func() { log.Close() })
		hp.cmd.Stderr = log
		hp.cmd.SysProcAttr = childProcAttr()
		hp.stdin, err = hp.cmd.StdinPipe()
		require.NoError(t, err)
		stdout, err := hp.cmd.StdoutPipe()
		require.NoError(t, err)
		require.NoError(t, hp.cmd.Start())
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			c.readHolder(hp, stdout)
			_ = hp.cmd.Wait()
			close(hp.exited)
		}()
		c.holders = append(c.holders, hp)
	}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		c.runReader()
	}()
	t.Cleanup(c.stop) // also when the test fails early
	return c
}

// buildFencer builds the fencer binary for the serve replicas, with the
// fencer_mutants tag if this test binary has it.
func buildFencer(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "fencer")
	args := []string{"build", "-o", bin}
	if mutant.Enabled {
		args = append(args, "-tags", mutant.Tag)
	}
	cmd := exec.Command("go", append(args, "./cmd/fencer")...)
	cmd.Dir = ".."
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	return bin
}

// startServe starts a fencer serve replica on the cluster and waits until
// it serves.
func (c *etcdChaos) startServe() *serveReplica {
	t := c.t
	ports, release, err := freeport.Take(1)
	require.NoError(t, err)
	release()
	s := &serveReplica{addr: "127.0.0.1:" + strconv.Itoa(ports[0]), log: filepath.Join(t.TempDir(), "serve.log")}
	s.args = []string{"serve", "--listen", s.addr, "--metrics-listen", "", "--etcd-endpoints", strings.Join(c.cluster.Endpoints(), ","),
		"--prefix", chaosPrefix, "--shutdown-grace", "1s"}
	require.NoError(t, c.spawnServe(s))
	t.Cleanup(func() { s.kill() })
	return s
}

// spawnServe starts s's process, passing FENCER_MUTANT through, and waits
// until it logs that it serves.
func (c *etcdChaos) spawnServe(s *serveReplica) error {
	log, err := os.OpenFile(s.log, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	defer log.Close()
	cmd := exec.Command(c.bin, s.args...)
	cmd.Env = os.Environ()
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = childProcAttr()
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	s.mu.Lock()
	s.cmd, s.exited = cmd, exited
	s.mu.Unlock()
	deadline := time.After(time.Minute)
	for {
		b, _ := os.ReadFile(s.log)
		if strings.Contains(string(b), `msg="etcd reachable: serving"`) {
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("fencer serve exited: %s", b)
		case <-deadline:
			return fmt.Errorf("fencer serve did not serve within a minute: %s", b)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// kill kills s's process with SIGKILL, if it runs, and waits for it.
func (s *serveReplica) kill() {
	s.mu.Lock()
	cmd, exited := s.cmd, s.exited
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	<-exited
}

// readHolder records the operations holder hp reports.
func (c *etcdChaos) readHolder(hp *holderProc, stdout io.Reader) {
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var op holderOp
		if err := json.Unmarshal(sc.Bytes(), &op); err != nil {
			c.t.Errorf("holder %d reported %q: %v", hp.id, sc.Text(), err)
			continue
		}
		c.mu.Lock()
		r := c.byName[op.Round]
		c.mu.Unlock()
		if r == nil {
			continue
		}
		var tok token.Token
		if op.Tok != "" {
			var err error
			if tok, err = token.Parse(op.Tok); err != nil {
				c.t.Errorf("holder %d reported token %q: %v", hp.id, op.Tok, err)
				continue
			}
		}
		in := leaseInput{kind: op.Kind, tok: leaseTokOf(tok), val: op.Val}
		out := leaseOutput{ok: op.OK, unknown: op.Unknown}
		if op.Kind == opAcquire {
			in.tok, out.tok = leaseTok{}, leaseTokOf(tok)
		}
		r.h.RecordAt(hp.id, in, r.h.At(time.Unix(0, op.Call)), r.h.At(time.Unix(0, op.Ret)), out, op.Unknown)
		r.reported(hp.id, op.Kind, op.OK, tok)
	}
}

// reported notes what a holder reported, for the faults to find the
// current holder.
func (r *chaosRound) reported(id int, kind leaseKind, ok bool, tok token.Token) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case kind == opAcquire && ok && tok.Revision > r.newest.Revision:
		r.newest, r.holder = tok, id
	case kind == opWrite:
		r.writes++
		r.landed = r.landed || ok
	default:
		return
	}
	close(r.changed)
	r.changed = make(chan struct{})
}

// wait waits until cond holds on r's state, for at most d.
func (r *chaosRound) wait(d time.Duration, cond func() bool) bool {
	deadline := time.After(d)
	for {
		r.mu.Lock()
		ok, changed := cond(), r.changed
		r.mu.Unlock()
		if ok {
			return true
		}
		select {
		case <-changed:
		case <-deadline:
			return false
		}
	}
}

// current returns the holder of the newest token and the token.
func (r *chaosRound) current() (int, token.Token) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.holder, r.newest
}

// newRound makes a new round current and tells every holder.
func (c *etcdChaos) newRound(fault chaosFault, control bool) *chaosRound {
	r := &chaosRound{n: len(c.rounds) + 1, fault: fault, control: control, h: history.New(c.start), changed: make(chan struct{})}
	r.name = fmt.Sprintf("register-%d", r.n)
	c.rounds = append(c.rounds, r)
	c.mu.Lock()
	c.byName[r.name] = r
	c.mu.Unlock()
	c.cur.Store(r)
	for _, hp := range c.holders {
		_, _ = fmt.Fprintf(hp.stdin, "round %s\n", r.name)
	}
	return r
}

// round runs one round: writes with takeovers until a third of perRound
// writes, the round's fault (or the control's unguarded write), then
// writes with takeovers again until perRound.
func (c *etcdChaos) round(fault chaosFault, control bool, perRound int) {
	t := c.t
	r := c.newRound(fault, control)
	c.acquireForeign(r)
	c.traffic(r, perRound/3)
	if control {
		c.control(r)
	} else {
		c.inject(r, fault)
	}
	c.traffic(r, perRound)
	if *chaosWrites == 0 {
		w, late := lateWrites(r.h.Ops())
		t.Logf("round %d (%s): %d writes, %d late", r.n, map[bool]string{true: "control", false: fault.String()}[control], w, len(late))
	}
}

// traffic lets the holders write round r until it has n writes, taking
// the lease over from its holder every 100 ms or so.
func (c *etcdChaos) traffic(r *chaosRound, n int) {
	deadline := time.Now().Add(3 * time.Minute)
	for {
		enough := r.wait(time.Duration(60+rand.IntN(80))*time.Millisecond, func() bool { return r.writes >= n })
		if enough || c.ctx.Err() != nil {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("round %d: fewer than %d writes in 3 minutes", r.n, n)
		}
		c.takeover(r)
	}
}

// acquireForeign acquires round r's other lease, whose token writes the
// register without taking it over. A failure leaves the round without
// foreign writes.
func (c *etcdChaos) acquireForeign(r *chaosRound) {
	ctx, cancel := context.WithTimeout(c.ctx, 10*time.Second)
	defer cancel()
	if c.foreign != nil && c.foreign.Err() != nil {
		_ = c.foreign.Close(ctx)
		c.foreign = nil
	}
	if c.foreign == nil {
		s, err := c.admin.NewSession(ctx, etcdstore.WithTTL(10*time.Second), etcdstore.WithHolder("foreign"))
		if err != nil {
			c.t.Logf("round %d: no session for the foreign lease: %v", r.n, err)
			return
		}
		c.foreign = s
		c.t.Cleanup(func() { _ = s.Close(context.Background()) })
	}
	l, err := c.foreign.TryAcquire(ctx, r.name+"-foreign")
	if err != nil {
		c.t.Logf("round %d: foreign lease not acquired: %v", r.n, err)
		return
	}
	r.foreign = l.Token()
}

// takeover writes round r's register with a forged token and with the
// foreign lease's token, each of which the store must refuse, then
// releases the current holder's token with the store's Release, as
// another caller that has the token may; it records all three.
func (c *etcdChaos) takeover(r *chaosRound) {
	_, tok := r.current()
	if tok.Revision == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(c.ctx, 5*time.Second)
	defer cancel()
	forged := tok
	forged.Epoch++
	c.guardedWrite(ctx, r, forged, faultForged)
	r.mu.Lock()
	foreign, landed := r.foreign, r.landed
	r.mu.Unlock()
	if foreign.Revision != 0 && landed {
		c.guardedWrite(ctx, r, foreign, faultForeign)
	}
	call := r.h.At(time.Now())
	ok, err := c.admin.Release(ctx, tok)
	r.h.RecordAt(takeoverClient, leaseInput{kind: opRelease, tok: leaseTokOf(tok)}, call, r.h.At(time.Now()), leaseOutput{ok: ok, unknown: err != nil}, err != nil)
	if ok {
		c.count(faultTakeover)
	}
}

// guardedWrite writes round r's register through the store with tok, and
// records it.
func (c *etcdChaos) guardedWrite(ctx context.Context, r *chaosRound, tok token.Token, kind string) {
	val := int(c.nextV.Add(1))
	call := r.h.At(time.Now())
	_, err := c.admin.Put(ctx, tok, r.name, []byte(strconv.Itoa(val)))
	out := leaseOutput{ok: err == nil}
	switch {
	case err == nil:
		c.t.Logf("round %d: %s: accepted", r.n, kind)
	case errors.Is(err, token.ErrStale), errors.Is(err, token.ErrForeignLease):
	default:
		out.unknown = true
	}
	r.h.RecordAt(takeoverClient, leaseInput{kind: opWrite, tok: leaseTokOf(tok), val: val}, call, r.h.At(time.Now()), out, out.unknown)
	c.count(kind)
}

// supersede waits until the holder of tok has been superseded: a newer
// acquisition has returned, at least pause after since.
func (c *etcdChaos) supersede(r *chaosRound, tok token.Token, since time.Time, pause time.Duration) {
	if !r.wait(time.Minute, func() bool { return r.newest.Revision > tok.Revision }) {
		c.t.Fatalf("round %d (%s): no acquisition newer than %s within a minute", r.n, r.fault, tok)
	}
	sleepCtx(c.ctx, time.Until(since.Add(pause)))
}

// holding waits until a holder that match accepts has acquired the newest
// token, and returns it.
func (c *etcdChaos) holding(r *chaosRound, match func(*holderProc) bool) (*holderProc, token.Token) {
	var hp *holderProc
	var tok token.Token
	ok := r.wait(time.Minute, func() bool {
		if r.holder == 0 || !match(c.holders[r.holder-1]) {
			return false
		}
		hp, tok = c.holders[r.holder-1], r.newest
		return true
	})
	if !ok {
		c.t.Fatalf("round %d (%s): no matching holder acquired the lease within a minute", r.n, r.fault)
	}
	return hp, tok
}

// inject injects fault f in round r and ends it.
func (c *etcdChaos) inject(r *chaosRound, f chaosFault) {
	t := c.t
	ctx, cancel := context.WithTimeout(c.ctx, 2*time.Minute)
	defer cancel()
	anyHolder := func(*holderProc) bool { return true }
	c.count(f.String())
	switch f {
	case faultSIGSTOP:
		hp, tok := c.holding(r, anyHolder)
		require.NoError(t, hp.cmd.Process.Signal(syscall.SIGSTOP))
		stopped := time.Now()
		c.supersede(r, tok, stopped, hp.ttl+hp.ttl/2)
		require.NoError(t, hp.cmd.Process.Signal(syscall.SIGCONT))
	case faultHolderPartition:
		hp, tok := c.holding(r, func(hp *holderProc) bool { return hp.proxies != nil })
		for _, p := range hp.proxies {
			p.Pause()
		}
		c.supersede(r, tok, time.Now(), hp.ttl+hp.ttl/2)
		for _, p := range hp.proxies {
			p.Resume()
		}
	case faultServeKill:
		hp, _ := c.holding(r, func(hp *holderProc) bool { return hp.serve != nil })
		sleepCtx(ctx, 5*time.Millisecond) // into its writes
		hp.serve.kill()
		sleepCtx(ctx, 300*time.Millisecond)
		require.NoError(t, c.spawnServe(hp.serve), "round %d: restart fencer serve", r.n)
	case faultLeaderKill, faultFollowerKill, faultIsolateLeader, faultIsolateFollower, faultMoveLeader:
		leader, err := c.cluster.Leader(ctx)
		require.NoError(t, err)
		i := leader
		if f == faultFollowerKill || f == faultIsolateFollower || f == faultMoveLeader {
			i = (leader + 1 + rand.IntN(c.cluster.Len()-1)) % c.cluster.Len()
		}
		switch f {
		case faultMoveLeader:
			// etcd refuses a transfer to a member that is behind, or
			// while another is under way; try again.
			for range 10 {
				if err = c.cluster.MoveLeader(ctx, i); err == nil {
					break
				}
				sleepCtx(ctx, 200*time.Millisecond)
			}
			require.NoError(t, err)
		case faultIsolateLeader, faultIsolateFollower:
			c.cluster.Isolate(i)
			sleepCtx(ctx, 2*chaosTTL)
			c.cluster.Heal()
		default:
			c.cluster.Kill(i)
			sleepCtx(ctx, chaosTTL)
			require.NoError(t, c.cluster.Restart(ctx, i), "round %d: restart member %s", r.n, c.cluster.Name(i))
		}
	}
}

// control writes round r's register with a raw etcd Put, recorded as a
// write with a token that a newer acquisition has superseded.
func (c *etcdChaos) control(r *chaosRound) {
	_, old := c.holding(r, func(*holderProc) bool { return true })
	if !r.wait(time.Minute, func() bool { return r.newest.Revision > old.Revision }) {
		c.t.Fatalf("control round %d: no acquisition newer than %s within a minute", r.n, old)
	}
	ctx, cancel := context.WithTimeout(c.ctx, 10*time.Second)
	defer cancel()
	val := int(c.nextV.Add(1))
	call := r.h.At(time.Now())
	_, err := c.raw.Put(ctx, c.admin.DataKey(r.name), strconv.Itoa(val))
	r.h.RecordAt(takeoverClient, leaseInput{kind: opWrite, tok: leaseTokOf(old), val: val}, call, r.h.At(time.Now()), leaseOutput{ok: err == nil, unknown: err != nil}, err != nil)
	require.NoError(c.t, err)
}

func (c *etcdChaos) count(fault string) { c.faults[fault]++ }

// writes returns the number of writes recorded so far, and how many of
// them are late.
func (c *etcdChaos) writes() (writes, late int) {
	for _, r := range c.rounds {
		w, l := lateWrites(r.h.Ops())
		writes += w
		late += len(l)
	}
	return writes, late
}

// lateWrites counts the holders' writes of ops, and returns the late
// ones: those whose token is older than that of an acquisition that
// returned before the write was called.
func lateWrites(ops []porcupine.Operation) (writes int, late []porcupine.Operation) {
	var acqs, wrs []porcupine.Operation
	for _, op := range ops {
		in, out := op.Input.(leaseInput), op.Output.(leaseOutput)
		switch {
		case in.kind == opWrite && op.ClientId != takeoverClient:
			wrs = append(wrs, op)
		case in.kind == opAcquire && out.ok:
			acqs = append(acqs, op)
		}
	}
	sort.Slice(acqs, func(i, j int) bool { return acqs[i].Return < acqs[j].Return })
	sort.Slice(wrs, func(i, j int) bool { return wrs[i].Call < wrs[j].Call })
	var newest int64
	a := 0
	for _, w := range wrs {
		for ; a < len(acqs) && acqs[a].Return < w.Call; a++ {
			newest = max(newest, acqs[a].Output.(leaseOutput).tok.rev)
		}
		if w.Input.(leaseInput).tok.rev < newest {
			late = append(late, w)
		}
	}
	return len(wrs), late
}

// stop ends the holders, the replicas and the reader.
func (c *etcdChaos) stop() {
	c.cancel()
	for _, hp := range c.holders {
		_ = hp.cmd.Process.Signal(syscall.SIGCONT)
		_ = hp.stdin.Close() // the holder exits at the end of its input
	}
	for _, hp := range c.holders {
		select {
		case <-hp.exited:
		case <-time.After(15 * time.Second):
			_ = hp.cmd.Process.Kill()
		}
	}
	c.wg.Wait()
	for _, s := range c.serves {
		s.kill()
	}
}

func leaseTokOf(tok token.Token) leaseTok { return leaseTok{rev: tok.Revision, epoch: tok.Epoch} }

// runReader reads the current round's register until the test ends. A
// read that fails has no effect and is not recorded.
func (c *etcdChaos) runReader() {
	for c.ctx.Err() == nil {
		r := c.cur.Load()
		if r == nil {
			sleepCtx(c.ctx, 10*time.Millisecond)
			continue
		}
		ctx, cancel := context.WithTimeout(c.ctx, 2*time.Second)
		call := r.h.At(time.Now())
		v, found, err := c.admin.Get(ctx, r.name)
		cancel()
		if err == nil {
			out := leaseOutput{ok: true}
			if found {
				if out.val, err = strconv.Atoi(string(v.Data)); err != nil {
					c.t.Errorf("register %s holds %q", r.name, v.Data)
				}
			}
			r.h.RecordAt(0, leaseInput{kind: opRead}, call, r.h.At(time.Now()), out, false)
		}
		sleepCtx(c.ctx, 10*time.Millisecond)
	}
}

func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// chaosReport is what the test prints.
type chaosReport struct {
	rounds, controls                         int
	ops, unknown                             int
	acquires, writes, reads, releases        int
	accepted, refused, indefinite, late      int
	testWrites, testAccepted                 int // forged, foreign and control writes
	lateAccepted, lateRefused, lateUnknown   int
	violations, controlViolations, undecided int
	leftOut                                  int           // unknown operations that cannot change a verdict
	checking                                 time.Duration // porcupine's time, every round
	faults                                   map[string]int
}

// check checks every round's history and counts what happened.
func (c *etcdChaos) check() chaosReport {
	rep := chaosReport{faults: c.faults}
	for _, r := range c.rounds {
		closed := r.h.Closed()
		decided := withoutNoOps(closed)
		rep.leftOut += len(closed) - len(decided)
		began := time.Now()
		r.verdict = porcupine.CheckOperationsTimeout(leasedRegister, decided, 2*time.Minute)
		rep.checking += time.Since(began)
		ops := r.h.Ops()
		_, unknown := r.h.Len()
		rep.ops += len(ops)
		rep.unknown += unknown
		_, late := lateWrites(ops)
		rep.late += len(late)
		for _, op := range late {
			switch out := op.Output.(leaseOutput); {
			case out.ok:
				rep.lateAccepted++
			case out.unknown:
				rep.lateUnknown++
			default:
				rep.lateRefused++
			}
		}
		for _, op := range ops {
			in, out := op.Input.(leaseInput), op.Output.(leaseOutput)
			switch in.kind {
			case opAcquire:
				rep.acquires++
			case opRead:
				rep.reads++
			case opRelease:
				rep.releases++
			case opWrite:
				if op.ClientId == takeoverClient {
					rep.testWrites++
					if out.ok {
						rep.testAccepted++
					}
					continue
				}
				rep.writes++
				switch {
				case out.ok:
					rep.accepted++
				case out.unknown:
					rep.indefinite++
				default:
					rep.refused++
				}
			}
		}
		if r.control {
			rep.controls++
			if r.verdict == porcupine.Illegal {
				rep.controlViolations++
			}
			continue
		}
		rep.rounds++
		switch r.verdict {
		case porcupine.Illegal:
			rep.violations++
			path := filepath.Join(os.TempDir(), fmt.Sprintf("fencer-chaos-round-%d.html", r.n))
			_, info := porcupine.CheckOperationsVerbose(leasedRegister, decided, time.Minute)
			if err := porcupine.VisualizePath(leasedRegister, info, path); err == nil {
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
	fmt.Fprintf(&b, "  operations:    %d (%d writes, %d reads, %d acquires, %d releases; %d of unknown outcome)\n",
		rep.ops, rep.writes, rep.reads, rep.acquires, rep.releases, rep.unknown)
	fmt.Fprintf(&b, "  holder writes: %d accepted, %d refused as stale, %d indefinite (outcome unknown)\n", rep.accepted, rep.refused, rep.indefinite)
	fmt.Fprintf(&b, "  test's writes: %d forged, foreign or control writes, %d accepted\n", rep.testWrites, rep.testAccepted)
	fmt.Fprintf(&b, "  late writes:   %d (token older than an acquisition returned before the call): %d refused, %d accepted, %d indefinite\n",
		rep.late, rep.lateRefused, rep.lateAccepted, rep.lateUnknown)
	fmt.Fprintf(&b, "  faults injected:\n")
	var kinds []string
	for k := range rep.faults {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	for _, k := range kinds {
		fmt.Fprintf(&b, "    %5d  %s\n", rep.faults[k], k)
	}
	fmt.Fprintf(&b, "  porcupine:     %d violations in %d rounds (%d undecided)%s; checked in %s, %d unknown operations that cannot change a verdict left out\n",
		rep.violations, rep.rounds, rep.undecided, mutantNote(), rep.checking.Round(time.Millisecond), rep.leftOut)
	fmt.Fprintf(&b, "  broken-guard control: %d of %d rounds with a violation\n", rep.controlViolations, rep.controls)
	return b.String()
}
