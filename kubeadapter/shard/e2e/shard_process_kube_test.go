//go:build linux

package e2e_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fencer-dev/fencer/internal/mutant"
	"github.com/fencer-dev/fencer/internal/rendezvous"
	"github.com/fencer-dev/fencer/internal/testkit/faultproxy"
	"github.com/fencer-dev/fencer/internal/testkit/history"
	"github.com/fencer-dev/fencer/kubeadapter"
	"github.com/fencer-dev/fencer/kubeadapter/fenced"
	"github.com/fencer-dev/fencer/kubeadapter/kubefencertest"
	"github.com/fencer-dev/fencer/kubeadapter/shard"
	"github.com/fencer-dev/fencer/token"
)

var shardProcessRounds = flag.Int("shard-process-rounds", 1, "rounds of SIGSTOP, partition and SIGKILL with restart in TestShardProcesses (make test runs 1, make shardchaos more)")

// shardMemberEnv, when set in the environment, makes the test binary run
// as one member process of TestShardProcesses instead of running tests
// (see TestMain). Its value names the member's spec file (memberSpec, as
// JSON).
const shardMemberEnv = "FENCER_SHARD_MEMBER"

// memberSpec is what a member process is told.
type memberSpec struct {
	Host      string // the API server, or the member's proxy to it
	Token     string // bearer token
	CA        []byte // the API server's CA, PEM
	Namespace string
	Ring      string
	Identity  string
	Shards    []string
	ValBase   int // the member writes values ValBase+1, ValBase+2, …
	// ClockOffset is added to the wall clock of the member's Sharder, so
	// that the renewTime it writes is off by as much. Durations are
	// unchanged.
	ClockOffset time.Duration
}

// skewedClock is the real clock with its wall time off by offset: a
// machine whose clock is wrong. Since and timers measure real durations.
type skewedClock struct {
	clock.RealClock
	offset time.Duration
}

