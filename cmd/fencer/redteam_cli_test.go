package main

import (
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Red-team tests of the fencer command line, run through the built binary
// against fencer serve. Each asserts the safe outcome; a failure is a hole.

// rtExit codes, as docs/cli.md documents them.
const (
	rtExitUsage        = 2
	rtExitNotFound     = 3
	rtExitStale        = 4
	rtExitLeaseLost    = 9
	rtExitWatchdogLost = 10
)

// rtHold starts "fencer acquire NAME" without a command and returns the
// process and the token it prints.
func rtHold(t *testing.T, s *serveProc, args ...string) (*proc, string) {
	t.Helper()
	p := s.startFencer(nil, append([]string{"acquire"}, args...)...)
	require.Eventually(t, func() bool { return strings.HasSuffix(p.stdout.String(), "\n") }, printBound, 10*time.Millisecond, p.stderr.String())
	return p, strings.TrimSpace(p.stdout.String())
}

// rtCommand starts acquire with a shell script that prints "PID TOKEN" on
// its first line and returns the process, the pid and the token.
func rtCommand(t *testing.T, s *serveProc, env []string, flags []string, name, script string) (*proc, int, string) {
	t.Helper()
	args := append(append([]string{"acquire"}, flags...), name, "--", "sh", "-c", script)
	p := s.startFencer(env, args...)
	p.printed(t)
	f := strings.Fields(strings.SplitN(p.stdout.String(), "\n", 2)[0])
	require.Len(t, f, 2, p.stdout.String())
	pid, err := strconv.Atoi(f[0])
	require.NoError(t, err)
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	return p, pid, f[1]
}

// rtGet returns the exit code and output of fencer get KEY.
func rtGet(s *serveProc, key string) (int, string) {
	code, out, _ := s.fencer(nil, "get", key)
	return code, strings.TrimSpace(out)
}

// TestRedTeamCLIStaleTokenRefused: a superseded token is refused with
// exit code 4 by put, delete, txn and advance, with and without
// --take-over, with the token in --token or in $FENCER_TOKEN, and with a
// current token in $FENCER_TOKEN overridden by a stale --token; nothing is
// written.
func TestRedTeamCLIStaleTokenRefused(t *testing.T) {
	s := startServeProc(t)
	h1, t1 := rtHold(t, s, "jobs")
	require.NoError(t, h1.cmd.Process.Signal(syscall.SIGINT))
	require.Equal(t, 0, h1.wait(t, 10*time.Second), h1.stderr.String())
	h2, t2 := rtHold(t, s, "jobs")
	require.NotEqual(t, t1, t2)

	code, _, stderr := s.fencer(nil, "put", "--token", t2, "k", "live")
	require.Equal(t, 0, code, stderr)

	txn := "\nput k stale\nput k2 stale\n\n\n"
	for _, tc := range []struct {
		name string
		env  []string
		tok  []string
	}{
		{"flag", nil, []string{"--token", t1}},
		{"env", []string{"FENCER_TOKEN=" + t1}, nil},
		{"flag-over-current-env", []string{"FENCER_TOKEN=" + t2}, []string{"--token", t1}},
	} {
		for _, extra := range [][]string{nil, {"--take-over"}} {
			args := append(append([]string{}, tc.tok...), extra...)
			name := tc.name + "/" + strings.Join(extra, "")
			code, out, stderr := s.fencer(tc.env, append([]string{"put", "k", "stale"}, args...)...)
			require.Equal(t, rtExitStale, code, "%s put: %s %s", name, out, stderr)
			code, out, stderr = s.fencer(tc.env, append([]string{"delete", "k"}, args...)...)
			require.Equal(t, rtExitStale, code, "%s delete: %s %s", name, out, stderr)
			code, out, stderr = s.fencer(tc.env, append([]string{"advance", "res"}, args...)...)
			require.Equal(t, rtExitStale, code, "%s advance: %s %s", name, out, stderr)
			p := s.startFencerIn(strings.NewReader(txn), tc.env, append([]string{"txn"}, args...)...)
			require.Equal(t, rtExitStale, p.wait(t, 10*time.Second), "%s txn: %s %s", name, p.stdout, p.stderr)
			require.NotContains(t, p.stdout.String(), "SUCCESS")

			c, v := rtGet(s, "k")
			require.Equal(t, 0, c)
			require.Equal(t, "live", v, name)
			c, _ = rtGet(s, "k2")
			require.Equal(t, rtExitNotFound, c, name)
		}
	}

	// A stale token's txn is refused whichever branch would run, even one
	// that only reads.
	for _, txn := range []string{
		"value(k) = nope\n\nput k x\n\nput k2 else\n\n",
		"value(k) = live\n\nget k\n\n\n",
		"\n\n\n",
	} {
		p := s.startFencerIn(strings.NewReader(txn), nil, "txn", "--token", t1)
		require.Equal(t, rtExitStale, p.wait(t, 10*time.Second), "%q: %s %s", txn, p.stdout, p.stderr)
		require.NotContains(t, p.stdout.String(), "FAILURE")
		require.NotContains(t, p.stdout.String(), "SUCCESS")
	}
	c, _ := rtGet(s, "k2")
	require.Equal(t, rtExitNotFound, c)

	// A stale token neither checks as current nor releases the current
	// holder's lease; forged tokens of the lease write nothing.
	code, _, stderr = s.fencer(nil, "check", "--token", t1)
	require.Equal(t, rtExitStale, code, stderr)
	code, _, stderr = s.fencer(nil, "release", "--token", t1)
	t.Logf("release of a stale token: exit %d: %s", code, stderr)
	code, _, stderr = s.fencer(nil, "check", "--token", t2)
	require.Equal(t, 0, code, "the current lease was released by a stale token: %s", stderr)
	f := strings.Split(t2, ":")
	require.Len(t, f, 4, t2)
	for _, forged := range []string{
		"v1:" + f[1] + ":999999:" + f[3],
		"v1:99:" + f[2] + ":" + f[3],
		"v1:" + f[1] + ":" + f[2] + ":other",
		"garbage",
		t2 + "x",
	} {
		code, _, stderr = s.fencer(nil, "put", "--token", forged, "k", "forged")
		require.Contains(t, []int{rtExitUsage, rtExitStale}, code, "%s: %s", forged, stderr)
	}
	c, v := rtGet(s, "k")
	require.Equal(t, 0, c)
	require.Equal(t, "live", v)

	// Once the current holder has released too, its token is stale as well.
	require.NoError(t, h2.cmd.Process.Signal(syscall.SIGINT))
	require.Equal(t, 0, h2.wait(t, 10*time.Second), h2.stderr.String())
	code, _, stderr = s.fencer(nil, "put", "--token", t2, "k", "after-release")
	require.Equal(t, rtExitStale, code, stderr)
	c, v = rtGet(s, "k")
	require.Equal(t, 0, c)
	require.Equal(t, "live", v)
}

// TestRedTeamCLIIgnoresSIGTERMOnLoss: a command that ignores SIGTERM (and
// a child that inherits that) is killed after --grace once the lease is
// released behind its back, and acquire exits 9.
func TestRedTeamCLIIgnoresSIGTERMOnLoss(t *testing.T) {
	for _, grace := range []string{"1s", "0s"} { // a negative --grace is refused: TestRedTeamCLIBadTTLAndGrace
		t.Run("grace"+grace, func(t *testing.T) { rtStubbornLoss(t, grace) })
	}
}

// rtStubbornLoss is TestRedTeamCLIIgnoresSIGTERMOnLoss with one --grace.
func rtStubbornLoss(t *testing.T, grace string) {
	s := startServeProc(t)
	p, pid, tok := rtCommand(t, s, nil, []string{"--ttl", "2s", "--grace", grace}, "stubborn",
		`trap '' TERM; echo $$ $FENCER_TOKEN; while :; do sleep 0.1; done`)
	code, _, stderr := s.fencer(nil, "release", "--token", tok)
	require.Equal(t, 0, code, stderr)
	require.Equal(t, rtExitLeaseLost, p.wait(t, 10*time.Second), p.stderr.String())
	require.Eventually(t, func() bool { return !alive(pid) }, 3*time.Second, 10*time.Millisecond, "the command outlived its lost lease")
	require.Contains(t, p.stderr.String(), "fencer acquire: sh did not exit within --grace "+grace+" of SIGTERM; sent SIGKILL to its process group\n")
}

// TestRedTeamCLIServerPausedPastTTL: fencer serve stopped with SIGSTOP (it
// accepts connections but answers nothing) past the TTL: acquire must
// stop its command on its own clock, not wait for the server, and exit 9.
func TestRedTeamCLIServerPausedPastTTL(t *testing.T) {
	s := startServeProc(t)
	p, pid, _ := rtCommand(t, s, nil, []string{"--ttl", "2s", "--grace", "1s"}, "paused-server", `echo $$ x; exec sleep 30`)
	require.NoError(t, s.cmd.Process.Signal(syscall.SIGSTOP))
	defer func() { _ = s.cmd.Process.Signal(syscall.SIGCONT) }()
	// TTL 2s since the last renewal plus grace 1s, and slack for load.
	require.Eventually(t, func() bool { return !alive(pid) }, 6*time.Second, 10*time.Millisecond,
		"the command still runs while the server is paused past the TTL")
	start := time.Now()
	require.Equal(t, rtExitLeaseLost, p.wait(t, 15*time.Second), p.stderr.String())
	t.Logf("acquire exited %s after its command was gone", time.Since(start).Round(time.Millisecond))
}

// blackhole is a TCP proxy to a server that, once cut, forwards nothing
// and closes nothing: a network partition.
type blackhole struct {
	ln    net.Listener
	cut   atomic.Bool
	delay time.Duration // of what the server sends
	mu    sync.Mutex
	cs    []net.Conn
}

func startBlackhole(t *testing.T, to string, delay time.Duration) *blackhole {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	b := &blackhole{ln: ln, delay: delay}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", to)
			if err != nil {
				_ = c.Close()
				continue
			}
			b.mu.Lock()
			b.cs = append(b.cs, c, u)
			b.mu.Unlock()
			go b.pipe(c, u, b.delay)
			go b.pipe(u, c, 0)
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		b.mu.Lock()
		defer b.mu.Unlock()
		for _, c := range b.cs {
			_ = c.Close()
		}
	})
	return b
}

