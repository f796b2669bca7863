package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
)

// The black-box tests run the fencer binary, built once, against fencer
// serve processes, as a user would.

// printBound bounds a test's wait for a fencer process it started to print
// what it prints once it is connected, holding or waiting. It is a hang
// guard, not a claim about speed: on a loaded machine a process's first
// call alone may take up to its 10 s --timeout.
const printBound = 30 * time.Second

var (
	binOnce sync.Once
	binPath string
	binErr  error
	binDir  string
)

// fencerBinary builds the fencer binary once for the package's tests and
// returns its path; TestMain removes it.
func fencerBinary(t testing.TB) string {
	t.Helper()
	binOnce.Do(func() {
		if binDir, binErr = os.MkdirTemp("", "fencer-bin-"); binErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "fencer")
		var out []byte
		out, binErr = exec.Command("go", "build", "-o", binPath, ".").CombinedOutput()
		if binErr != nil {
			binErr = errors.New(string(out))
		}
	})
	require.NoError(t, binErr, "go build")
	return binPath
}

// removeBinary removes what fencerBinary built.
func removeBinary() {
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
}

// serveProc is a fencer serve process on an embedded etcd.
type serveProc struct {
	t       *testing.T
	bin     string
	addr    string
	metrics string // --metrics-listen; "" serves no metrics
	dataDir string
	args    []string
	cmd     *exec.Cmd
	exited  chan error
	log     *safeBuffer
}

// startServeProc runs fencer serve with extra args until the test ends
// and returns once it answers.
func startServeProc(t *testing.T, args ...string) *serveProc {
	t.Helper()
	s := &serveProc{t: t, bin: fencerBinary(t), addr: freeAddr(t), dataDir: t.TempDir(), args: args}
	s.start()
	t.Cleanup(s.stop)
	return s
}

func (s *serveProc) start() {
	s.t.Helper()
	s.log = &safeBuffer{}
	s.cmd = exec.Command(s.bin, append([]string{"serve", "--listen", s.addr, "--metrics-listen", s.metrics, "--data-dir", s.dataDir, "--shutdown-grace", "2s"}, s.args...)...)
	s.cmd.Env = cleanEnv()
	s.cmd.Stdout, s.cmd.Stderr = s.log, s.log
	require.NoError(s.t, s.cmd.Start())
	s.exited = make(chan error, 1)
	go func() { s.exited <- s.cmd.Wait() }()
	require.Eventually(s.t, func() bool {
		return strings.Contains(s.log.String(), `msg="etcd reachable: serving"`)
	}, 30*time.Second, 20*time.Millisecond, "fencer serve did not start: %s", s.log)
}

// stop stops the server with SIGTERM, if it runs.
func (s *serveProc) stop() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(20 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.exited
		s.t.Errorf("fencer serve ignored SIGTERM: %s", s.log)
	}
	s.cmd = nil
}

// cleanEnv is the test's environment without FENCER_ variables.
func cleanEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "FENCER_") {
			env = append(env, kv)
		}
	}
	return append(env, extra...)
}

// proc is a fencer client process.
type proc struct {
	cmd            *exec.Cmd
	stdout, stderr *safeBuffer
	exited         chan struct{}
	code           int
}

// startFencer starts the fencer binary with args against s.
func (s *serveProc) startFencer(env []string, args ...string) *proc {
	s.t.Helper()
	return s.startFencerIn(nil, env, args...)
}

// startFencerIn is startFencer with stdin as standard input.
func (s *serveProc) startFencerIn(stdin io.Reader, env []string, args ...string) *proc {
	s.t.Helper()
	p := &proc{stdout: &safeBuffer{}, stderr: &safeBuffer{}, exited: make(chan struct{})}
	p.cmd = exec.Command(s.bin, args...)
	p.cmd.Stdin = stdin
	p.cmd.Env = cleanEnv(append([]string{"FENCER_SERVER=" + s.addr}, env...)...)
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.stderr
	require.NoError(s.t, p.cmd.Start())
	go func() {
		err := p.cmd.Wait()
		p.code = childStatus(err)
		close(p.exited)
	}()
	s.t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.exited
	})
	return p
}