func (c skewedClock) Now() time.Time                  { return time.Now().Add(c.offset) }
func (c skewedClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

// memberEvent is one JSON line that a member process writes on its
// standard output. Times are wall-clock Unix nanoseconds, so that the
// events of all processes (and the test's reads) share one clock.
type memberEvent struct {
	// Ev is "call" (a write was invoked), "ret" (it returned), "own"
	// (the shards the member owns changed) or "mark" (a step of a fault).
	Ev string `json:"ev"`
	// ID names a write within the process: its call and its ret.
	ID  int64  `json:"id,omitempty"`
	Reg string `json:"reg,omitempty"`
	Tok int64  `json:"tok,omitempty"`
	Val int    `json:"val,omitempty"`
	At  int64  `json:"at"`
	// OK, Unknown: the write's outcome. Stale: it was refused as stale
	// (token.ErrStale).
	OK      bool   `json:"ok,omitempty"`
	Unknown bool   `json:"unknown,omitempty"`
	Stale   bool   `json:"stale,omitempty"`
	Err     string `json:"err,omitempty"`
	// Late names the fault whose late write this is.
	Late string `json:"late,omitempty"`
	// Owns maps each shard the member owns to its token's revision.
	Owns map[string]int64 `json:"owns,omitempty"`
	// Mutant is the mutant on in the member (mutant.Env, in a
	// fencer_mutants build), in its "started" mark.
	Mutant string `json:"mutant,omitempty"`
	// What names a mark: "started" (its first line), "pausing" (the
	// member stops itself next), "update-next" (the member waits for "go"
	// to send the PUT of a write, its read and check done).
	What string `json:"what,omitempty"`
}

// shardMember runs one member process of TestShardProcesses: its own
// clientset, Watcher, Sharder and fenced client on the API server named by
// the spec at specPath. Every 20ms it writes, for each shard it owns, the
// two registers of the shard, fenced-<shard> through the fenced client
// with its ShardHeld and plain-<shard> with a plain Update (the tokenless
// baseline), and reports each write as JSON lines on standard output. It
// reads commands, one a line, on standard input:
//
//   - "pause SHARD": at its next write of SHARD, take the token, read both
//     registers, stop itself with SIGSTOP, and once continued write what
//     it read with that token (the late writes of a paused worker, see
//     memberWriter.late);
//   - "late SHARD REV": write both registers now with the token of
//     revision REV that it held for SHARD;
//   - "killpoint SHARD": at its next update of SHARD's fenced register,
//     report "update-next" and send the PUT only on "go" (so that the
//     test can hold it in flight and kill the process).
//
// It leaves the ring gracefully and returns 0 when its standard input is
// closed or it receives SIGTERM.
func shardMember(specPath string) int {
	if err := runShardMember(specPath); err != nil {
		fmt.Fprintln(os.Stderr, "shard member:", err)
		return 1
	}
	return 0
}

func runShardMember(specPath string) error {
	raw, err := os.ReadFile(specPath)
	if err != nil {
		return err
	}
	var spec memberSpec
	if err := json.Unmarshal(raw, &spec); err != nil {
		return err
	}
	rc := &rest.Config{Host: spec.Host, BearerToken: spec.Token, TLSClientConfig: rest.TLSClientConfig{CAData: spec.CA}, QPS: -1}
	// killpoint names the register whose next PUT waits for "go" once it
	// has reported "update-next"; nil when none.
	var killpoint atomic.Pointer[string]
	goCh := make(chan struct{}, 1)
	var mw *memberWriter
	rc.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			if reg := killpoint.Load(); reg != nil && req.Method == http.MethodPut && strings.HasSuffix(req.URL.Path, "/configmaps/"+*reg) && killpoint.CompareAndSwap(reg, nil) {
				mw.emit(memberEvent{Ev: "mark", What: "update-next", Reg: *reg})
				<-goCh
			}
			return rt.RoundTrip(req)
		})
	})
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	crc, err := client.New(rc, client.Options{Scheme: clientgoscheme.Scheme})
	if err != nil {
		return err
	}
	w, err := kubeadapter.NewWatcher(cs.CoordinationV1(), kubeadapter.WatchNamespaces(spec.Namespace))
	if err != nil {
		return err
	}
	cfg := fastShardConfig(spec.Namespace, spec.Ring, spec.Identity)
	cfg.Watcher = w
	if spec.ClockOffset != 0 {
		cfg.Clock = skewedClock{offset: spec.ClockOffset}
	}
	s, err := shard.NewSharder(cs.CoordinationV1(), cfg)
	if err != nil {
		return err
	}
	s.Track(spec.Shards...)

	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() { _ = w.Start(ctx) })
	var startErr error
	wg.Go(func() { startErr = s.Start(ctx) })

	cmds := make(chan []string, 16)
	go func() { // ends with the process
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			switch {
			case len(f) == 0:
			case f[0] == "go":
				goCh <- struct{}{}
			default:
				cmds <- f
			}
		}
		cancel()
	}()

	mw = &memberWriter{spec: spec, crc: crc, enc: json.NewEncoder(os.Stdout), val: spec.ValBase, toks: map[string]map[int64]token.Token{}}
	started := memberEvent{Ev: "mark", What: "started"}
	if mutant.Enabled {
		started.Mutant = os.Getenv(mutant.Env)
	}
	mw.emit(started)
	pause := map[string]bool{}
	var owns map[string]int64
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for ctx.Err() == nil {
		select {
		case <-ctx.Done():
			continue
		case f := <-cmds:
			switch {
			case f[0] == "pause" && len(f) == 2:
				pause[f[1]] = true
			case f[0] == "killpoint" && len(f) == 2:
				reg := "fenced-" + f[1]
				killpoint.Store(&reg)
			case f[0] == "late" && len(f) == 3:
				rev, _ := strconv.ParseInt(f[2], 10, 64)
				tok, ok := mw.toks[f[1]][rev]
				if !ok {
					return fmt.Errorf("late %s: never held revision %d", f[1], rev)
				}
				mw.late(ctx, f[1], tok, "partition", nil)
			default:
				return fmt.Errorf("unknown command %q", f)
			}
			continue
		case <-tick.C:
		}
		now := map[string]int64{}
		for _, sh := range spec.Shards {
			hd, err := s.Shard(sh)
			if err != nil {
				continue
			}
			tok := hd.Token()
			now[sh] = tok.Revision
			if mw.toks[sh] == nil {
				mw.toks[sh] = map[int64]token.Token{}
			}
			mw.toks[sh][tok.Revision] = tok
		}
		if !maps.Equal(now, owns) {
			owns = now
			mw.emit(memberEvent{Ev: "own", Owns: owns})
		}
		for _, sh := range spec.Shards {
			hd, err := s.Shard(sh)
			if err != nil {
				continue
			}
			switch {
			case pause[sh]:
				tok := hd.Token()
				// The worker reads before its pause and writes what it
				// read after it (see late). A failed read tries again at
				// the next tick.
				pre := map[string]*corev1.ConfigMap{}
				for _, reg := range []string{"fenced-" + sh, "plain-" + sh} {
					var cm corev1.ConfigMap
					if err := crc.Get(ctx, client.ObjectKey{Namespace: spec.Namespace, Name: reg}, &cm); err == nil {
						pre[reg] = &cm
					}
				}
				if len(pre) < 2 {
					continue
				}
				delete(pause, sh)
				mw.emit(memberEvent{Ev: "mark", What: "pausing", Reg: sh, Tok: tok.Revision})
				if err := syscall.Kill(os.Getpid(), syscall.SIGSTOP); err != nil {
					return err
				}
				mw.late(ctx, sh, tok, "pause", pre)
			default:
				mw.write(ctx, sh, hd, "")
			}
		}
	}
	wg.Wait()
	return startErr
}