// pipe copies src to dst, each chunk delay after it was read, until cut,
// then swallows what src sends.
func (b *blackhole) pipe(dst, src net.Conn, delay time.Duration) {
	type chunk struct {
		at   time.Time
		data []byte
	}
	q := make(chan chunk, 1<<12)
	go func() {
		for c := range q {
			time.Sleep(time.Until(c.at.Add(delay)))
			if c.data == nil {
				if !b.cut.Load() {
					_ = dst.Close()
				}
				return
			}
			if !b.cut.Load() {
				if _, err := dst.Write(c.data); err != nil {
					return
				}
			}
		}
	}()
	defer close(q)
	for {
		buf := make([]byte, 32<<10)
		n, err := src.Read(buf)
		if n > 0 {
			q <- chunk{time.Now(), buf[:n]}
		}
		if err != nil {
			if err == io.EOF {
				q <- chunk{at: time.Now()}
			}
			return
		}
	}
}

// rtPartition runs a command under acquire through a proxy, cuts the
// proxy, and has a second acquire (straight to the server) take the lease
// and record in a file whether the first command still ran at that moment.
// grace "" leaves --grace at its default. The holder's calls time out
// after 5s: with replies delay late, a shorter timeout can expire on a
// loaded machine before the first Acquire's reply, and the holder then
// waits out the session that Acquire opened before it runs its command.
// Its renewals are bounded by the TTL, not by the timeout.
func rtPartition(t *testing.T, grace, script string, delay time.Duration) {
	s := startServeProc(t)
	b := startBlackhole(t, s.addr, delay)
	flags := []string{"--ttl", "2s"}
	if grace != "" {
		flags = append(flags, "--grace", grace)
	}
	p, pid, _ := rtCommand(t, s, []string{"FENCER_SERVER=" + b.ln.Addr().String(), "FENCER_TIMEOUT=5s"}, flags, "partitioned", script)
	if delay > 0 {
		time.Sleep(3 * time.Second) // renewals answered late, then the cut
	}
	b.cut.Store(true)
	mark := filepath.Join(t.TempDir(), "seen")
	code, _, stderr := s.fencer(nil, "acquire", "--wait-timeout", "20s", "partitioned", "--",
		"sh", "-c", rtProbe(pid, mark))
	require.Equal(t, 0, code, stderr)
	require.False(t, rtProbed(t, mark), "the partitioned holder's command still ran when the next holder got the lease\n%s", p.stderr)
	require.Equal(t, rtExitLeaseLost, p.wait(t, 10*time.Second), p.stderr.String())
}