// wait waits for p to exit and returns its exit code.
func (p *proc) wait(t *testing.T, within time.Duration) int {
	t.Helper()
	select {
	case <-p.exited:
		return p.code
	case <-time.After(within):
		t.Fatalf("fencer %v still runs after %s\nstdout: %s\nstderr: %s", p.cmd.Args[1:], within, p.stdout, p.stderr)
		return -1
	}
}

// printed waits up to printBound for p to print a line on stdout, and
// fails with what p printed, and whether it exited, if it does not.
func (p *proc) printed(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(printBound)
	for !strings.Contains(p.stdout.String(), "\n") {
		if time.Now().After(deadline) {
			exited := "still runs"
			select {
			case <-p.exited:
				exited = fmt.Sprintf("exited %d", p.code)
			default:
			}
			t.Fatalf("fencer %v printed no line within %s (%s)\nstdout: %s\nstderr: %s", p.cmd.Args[1:], printBound, exited, p.stdout, p.stderr)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// fencer runs the fencer binary with args against s and returns its
// exit code and output.
func (s *serveProc) fencer(env []string, args ...string) (code int, stdout, stderr string) {
	s.t.Helper()
	p := s.startFencer(env, args...)
	code = p.wait(s.t, 30*time.Second)
	return code, p.stdout.String(), p.stderr.String()
}

// alive reports whether process pid exists and is not a zombie.
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return syscall.Kill(pid, 0) == nil // no /proc: a zombie counts as alive
	}
	// The state follows the command name, which is in parentheses.
	rest := string(b[bytes.LastIndexByte(b, ')')+1:])
	f := strings.Fields(rest)
	return len(f) > 0 && f[0] != "Z" && f[0] != "X"
}

// TestAcquireChildDiesWithFencer kills fencer acquire while its command
// runs, with SIGKILL (the kernel's parent-death signal and the watchdog
// must kill the command) and with SIGHUP and SIGTERM (fencer must pass
// them on): the command is gone within the TTL, and the lease is free
// again. The command is a shell that waits for a sleep it started, so the
// sleep, a grandchild of fencer, must be gone too.
func TestAcquireChildDiesWithFencer(t *testing.T) {
	s := startServeProc(t)
	const ttl = 2 * time.Second
	for _, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGHUP, syscall.SIGTERM} {
		for _, tc := range []struct{ name, script string }{
			{"command", "echo $$; exec sleep 30"},
			{"grandchild", "sleep 30 & echo $!; wait"},
		} {
			t.Run(sig.String()+"/"+tc.name, func(t *testing.T) {
				name := "child-" + strconv.Itoa(int(sig)) + "-" + tc.name
				p := s.startFencer(nil, "acquire", "--ttl", "2s", "--grace", "1s", name, "--", "sh", "-c", tc.script)
				require.Eventually(t, func() bool { return strings.Contains(p.stdout.String(), "\n") }, printBound, 10*time.Millisecond, p.stderr.String())
				pid, err := strconv.Atoi(strings.TrimSpace(p.stdout.String()))
				require.NoError(t, err)
				require.True(t, alive(pid))

				require.NoError(t, p.cmd.Process.Signal(sig))
				code := p.wait(t, 10*time.Second)
				if sig != syscall.SIGKILL && tc.name == "command" {
					require.Equal(t, 128+int(sig), code, "fencer exits with its command's status: %s", p.stderr)
				}
				require.Eventually(t, func() bool { return !alive(pid) }, ttl, 10*time.Millisecond,
					"the %s outlived fencer acquire, killed with %s", tc.name, sig)

				// The lease is free at once after a signal fencer handled,
				// which released it; after SIGKILL, once the session's TTL
				// and then the lock-delay (--ttl + --grace + 1s) have passed.
				code, _, stderr := s.fencer(nil, "acquire", "--wait-timeout", "15s", name, "--", "true")
				require.Equal(t, 0, code, stderr)
			})
		}
	}
}