// memberWriter makes and reports a member process's writes, from one
// goroutine; emit is safe for concurrent use.
type memberWriter struct {
	mu   sync.Mutex // serializes emit
	spec memberSpec
	crc  client.Client
	enc  *json.Encoder
	id   int64
	val  int
	toks map[string]map[int64]token.Token // shard → revision → a token the member held
}

func (w *memberWriter) emit(e memberEvent) {
	if e.At == 0 {
		e.At = time.Now().UnixNano()
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	_ = w.enc.Encode(e) // one write(2) per line: a kill loses no line written
}

// fenced returns the update of the fenced register through the fenced
// client with holder.
func (w *memberWriter) fenced(holder kubeadapter.Holder) func(context.Context, *corev1.ConfigMap) error {
	return func(ctx context.Context, cm *corev1.ConfigMap) error {
		fc, err := fenced.NewClient(w.crc, holder)
		if err != nil {
			return err
		}
		return fc.Update(ctx, cm)
	}
}

// plain is the tokenless baseline's update: conditional on the
// resourceVersion read, as client.Update is, and carrying no token.
func (w *memberWriter) plain(ctx context.Context, cm *corev1.ConfigMap) error {
	return w.crc.Update(ctx, cm)
}

// write writes both registers of shard with holder's token.
func (w *memberWriter) write(ctx context.Context, shard string, holder kubeadapter.Holder, late string) {
	tok := holder.Token().Revision
	w.writeOne(ctx, "fenced-"+shard, tok, late, nil, w.fenced(holder))
	w.writeOne(ctx, "plain-"+shard, tok, late, nil, w.plain)
}

// lateAttempts bounds the late writes to each register in one late.
const lateAttempts = 10

// late makes the late writes of a worker that still has tok for shard:
// it writes each register until the write is accepted, at most
// lateAttempts times (a worker that keeps retrying), so that the
// baseline's late write lands past conflicts with the new owner's writes
// and a fenced client with a hole has many chances to let one through.
// Without pre, each attempt reads the register afresh. With pre, the
// objects the worker read before (by register), each attempt writes the
// worker's own object with only its resourceVersion brought up to date,
// annotations and all (a careless "apply to the latest version"): the
// fenced client must check the stamp stored on the object, not the one
// the caller sends.
func (w *memberWriter) late(ctx context.Context, shard string, tok token.Token, why string, pre map[string]*corev1.ConfigMap) {
	for _, reg := range []struct {
		name   string
		update func(context.Context, *corev1.ConfigMap) error
	}{{"fenced-" + shard, w.fenced(staticHolder{Tok: tok})}, {"plain-" + shard, w.plain}} {
		own := pre[reg.name]
		for range lateAttempts {
			if own != nil {
				var cur corev1.ConfigMap
				if err := w.crc.Get(ctx, client.ObjectKey{Namespace: w.spec.Namespace, Name: reg.name}, &cur); err == nil {
					own.ResourceVersion = cur.ResourceVersion
				}
			}
			if out := w.writeOne(ctx, reg.name, tok.Revision, why, own, reg.update); out.OK {
				break
			}
		}
	}
}

// writeOne reads reg (or takes pre, when not nil, as read), sets its value
// and token and writes it with update, reporting the call before the read
// and the outcome after the write. A failed read is a write refused.
func (w *memberWriter) writeOne(ctx context.Context, reg string, tok int64, late string, pre *corev1.ConfigMap, update func(context.Context, *corev1.ConfigMap) error) memberEvent {
	w.id++
	w.val++
	call := memberEvent{Ev: "call", ID: w.id, Reg: reg, Tok: tok, Val: w.val, Late: late}
	w.emit(call)
	ret := memberEvent{Ev: "ret", ID: w.id, Reg: reg, Tok: tok, Val: w.val, Late: late}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var cm corev1.ConfigMap
	if pre != nil {
		pre.DeepCopyInto(&cm)
	} else if err := w.crc.Get(ctx, client.ObjectKey{Namespace: w.spec.Namespace, Name: reg}, &cm); err != nil {
		ret.Err = "read: " + err.Error()
		w.emit(ret)
		return ret
	}
	cm.Data = map[string]string{"v": strconv.Itoa(w.val), "tok": strconv.FormatInt(tok, 10)}
	err := update(ctx, &cm)
	ret.OK = err == nil
	switch {
	case err == nil:
	case errors.Is(err, token.ErrStale):
		ret.Stale = true
	case errors.Is(err, token.ErrNotHeld), apierrors.IsConflict(err), apierrors.IsForbidden(err):
	default:
		ret.Unknown = true
	}
	if err != nil {
		ret.Err = err.Error()
	}
	w.emit(ret)
	return ret
}

// memberProc is one member process, as the test sees it.
type memberProc struct {
	n        int // the process's number in the run, unique
	identity string
	cmd      *exec.Cmd
	stdin    io.WriteCloser
	proxy    *faultproxy.Proxy
	exited   chan struct{}
	stderr   string // path of its standard error
}

// send writes a command line to the member.
func (p *memberProc) send(t *testing.T, line string) {
	t.Helper()
	_, err := io.WriteString(p.stdin, line+"\n")
	require.NoError(t, err, "member %s: %s", p.identity, line)
}

// stopped reports whether the process is stopped by a signal, from
// /proc/PID/stat.
func (p *memberProc) stopped() bool {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid))
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(raw), ')')
	return i > 0 && i+2 < len(raw) && (raw[i+2] == 'T' || raw[i+2] == 't')
}