// TestRedTeamCLIPartitionedHolderStopsFirst: cut off from the server by a
// network partition, the holder's command (which honours SIGTERM) is gone
// before another acquire can hold the lease.
func TestRedTeamCLIPartitionedHolderStopsFirst(t *testing.T) {
	rtPartition(t, "1s", `echo $$ x; exec sleep 30`, 0)
}

// TestRedTeamCLISlowRepliesThenPartition: the server's replies reach the
// holder 0.8s late (TTL 2s) before the partition: the holder must count
// the TTL from when it asked for a renewal, not from when the answer came,
// and its command must be gone before the next holder runs. --grace is 0,
// so that the margin before the deadline (200ms) is smaller than the
// delay; with --grace 1s the 0.8s left after the stop would not even
// outlast one reply.
func TestRedTeamCLISlowRepliesThenPartition(t *testing.T) {
	rtPartition(t, "0s", `echo $$ x; exec sleep 30`, 800*time.Millisecond)
}

// TestRedTeamCLIPartitionedStubbornHolderStopsFirst: as above, with a
// command that ignores SIGTERM and the default --grace (a quarter of the
// TTL; a --grace longer than the TTL is refused, see
// TestRedTeamCLIBadTTLAndGrace): the SIGKILL at the end of the grace, too,
// must come before the next holder runs.
func TestRedTeamCLIPartitionedStubbornHolderStopsFirst(t *testing.T) {
	rtPartition(t, "", `trap '' TERM; echo $$ x; while :; do sleep 0.1; done`, 0)
}