// TestAcquireWaitsVisiblyAndBounded: acquire without a command holds the
// lease and prints its token until SIGINT; meanwhile another acquire says
// whom it waits for, --wait-timeout and --wait=false end the wait with
// exit code 5, and once the holder is interrupted the lease is released
// and the next acquire gets a greater token.
func TestAcquireWaitsVisiblyAndBounded(t *testing.T) {
	s := startServeProc(t)
	holder := s.startFencer(nil, "acquire", "jobs")
	require.Eventually(t, func() bool { return strings.HasSuffix(holder.stdout.String(), "\n") }, printBound, 10*time.Millisecond, holder.stderr.String())
	first := strings.TrimSpace(holder.stdout.String())
	require.True(t, strings.HasPrefix(first, "v1:1:"), first)

	// --wait-timeout bounds the first TryAcquire too, which can take a
	// second on a loaded machine: 3s leaves it room to see the holder.
	start := time.Now()
	code, _, stderr := s.fencer(nil, "acquire", "jobs", "--wait-timeout", "3s", "--", "true") // flags after NAME too
	require.Equal(t, exitHeld, code, stderr)
	require.GreaterOrEqual(t, time.Since(start), 3*time.Second)
	require.Regexp(t, `waiting for jobs, held by \S+`, stderr)
	require.Contains(t, stderr, "gave up waiting for jobs after --wait-timeout 3s")

	code, _, stderr = s.fencer(nil, "acquire", "--wait=false", "jobs", "--", "true")
	require.Equal(t, exitHeld, code, stderr)
	require.Contains(t, stderr, `lease "jobs" is held by`)

	waiter := s.startFencer(nil, "acquire", "jobs", "--", "sh", "-c", `echo "$FENCER_TOKEN"`)
	require.Eventually(t, func() bool { return strings.Contains(waiter.stderr.String(), "waiting for jobs") }, printBound, 10*time.Millisecond, waiter.stderr.String())
	require.NoError(t, holder.cmd.Process.Signal(syscall.SIGINT))
	require.Equal(t, 0, holder.wait(t, 10*time.Second), holder.stderr.String())
	require.Contains(t, holder.stderr.String(), "released "+first)
	require.Equal(t, 0, waiter.wait(t, 10*time.Second), waiter.stderr.String())
	require.True(t, strings.HasPrefix(waiter.stdout.String(), "v1:2:"), waiter.stdout.String())
}

// TestAcquireRidesOutAServerRestart: an acquire waiting for a held lease
// goes on waiting while fencer serve restarts, and acquires the lease once
// the holder is gone.
func TestAcquireRidesOutAServerRestart(t *testing.T) {
	s := startServeProc(t)
	holder := s.startFencer(nil, "acquire", "--ttl", "2s", "jobs")
	require.Eventually(t, func() bool { return strings.HasSuffix(holder.stdout.String(), "\n") }, printBound, 10*time.Millisecond, holder.stderr.String())
	waiter := s.startFencer(nil, "acquire", "jobs", "--", "echo", "acquired")
	require.Eventually(t, func() bool { return strings.Contains(waiter.stderr.String(), "waiting for jobs") }, printBound, 10*time.Millisecond, waiter.stderr.String())

	s.stop()
	require.NoError(t, holder.cmd.Process.Kill()) // its lease expires after its TTL
	holder.wait(t, 5*time.Second)
	s.start()

	require.Equal(t, 0, waiter.wait(t, 20*time.Second), waiter.stderr.String())
	require.Contains(t, waiter.stdout.String(), "acquired")
	require.Contains(t, waiter.stderr.String(), "; retrying")
}