// procEvent is a member's event and the process that reported it.
type procEvent struct {
	proc *memberProc
	memberEvent
}

// shardProcs runs the member processes of TestShardProcesses and collects
// their events and the test's reads.
type shardProcs struct {
	t      *testing.T
	env    *kubefencertest.APIServer
	ns     string
	shards []string
	dir    string
	crc    client.Client

	mu     sync.Mutex
	procs  []*memberProc
	live   map[string]*memberProc // by identity
	events []procEvent
	reads  []porcupine.Operation // the test's reads, of every register
	regOf  []string              // the register of each read
	faults map[string]int
	skew   map[string]time.Duration // clock offset by identity
	readWG sync.WaitGroup
}

// start starts a member process with identity, through a new proxy of its
// own to the API server, and replaces any process of that identity in
// p.live.
func (p *shardProcs) start(identity string) *memberProc {
	t := p.t
	t.Helper()
	admin := p.env.Admin()
	proxy := faultproxy.New(t, strings.TrimPrefix(admin.Host, "https://"))
	p.mu.Lock()
	n := len(p.procs)
	p.mu.Unlock()
	spec := memberSpec{
		Host: "https://" + proxy.Addr(), Token: admin.BearerToken, CA: admin.CAData,
		Namespace: p.ns, Ring: "procs", Identity: identity, Shards: p.shards,
		ValBase: (n + 1) * 10_000_000, ClockOffset: p.skew[identity],
	}
	raw, err := json.Marshal(spec)
	require.NoError(t, err)
	specPath := filepath.Join(p.dir, fmt.Sprintf("member-%d.json", n))
	require.NoError(t, os.WriteFile(specPath, raw, 0o600))
	stderrPath := filepath.Join(p.dir, fmt.Sprintf("member-%d.stderr", n))
	stderr, err := os.Create(stderrPath)
	require.NoError(t, err)
	defer stderr.Close()

	// The member is this test binary, so it runs with the same build tags
	// (fencer_mutants) and environment (FENCER_MUTANT).
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), shardMemberEnv+"="+specPath)
	cmd.Stderr = stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	m := &memberProc{n: n, identity: identity, cmd: cmd, stdin: stdin, proxy: proxy, exited: make(chan struct{}), stderr: stderrPath}
	p.mu.Lock()
	p.procs = append(p.procs, m)
	p.live[identity] = m
	p.mu.Unlock()
	go func() {
		defer close(m.exited)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			var e memberEvent
			if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
				continue // not an event (a log line on stdout)
			}
			p.mu.Lock()
			p.events = append(p.events, procEvent{m, e})
			p.mu.Unlock()
		}
		_ = cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill() // fails only once it has exited
		<-m.exited
	})
	return m
}

// kill sends SIGKILL to m and waits until it has exited.
func (p *shardProcs) kill(m *memberProc) {
	p.t.Helper()
	require.NoError(p.t, m.cmd.Process.Signal(syscall.SIGKILL))
	select {
	case <-m.exited:
	case <-time.After(20 * time.Second):
		p.t.Fatalf("member %s did not exit after SIGKILL", m.identity)
	}
}