// TestRedTeamCLIFencerPausedPastTTL: fencer acquire itself stopped with
// SIGSTOP past the TTL (as a debugger, a frozen cgroup or its own command
// could): its command must not still run once another acquire holds the
// lease; after SIGCONT, acquire exits 9.
func TestRedTeamCLIFencerPausedPastTTL(t *testing.T) {
	s := startServeProc(t)
	p, pid, _ := rtCommand(t, s, nil, []string{"--ttl", "2s", "--grace", "1s"}, "frozen", `echo $$ x; exec sleep 30`)
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGSTOP))
	code, _, stderr := s.fencer(nil, "acquire", "--wait-timeout", "20s", "frozen", "--", "true")
	require.Equal(t, 0, code, stderr)
	stillRan := alive(pid)
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGCONT))
	require.Equal(t, rtExitLeaseLost, p.wait(t, 10*time.Second), p.stderr.String())
	require.False(t, stillRan, "the command ran on while fencer was stopped and the lease passed to another holder")
}

// TestRedTeamCLIWatchdogPausedWhileHeld: a watchdog stopped for longer
// than the TTL, while fencer goes on renewing, reads the renewals it
// missed before it judges the session's end, so it leaves CMD running
// under the lease that is still held, and CMD's exit is acquire's. The
// watchdog is named fencer-watchdog, so pkill -STOP -x fencer, which
// stops fencer, leaves it running to stop CMD.
func TestRedTeamCLIWatchdogPausedWhileHeld(t *testing.T) {
	s := startServeProc(t)
	// A 3s TTL: with 2s, a test machine starved for 2s ended the session
	// before CMD started, which is not what this test is about.
	p, pid, _ := rtCommand(t, s, nil, []string{"--ttl", "3s", "--grace", "500ms"}, "dogpaused", `echo $$ x; sleep 6; exit 7`)
	wd, err := syscall.Getpgid(pid) // the watchdog leads CMD's process group
	require.NoError(t, err)
	comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", wd))
	require.NoError(t, err)
	require.Equal(t, "fencer-watchdog", strings.TrimSpace(string(comm)))
	require.NoError(t, syscall.Kill(wd, syscall.SIGSTOP))
	time.Sleep(4 * time.Second) // past the TTL, and several renewals
	require.NoError(t, syscall.Kill(wd, syscall.SIGCONT))
	require.Equal(t, 7, p.wait(t, 15*time.Second), "CMD's own exit: %s", p.stderr.String())
}