// TestAcquireGivesATerminalToItsCommand runs fencer acquire on a
// terminal (a pty that is its controlling terminal, as in a shell): a
// command that reads standard input gets the foreground and reads it,
// rather than being stopped by SIGTTIN.
func TestAcquireGivesATerminalToItsCommand(t *testing.T) {
	s := startServeProc(t)
	cmd := exec.Command(s.bin, "acquire", "tty", "--", "sh", "-c", `read x; echo "got:$x"`)
	cmd.Env = cleanEnv("FENCER_SERVER=" + s.addr)
	tty, err := pty.Start(cmd) // a new session, with the pty as its controlling terminal
	require.NoError(t, err)
	defer tty.Close()
	var out safeBuffer
	go func() { _, _ = io.Copy(&out, tty) }()
	exited := make(chan int, 1)
	go func() { exited <- childStatus(cmd.Wait()) }()
	t.Cleanup(func() { _ = cmd.Process.Kill() })

	require.Eventually(t, func() bool { return strings.Contains(out.String(), "holding") }, printBound, 10*time.Millisecond, out.String())
	_, err = tty.Write([]byte("hello\n"))
	require.NoError(t, err)
	select {
	case code := <-exited:
		require.Equal(t, 0, code, out.String())
	case <-time.After(10 * time.Second):
		t.Fatalf("the command never read the terminal (stopped in the background?): %q", out.String())
	}
	require.Eventually(t, func() bool { return strings.Contains(out.String(), "got:hello") }, printBound, 10*time.Millisecond, out.String())
}

// TestAcquireSaysTheServerEndedItsSession: when another caller revokes
// acquire's session (a Release of the session; an operator's etcdctl lease
// revoke), acquire stops its command and says the server ended the
// session, not that its renewals failed.
func TestAcquireSaysTheServerEndedItsSession(t *testing.T) {
	s := startServeProc(t)
	p := s.startFencer(nil, "acquire", "--ttl", "10s", "--grace", "1s", "revoked", "--", "sh", "-c", "echo $FENCER_SESSION; exec sleep 30")
	p.printed(t)
	id, err := strconv.ParseInt(strings.TrimSpace(p.stdout.String()), 10, 64)
	require.NoError(t, err)

	cc, err := grpc.NewClient(s.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { cc.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := fencerv1.NewFencerServiceClient(cc).Release(ctx, &fencerv1.ReleaseRequest{Target: &fencerv1.ReleaseRequest_SessionId{SessionId: id}})
	require.NoError(t, err)
	require.True(t, resp.GetReleased())

	require.Equal(t, exitLeaseLost, p.wait(t, 10*time.Second), p.stderr.String())
	require.Contains(t, p.stderr.String(), "the server ended its session")
	require.NotContains(t, p.stderr.String(), "no renewal succeeded")
}

// TestAcquireStopsItsCommandWhenTheServerIsGone: with fencer serve killed
// (no renewal can succeed), acquire fails closed: it stops its command
// once the TTL has passed since the last renewal, before the lease could
// be anyone else's, and exits 9.
func TestAcquireStopsItsCommandWhenTheServerIsGone(t *testing.T) {
	s := startServeProc(t)
	p := s.startFencer(nil, "acquire", "--ttl", "2s", "--grace", "1s", "partitioned", "--", "sh", "-c", "echo $$; exec sleep 30")
	require.Eventually(t, func() bool { return strings.Contains(p.stdout.String(), "\n") }, printBound, 10*time.Millisecond, p.stderr.String())
	pid, err := strconv.Atoi(strings.TrimSpace(p.stdout.String()))
	require.NoError(t, err)

	require.NoError(t, s.cmd.Process.Kill())
	<-s.exited
	s.cmd = nil
	killed := time.Now()
	require.Equal(t, exitLeaseLost, p.wait(t, 10*time.Second), p.stderr.String())
	require.False(t, alive(pid))
	require.Contains(t, p.stderr.String(), "no renewal succeeded within the TTL")
	t.Logf("command stopped %s after the server was killed (TTL 2s)", time.Since(killed).Round(time.Millisecond))
}