// stopAll closes every live member's standard input, so that it leaves the
// ring gracefully, and requires each to exit with status 0 (a member run
// with -race exits 66 on a race).
func (p *shardProcs) stopAll() {
	t := p.t
	t.Helper()
	p.mu.Lock()
	live := slices.Collect(maps.Values(p.live))
	p.mu.Unlock()
	for _, m := range live {
		m.stdin.Close()
	}
	for _, m := range live {
		select {
		case <-m.exited:
		case <-time.After(30 * time.Second):
			t.Fatalf("member %s did not leave within 30s", m.identity)
		}
		require.Equal(t, 0, m.cmd.ProcessState.ExitCode(), "member %s: %s", m.identity, stderrTail(m.stderr))
	}
}

// stderrTail returns the end of the file at path, for failure messages.
func stderrTail(path string) string {
	raw, _ := os.ReadFile(path)
	if len(raw) > 4000 {
		raw = raw[len(raw)-4000:]
	}
	return string(raw)
}

// snapshot returns a copy of the events so far.
func (p *shardProcs) snapshot() []procEvent {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.events)
}

// accepted reports whether a write to reg with a token greater than tok
// was accepted.
func (p *shardProcs) accepted(reg string, tok int64) bool {
	return slices.ContainsFunc(p.snapshot(), func(e procEvent) bool {
		return e.Ev == "ret" && e.Reg == reg && e.OK && e.Tok > tok
	})
}

// owner waits until exactly one live member process reports owning shard
// and has had a fenced write to it accepted with that ownership's token,
// and returns it and the token's revision.
func (p *shardProcs) owner(shard string) (*memberProc, int64) {
	t := p.t
	t.Helper()
	var who *memberProc
	var rev int64
	ok := waitFor(30*time.Second, func() bool {
		who, rev = p.ownerNow(shard)
		return who != nil
	})
	require.True(t, ok, "no single member process owns %s and writes it", shard)
	return who, rev
}

// ownerNow is owner without the wait: nil when shard has no single owner
// that has written it.
func (p *shardProcs) ownerNow(shard string) (*memberProc, int64) {
	events := p.snapshot()
	p.mu.Lock()
	live := slices.Collect(maps.Values(p.live))
	p.mu.Unlock()
	var who *memberProc
	var rev int64
	for _, m := range live {
		var owns map[string]int64
		for _, e := range events {
			if e.proc == m && e.Ev == "own" {
				owns = e.Owns
			}
		}
		r, ok := owns[shard]
		if !ok {
			continue
		}
		if who != nil {
			return nil, 0
		}
		who, rev = m, r
	}
	if who == nil || !slices.ContainsFunc(events, func(e procEvent) bool {
		return e.proc == who && e.Ev == "ret" && e.Reg == "fenced-"+shard && e.OK && e.Tok == rev
	}) {
		return nil, 0
	}
	return who, rev
}

// settled waits until every live member has joined and each shard is
// owned and written by its rendezvous owner among them.
func (p *shardProcs) settled() {
	t := p.t
	t.Helper()
	p.mu.Lock()
	var ms []rendezvous.Member
	for id := range p.live {
		ms = append(ms, rendezvous.Member{Name: id, Weight: 1})
	}
	p.mu.Unlock()
	ok := waitFor(30*time.Second, func() bool {
		for _, sh := range p.shards {
			want, _ := rendezvous.Owner(sh, ms)
			if m, _ := p.ownerNow(sh); m == nil || m.identity != want {
				return false
			}
		}
		return true
	})
	require.True(t, ok, "the ring of member processes did not settle")
}

// mark waits until m reports the mark what, after the first n events.
func (p *shardProcs) mark(m *memberProc, what string, n int) memberEvent {
	t := p.t
	t.Helper()
	var got memberEvent
	ok := waitFor(30*time.Second, func() bool {
		for _, e := range p.snapshot()[n:] {
			if e.proc == m && e.Ev == "mark" && e.What == what {
				got = e.memberEvent
				return true
			}
		}
		return false
	})
	require.True(t, ok, "member %s did not report %q: %s", m.identity, what, stderrTail(m.stderr))
	return got
}