// TestRedTeamCLIWaiterWithLongGrace: an acquire that waited for the lease
// opens a session the server renewed while it waited, so only half the
// TTL is certain, less than --grace 1s and the 200ms for SIGKILL take
// from the 2s TTL: its command must still run, not be stopped at once.
func TestRedTeamCLIWaiterWithLongGrace(t *testing.T) {
	s := startServeProc(t)
	h, _ := rtHold(t, s, "--ttl", "2s", "longgrace")
	w := s.startFencer(nil, "acquire", "--ttl", "2s", "--grace", "1s", "longgrace", "--", "sh", "-c", "sleep 1; echo done")
	require.Eventually(t, func() bool { return strings.Contains(w.stderr.String(), "waiting for longgrace") }, printBound, 10*time.Millisecond, w.stderr.String())
	time.Sleep(1500 * time.Millisecond) // so that the server has renewed the waiter's session
	require.NoError(t, h.cmd.Process.Signal(syscall.SIGINT))
	require.Equal(t, 0, h.wait(t, 10*time.Second), h.stderr.String())
	require.Equal(t, 0, w.wait(t, 15*time.Second), w.stderr.String())
	require.Contains(t, w.stdout.String(), "done")
}

// TestRedTeamCLIBadTTLAndGrace: --ttl and --grace values (and their
// variables) that cannot fence are usage errors (exit 2), and the command
// never runs: a --grace that, with the 200ms for SIGKILL, leaves a third
// of the TTL or less for renewals cannot end before the lease's local
// deadline.
func TestRedTeamCLIBadTTLAndGrace(t *testing.T) {
	s := startServeProc(t)
	const noFit = "does not fit in --ttl"
	for i, tc := range []struct {
		env   []string
		flags []string
		says  string // in the message, if not empty
	}{
		{nil, []string{"--ttl", "0"}, ""},
		{nil, []string{"--ttl", "-2s"}, ""},
		{nil, []string{"--ttl", "500ms"}, ""},
		{nil, []string{"--ttl", "2562047h"}, "ttl"},
		{nil, []string{"--ttl", "9223372036s"}, "must be a whole number of seconds from 1s to 1h"},
		{nil, []string{"--grace", "-5s"}, "--grace -5s is negative"},
		{nil, []string{"--grace", "-1ns"}, "is negative"},
		{[]string{"FENCER_GRACE=-1h"}, nil, "is negative"},
		{[]string{"FENCER_TTL=0s"}, nil, ""},
		{[]string{"FENCER_TTL=-5s"}, nil, ""},
		{[]string{"FENCER_TTL=abc"}, nil, "FENCER_TTL"},
		{nil, []string{"--ttl", "2s", "--grace", "5s"}, noFit},
		{nil, []string{"--ttl", "2s", "--grace", "1134ms"}, "use a --grace below 1.133s"},
		{nil, []string{"--ttl", "10s", "--grace", "7s"}, noFit},
		{[]string{"FENCER_GRACE=2s"}, []string{"--ttl", "2s"}, noFit},
		{[]string{"FENCER_GRACE=abc"}, nil, "FENCER_GRACE"},
		{nil, []string{"--lock-delay", "-1s"}, "--lock-delay -1s is out of range"},
		{[]string{"FENCER_LOCK_DELAY=2h"}, nil, "--lock-delay 2h0m0s is out of range"},
	} {
		mark := filepath.Join(t.TempDir(), "ran")
		args := append(append([]string{"acquire"}, tc.flags...), "bad-"+strconv.Itoa(i), "--", "sh", "-c", "touch "+mark)
		code, _, stderr := s.fencer(tc.env, args...)
		_, err := os.Stat(mark)
		require.Equal(t, rtExitUsage, code, "%v %v: %s", tc.env, tc.flags, stderr)
		require.True(t, os.IsNotExist(err), "%v %v: the command ran", tc.env, tc.flags)
		require.Contains(t, stderr, tc.says)
	}
	// The longest --grace that fits is accepted.
	code, _, stderr := s.fencer(nil, "acquire", "--ttl", "2s", "--grace", "1133ms", "fits", "--", "true")
	require.Equal(t, 0, code, stderr)
}

// rtPgidMembers returns the pids, other than skip, in process group pgid.
func rtPgidMembers(t *testing.T, pgid int, skip ...int) []int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	require.NoError(t, err)
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || !alive(pid) {
			continue
		}
		if g, err := syscall.Getpgid(pid); err == nil && g == pgid && !contains(skip, pid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

func contains(xs []int, x int) bool {
	for _, y := range xs {
		if x == y {
			return true
		}
	}
	return false
}

// TestRedTeamCLIWatchdogKilledFirst: the watchdog in CMD's process group is
// killed (the OOM killer may pick it), so that a fencer killed next could
// leave the command's child (which no parent-death signal covers)
// running: fencer must kill the command's process group at once, child
// included, release the lease and exit 10.
func TestRedTeamCLIWatchdogKilledFirst(t *testing.T) {
	s := startServeProc(t)
	p, sleeper, _ := rtCommand(t, s, nil, []string{"--ttl", "2s", "--grace", "1s"}, "nowatchdog", `sleep 30 >/dev/null 2>&1 & echo $! x; wait`)
	pgid, err := syscall.Getpgid(sleeper)
	require.NoError(t, err)
	var dogs []int
	for _, pid := range rtPgidMembers(t, pgid) {
		if exe, _ := os.Readlink("/proc/" + strconv.Itoa(pid) + "/exe"); exe == s.bin {
			dogs = append(dogs, pid)
		}
	}
	require.NotEmpty(t, dogs, "no watchdog found in the command's process group")
	for _, d := range dogs {
		require.NoError(t, syscall.Kill(d, syscall.SIGKILL))
	}
	require.Eventually(t, func() bool { return !alive(sleeper) }, 4*time.Second, 10*time.Millisecond,
		"the command's child outlived its watchdog")
	require.Equal(t, rtExitWatchdogLost, p.wait(t, 10*time.Second), p.stderr.String())
	require.Contains(t, p.stderr.String(), "watchdog")
	code, _, stderr := s.fencer(nil, "acquire", "--wait=false", "nowatchdog", "--", "true")
	require.Equal(t, 0, code, "the lease was not released: %s", stderr)
}

// TestRedTeamCLIClosedStdio: a command that closes its standard input,
// output and error is still stopped when its lease is lost, and acquire
// exits 9.
func TestRedTeamCLIClosedStdio(t *testing.T) {
	s := startServeProc(t)
	p, pid, tok := rtCommand(t, s, nil, []string{"--ttl", "2s", "--grace", "1s"}, "closed",
		`echo $$ $FENCER_TOKEN; exec <&- >&- 2>&-; exec sleep 30`)
	code, _, stderr := s.fencer(nil, "release", "--token", tok)
	require.Equal(t, 0, code, stderr)
	require.Equal(t, rtExitLeaseLost, p.wait(t, 10*time.Second), p.stderr.String())
	require.Eventually(t, func() bool { return !alive(pid) }, 3*time.Second, 10*time.Millisecond)
}

// TestRedTeamCLILeftoverChild: a command that exits at once, leaving a
// child in its process group: the child is gone when acquire has exited.
func TestRedTeamCLILeftoverChild(t *testing.T) {
	s := startServeProc(t)
	p, pid, _ := rtCommand(t, s, nil, []string{"--ttl", "2s"}, "leftover", `sleep 30 >/dev/null 2>&1 & echo $! x`)
	require.Equal(t, 0, p.wait(t, 10*time.Second), p.stderr.String())
	require.Eventually(t, func() bool { return !alive(pid) }, 2*time.Second, 10*time.Millisecond, "the command's child outlived acquire")
}

// TestRedTeamCLITwoAcquiresExclude: three acquires of one name started at
// once never run their commands at the same time.
func TestRedTeamCLITwoAcquiresExclude(t *testing.T) {
	s := startServeProc(t)
	log := filepath.Join(t.TempDir(), "log")
	var ps []*proc
	for i := 0; i < 3; i++ {
		ps = append(ps, s.startFencer(nil, "acquire", "--ttl", "2s", "one", "--", "sh", "-c", `echo in >> `+log+`; sleep 0.5; echo out >> `+log))
	}
	for _, p := range ps {
		require.Equal(t, 0, p.wait(t, 15*time.Second), p.stderr.String())
	}
	b, err := os.ReadFile(log)
	require.NoError(t, err)
	require.Equal(t, strings.Repeat("in\nout\n", 3), string(b))
}

// TestRedTeamCLIChildUsesAcquiresServer: acquire given --server (and no
// $FENCER_SERVER) runs its command so that "fencer put" in it reaches the
// same server, fenced with no flags.
func TestRedTeamCLIChildUsesAcquiresServer(t *testing.T) {
	s := startServeProc(t)
	var out, errOut safeBuffer
	cmd := exec.Command(s.bin, "acquire", "--server", s.addr, "viaflag", "--", "sh", "-c", s.bin+` put k fromchild`)
	cmd.Env = cleanEnv()
	cmd.Stdout, cmd.Stderr = &out, &errOut
	require.Equal(t, 0, childStatus(cmd.Run()), "%s %s", &out, &errOut)
	c, v := rtGet(s, "k")
	require.Equal(t, 0, c)
	require.Equal(t, "fromchild", v)
}

// TestRedTeamCLILossNotMaskedByCleanExit: a command that exits 0 on the
// SIGTERM that follows a lost lease does not make acquire report success:
// it exits 9. Without a command, a lost lease is exit 9 as well.
func TestRedTeamCLILossNotMaskedByCleanExit(t *testing.T) {
	s := startServeProc(t)
	p, _, tok := rtCommand(t, s, nil, []string{"--ttl", "2s", "--grace", "1s"}, "clean",
		`trap 'exit 0' TERM; echo $$ $FENCER_TOKEN; while :; do sleep 0.1; done`)
	code, _, stderr := s.fencer(nil, "release", "--token", tok)
	require.Equal(t, 0, code, stderr)
	require.Equal(t, rtExitLeaseLost, p.wait(t, 10*time.Second), p.stderr.String())

	h, tok := rtHold(t, s, "--ttl", "2s", "clean")
	code, _, stderr = s.fencer(nil, "release", "--token", tok)
	require.Equal(t, 0, code, stderr)
	require.Equal(t, rtExitLeaseLost, h.wait(t, 10*time.Second), h.stderr.String())
}

// TestRedTeamCLISignalsReleaseOnlyAfterKill: fencer gets SIGHUP (then
// SIGTERM and SIGINT, an impatient user) while its command ignores them
// all: the lease must not pass to a waiting acquire while the command
// still runs.
func TestRedTeamCLISignalsReleaseOnlyAfterKill(t *testing.T) {
	s := startServeProc(t)
	p, pid, _ := rtCommand(t, s, nil, []string{"--ttl", "5s", "--grace", "2s"}, "sig",
		`trap '' HUP TERM INT; echo $$ x; while :; do sleep 0.1; done`)
	mark := filepath.Join(t.TempDir(), "seen")
	w := s.startFencer(nil, "acquire", "--wait-timeout", "20s", "sig", "--",
		"sh", "-c", rtProbe(pid, mark))
	require.Eventually(t, func() bool { return strings.Contains(w.stderr.String(), "waiting for sig") }, printBound, 10*time.Millisecond, w.stderr.String())
	for _, sig := range []syscall.Signal{syscall.SIGHUP, syscall.SIGTERM, syscall.SIGINT} {
		require.NoError(t, p.cmd.Process.Signal(sig))
		time.Sleep(100 * time.Millisecond)
	}
	require.Equal(t, 0, w.wait(t, 15*time.Second), w.stderr.String())
	require.False(t, rtProbed(t, mark), "the command still ran when the next holder got the lease\n%s", p.stderr)
	p.wait(t, 10*time.Second)
}

// rtProbe is a shell script, run as the next holder's command, that
// records in mark the state of process pid at that moment (empty if gone).
func rtProbe(pid int, mark string) string {
	return `cut -d' ' -f3 /proc/` + strconv.Itoa(pid) + `/stat > ` + mark + ` 2>/dev/null || true`
}

// rtProbed reports whether rtProbe saw the process alive (not a zombie).
func rtProbed(t *testing.T, mark string) bool {
	t.Helper()
	b, err := os.ReadFile(mark)
	require.NoError(t, err)
	st := strings.TrimSpace(string(b))
	return st != "" && st != "Z" && st != "X"
}

// TestRedTeamCLIGroupSignalsSpareWatchdog: a command that signals its own
// process group (kill 0, a common cleanup idiom) with SIGTERM, SIGHUP,
// SIGINT, SIGQUIT and SIGUSR1, which it and its child ignore, must not
// disarm the watchdog: fencer killed with SIGKILL afterwards still takes
// the child with it within the TTL.
func TestRedTeamCLIGroupSignalsSpareWatchdog(t *testing.T) {
	s := startServeProc(t)
	p, sleeper, _ := rtCommand(t, s, nil, []string{"--ttl", "2s", "--grace", "1s"}, "groupsig",
		`trap '' TERM HUP INT QUIT USR1; sleep 30 >/dev/null 2>&1 & echo $! x; for sig in TERM HUP INT QUIT USR1; do kill -$sig 0; done; echo signalled; wait`)
	require.Eventually(t, func() bool { return strings.Contains(p.stdout.String(), "signalled") }, printBound, 10*time.Millisecond, p.stderr.String())
	require.True(t, alive(sleeper))
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGKILL))
	require.Eventually(t, func() bool { return !alive(sleeper) }, 4*time.Second, 10*time.Millisecond,
		"the command's child outlived fencer (SIGKILL) after the command signalled its own group")
}