// lateRets waits until m has reported, after the first n events, the
// outcome of its late writes for why to both registers of shard, and
// returns them.
func (p *shardProcs) lateRets(m *memberProc, shard, why string, n int) (fenced, plain []memberEvent) {
	t := p.t
	t.Helper()
	ok := waitFor(30*time.Second, func() bool {
		fenced, plain = nil, nil
		done := false
		for _, e := range p.snapshot()[n:] {
			if e.proc != m || e.Ev != "ret" || e.Late != why {
				continue
			}
			switch e.Reg {
			case "fenced-" + shard:
				fenced = append(fenced, e.memberEvent)
			case "plain-" + shard:
				// The plain register is written last, until accepted.
				plain = append(plain, e.memberEvent)
				done = e.OK || len(plain) == lateAttempts
			}
		}
		return len(fenced) > 0 && done
	})
	require.True(t, ok, "member %s made no late write for %s: %s", m.identity, why, stderrTail(m.stderr))
	return fenced, plain
}

// read records one read of each register, on the wall clock the members
// use.
func (p *shardProcs) read(ctx context.Context, start int64) {
	for _, sh := range p.shards {
		for _, reg := range []string{"fenced-" + sh, "plain-" + sh} {
			call := time.Now().UnixNano()
			var cm corev1.ConfigMap
			if err := p.crc.Get(ctx, client.ObjectKey{Namespace: p.ns, Name: reg}, &cm); err != nil {
				continue
			}
			ret := time.Now().UnixNano()
			v, _ := strconv.Atoi(cm.Data["v"])
			p.mu.Lock()
			p.reads = append(p.reads, porcupine.Operation{ClientId: 0, Input: history.Input{}, Call: call - start, Output: history.Output{OK: true, Val: v}, Return: ret - start})
			p.regOf = append(p.regOf, reg)
			p.mu.Unlock()
		}
	}
}

// regCounts are the operations on one register, by kind.
type regCounts struct {
	reads, writes, accepted, refused, unknown, open, late, lateAccepted int
	openSeen                                                            int // open writes whose value a read returned: they landed
}

// history returns the operations on reg, for history.FencedRegister, with
// the times relative to start: each member write, whose outcome is
// unknown when it returned none (its process was killed) or an unknown
// one, and the test's reads. Open and unknown writes return after every
// other operation.
func (p *shardProcs) history(reg string, start int64) ([]porcupine.Operation, regCounts) {
	events := p.snapshot()
	type key struct {
		proc *memberProc
		id   int64
	}
	rets := map[key]memberEvent{}
	for _, e := range events {
		if e.Ev == "ret" && e.Reg == reg {
			rets[key{e.proc, e.ID}] = e.memberEvent
		}
	}
	end := time.Now().UnixNano() - start + 1
	var ops []porcupine.Operation
	var c regCounts
	open := map[int]bool{}
	for _, e := range events {
		if e.Ev != "call" || e.Reg != reg {
			continue
		}
		c.writes++
		op := porcupine.Operation{ClientId: e.proc.n + 1, Input: history.Input{Write: true, Tok: e.Tok, Val: e.Val}, Call: e.At - start}
		ret, ok := rets[key{e.proc, e.ID}]
		switch {
		case !ok:
			c.open++
			open[e.Val] = true
			op.Output, op.Return = history.Output{Unknown: true}, end
		case ret.Unknown:
			c.unknown++
			op.Output, op.Return = history.Output{Unknown: true}, end
		default:
			op.Output, op.Return = history.Output{OK: ret.OK}, ret.At-start
			if ret.OK {
				c.accepted++
			} else {
				c.refused++
			}
		}
		if e.Late != "" {
			c.late++
			if ok && ret.OK {
				c.lateAccepted++
			}
		}
		ops = append(ops, op)
	}
	p.mu.Lock()
	for i, op := range p.reads {
		if p.regOf[i] == reg {
			ops = append(ops, op)
			c.reads++
			if v := op.Output.(history.Output).Val; open[v] {
				c.openSeen++
				delete(open, v)
			}
		}
	}
	p.mu.Unlock()
	return ops, c
}