// TestRedTeamCLIWriteInGraceRefused: a command whose SIGTERM handler (run
// in the grace after its lease was lost) writes with $FENCER_TOKEN gets
// exit code 4 and writes nothing.
func TestRedTeamCLIWriteInGraceRefused(t *testing.T) {
	s := startServeProc(t)
	mark := filepath.Join(t.TempDir(), "code")
	p, _, tok := rtCommand(t, s, []string{"PATH=" + filepath.Dir(s.bin) + ":" + os.Getenv("PATH")}, []string{"--ttl", "5s", "--grace", "3s"}, "graceful",
		`trap 'fencer put k fromtrap; echo $? > `+mark+`; exit 0' TERM; echo $$ $FENCER_TOKEN; while :; do sleep 0.1; done`)
	code, _, stderr := s.fencer(nil, "release", "--token", tok)
	require.Equal(t, 0, code, stderr)
	require.Equal(t, rtExitLeaseLost, p.wait(t, 10*time.Second), p.stderr.String())
	b, err := os.ReadFile(mark)
	require.NoError(t, err, p.stderr.String())
	require.Equal(t, strconv.Itoa(rtExitStale), strings.TrimSpace(string(b)), p.stderr.String())
	c, _ := rtGet(s, "k")
	require.Equal(t, rtExitNotFound, c)
}

// TestRedTeamCLIPartitionedStubbornShortGrace: as the stubborn case, with
// --grace 1s, half the 2s TTL.
func TestRedTeamCLIPartitionedStubbornShortGrace(t *testing.T) {
	rtPartition(t, "1s", `trap '' TERM; echo $$ x; while :; do sleep 0.1; done`, 0)
}