// TestShardProcesses runs the members of a ring as separate OS processes
// (this test binary re-executed, see shardMember), each with its own
// clientset, Watcher, Sharder and fenced client, on a real API server of
// its own, without the admission policy, so that what fences the
// downstream writes is the fenced client's check and nothing else. Every
// member writes two registers (ConfigMaps) per shard it owns: through the
// fenced client, and with a plain Update carrying no token (the tokenless
// baseline), and reports each write with wall-clock call and return
// times. First, a steady ring in which p-2's clock is 90s behind keeps
// every holder for three lease durations (a Sharder that judged members by
// the renewTime they write would declare p-2 dead). Then each round has
// these faults, each made deterministically:
//
//   - SIGSTOP past the lease duration: the owner of reg-a reads both
//     registers, takes its token and stops itself; the test waits until
//     another member's writes with a greater token were accepted in both,
//     then sends SIGCONT, and the member writes the object it had read,
//     with the token it had and only its resourceVersion brought up to
//     date (so only the stamp stored on the object can refuse it);
//   - a partition: the proxy between the owner of reg-b and the API server
//     cuts every connection until another member's writes with a greater
//     token were accepted; then it heals, and the member writes with the
//     token it had;
//   - SIGKILL mid-write and a restart under the same identity: the owner of
//     reg-a sends the PUT of a fenced write, its read and check done, while
//     its proxy holds every byte; it is killed, the PUT is then delivered,
//     and the same identity starts again at once, while its old heartbeat
//     is live. The write has no return: its outcome is unknown.
//
// The histories are checked with porcupine against history.FencedRegister:
// the fenced registers' must be linearizable, and the baseline's must not
// (its late writes land), in the same run. -shard-process-rounds repeats
// the faults.
func TestShardProcesses(t *testing.T) {
	began := time.Now()
	env := kubefencertest.APIServerForTest(t)
	cs, err := kubernetes.NewForConfig(env.Admin())
	require.NoError(t, err)
	crc, err := client.New(env.Admin(), client.Options{Scheme: clientgoscheme.Scheme})
	require.NoError(t, err)
	ctx := t.Context()
	const ns = "shard-procs"
	_, err = cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	require.NoError(t, err)
	shards := []string{"reg-a", "reg-b"}
	var regs []string
	for _, sh := range shards {
		regs = append(regs, "fenced-"+sh, "plain-"+sh)
	}
	for _, reg := range regs {
		require.NoError(t, crc.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: reg}}))
	}
	p := &shardProcs{t: t, env: env, ns: ns, shards: shards, dir: t.TempDir(), crc: crc, live: map[string]*memberProc{}, faults: map[string]int{},
		skew: map[string]time.Duration{"p-2": -90 * time.Second}}
	start := time.Now().UnixNano()
	for i := range 3 {
		p.start(fmt.Sprintf("p-%d", i))
	}
	p.settled()
	// Every member has joined (a member that owns no shard can join after
	// the ring has settled).
	require.True(t, waitFor(30*time.Second, func() bool {
		leases := ringLeases(t, cs, ns)
		for i := range 3 {
			if !strings.HasPrefix(leases[fmt.Sprintf("procs-m-p-%d", i)], fmt.Sprintf("p-%d_", i)) {
				return false
			}
		}
		return true
	}), "not every member process joined the ring")
	// A steady ring stays as it is, though p-2's clock is 90s behind (so
	// is the renewTime it writes): no heartbeat or shard Lease changes
	// holder or counts a new acquisition.
	before := ringLeases(t, cs, ns)
	time.Sleep(3 * fastShardConfig(ns, "procs", "x").LeaseDuration)
	require.Equal(t, before, ringLeases(t, cs, ns), "a steady ring with one member's clock behind changed its holders")
	stopReads := make(chan struct{})
	p.readWG.Go(func() {
		for {
			select {
			case <-stopReads:
				return
			case <-time.After(25 * time.Millisecond):
			}
			p.read(ctx, start)
		}
	})
	defer func() {
		select {
		case <-stopReads:
		default:
			close(stopReads)
		}
		p.readWG.Wait()
	}()
	for range *shardProcessRounds {
		// SIGSTOP past the lease duration, then SIGCONT: the late write
		// of a worker that had taken its token.
		m, _ := p.owner("reg-a")
		n := len(p.snapshot())
		m.send(t, "pause reg-a")
		old := p.mark(m, "pausing", n).Tok
		require.True(t, waitFor(10*time.Second, m.stopped), "member %s did not stop itself", m.identity)
		require.True(t, waitFor(30*time.Second, func() bool {
			return p.accepted("fenced-reg-a", old) && p.accepted("plain-reg-a", old)
		}), "sigstop: no new owner wrote reg-a")
		require.NoError(t, m.cmd.Process.Signal(syscall.SIGCONT))
		p.faults["sigstop past the lease, then sigcont"]++
		p.checkLate(m, "reg-a", "pause", n)

		// A partition between one member and the API server.
		m, old = p.owner("reg-b")
		m.proxy.Isolate()
		require.True(t, waitFor(30*time.Second, func() bool {
			return p.accepted("fenced-reg-b", old) && p.accepted("plain-reg-b", old)
		}), "partition: no new owner wrote reg-b")
		m.proxy.Heal()
		p.faults["partition, healed"]++
		n = len(p.snapshot())
		m.send(t, fmt.Sprintf("late reg-b %d", old))
		p.checkLate(m, "reg-b", "partition", n)

		// SIGKILL mid-write, and a restart under the same identity.
		m, _ = p.owner("reg-a")
		n = len(p.snapshot())
		m.send(t, "killpoint reg-a")
		p.mark(m, "update-next", n)
		m.proxy.Pause()
		m.send(t, "go")
		// The update is sent into the held proxy; this wait only gives it
		// the time to get there.
		time.Sleep(300 * time.Millisecond)
		p.kill(m)
		m.proxy.Resume()
		p.faults["sigkill mid-write"]++
		// No other member writes reg-a before the restart: whether the
		// dead member's update landed is read off the register.
		var killedVal int
		for _, e := range p.snapshot() {
			if e.proc == m && e.Ev == "call" && e.Reg == "fenced-reg-a" {
				killedVal = e.Val
			}
		}
		time.Sleep(500 * time.Millisecond)
		var cm corev1.ConfigMap
		require.NoError(t, crc.Get(ctx, client.ObjectKey{Namespace: ns, Name: "fenced-reg-a"}, &cm))
		if cm.Data["v"] == strconv.Itoa(killedVal) {
			p.faults["sigkill mid-write: the update landed after the process died"]++
		}
		p.start(m.identity)
		p.faults["restart under the same identity"]++
		p.settled()
	}
	time.Sleep(200 * time.Millisecond)
	close(stopReads)
	p.readWG.Wait()
	p.stopAll()

	mutants := map[string]int{}
	for _, e := range p.snapshot() {
		if e.Ev == "mark" && e.What == "started" {
			mutants[e.Mutant]++
		}
	}
	t.Logf("member processes: %d started (by the mutant each ran, \"\" for none: %v), %v", len(p.procs), mutants, p.faults)
	for _, reg := range regs {
		ops, c := p.history(reg, start)
		res := porcupine.CheckOperationsTimeout(history.FencedRegister, ops, 30*time.Second)
		t.Logf("%s: %d writes (%d accepted, %d refused, %d unknown, %d open at a kill of which %d seen landed; %d late, %d of them accepted), %d reads: %s",
			reg, c.writes, c.accepted, c.refused, c.unknown, c.open, c.openSeen, c.late, c.lateAccepted, c.reads, res)
		if strings.HasPrefix(reg, "fenced-") {
			assert.Equal(t, porcupine.Ok, res, "the fenced history of %s is not a fenced register", reg)
			assert.Zero(t, c.lateAccepted, "%s: a late write was accepted", reg)
		} else {
			assert.Equal(t, porcupine.Illegal, res, "the tokenless baseline's history of %s passed: the check does not bite", reg)
		}
	}
	t.Logf("wall time %v", time.Since(began).Round(time.Millisecond))
}

// ringLeases returns the holder and acquisition count of every Lease in
// ns.
func ringLeases(t *testing.T, cs *kubernetes.Clientset, ns string) map[string]string {
	t.Helper()
	list, err := cs.CoordinationV1().Leases(ns).List(t.Context(), metav1.ListOptions{})
	require.NoError(t, err)
	out := map[string]string{}
	for _, l := range list.Items {
		var holder string
		var transitions int32
		if l.Spec.HolderIdentity != nil {
			holder = *l.Spec.HolderIdentity
		}
		if l.Spec.LeaseTransitions != nil {
			transitions = *l.Spec.LeaseTransitions
		}
		out[l.Name] = fmt.Sprintf("%s #%d", holder, transitions)
	}
	return out
}

// checkLate requires m's late writes for why to shard, reported after the
// first n events: every fenced one
// refused, the last as stale, and the baseline's landed. A late write
// that went the other way fails the test but lets it go on, so that the
// histories are checked too.
func (p *shardProcs) checkLate(m *memberProc, shard, why string, n int) {
	t := p.t
	t.Helper()
	fenced, plain := p.lateRets(m, shard, why, n)
	last := fenced[len(fenced)-1]
	t.Logf("%s: %d late fenced writes to %s, the last: ok=%v %s; %d late baseline writes, the last: ok=%v %s",
		why, len(fenced), shard, last.OK, last.Err, len(plain), plain[len(plain)-1].OK, plain[len(plain)-1].Err)
	assert.False(t, slices.ContainsFunc(fenced, func(e memberEvent) bool { return e.OK }), "%s: a late fenced write to %s was accepted", why, shard)
	assert.True(t, last.Stale, "%s: the late fenced write to %s was not refused as stale: %+v", why, shard, last)
	assert.True(t, plain[len(plain)-1].OK, "%s: the baseline's late write to %s did not land: %+v", why, shard, plain[len(plain)-1])
}
