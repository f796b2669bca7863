package main

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// downServer is a serveProc whose address nobody serves: the fencer
// commands run against it find no server.
func downServer(t *testing.T) *serveProc {
	t.Helper()
	return &serveProc{t: t, bin: fencerBinary(t), addr: freeAddr(t)}
}

// TestAcquireWaitAgainstUnreachableServerIsUnavailable: an acquire whose
// --wait-timeout ends while the server cannot be reached exits 7
// (unavailable), naming the server and saying it could not reach it for
// the whole wait, not 5 (held): a script reads 5 as "another replica has
// it".
func TestAcquireWaitAgainstUnreachableServerIsUnavailable(t *testing.T) {
	s := downServer(t)
	code, _, stderr := s.fencer(nil, "acquire", "orders", "--wait-timeout", "2s", "--", "true")
	require.Equal(t, exitUnavailable, code, stderr)
	require.Contains(t, stderr, "gave up waiting for orders after --wait-timeout 2s, having failed to reach the server for the whole wait: cannot reach fencer at "+s.addr)
	require.Equal(t, 1, strings.Count(stderr, "; retrying"), stderr)
	requireNoLeaks(t, stderr)
}

// TestAcquireWaitEndsWhileServerIsGone: an acquire waiting for a held
// lease, whose server goes away and stays away until --wait-timeout
// ends, exits 7 and says for how long it could not reach the server; the
// same wait against a server that answers to the end exits 5.
func TestAcquireWaitEndsWhileServerIsGone(t *testing.T) {
	s := startServeProc(t)
	holder := s.startFencer(nil, "acquire", "jobs")
	require.Eventually(t, func() bool { return strings.HasSuffix(holder.stdout.String(), "\n") }, printBound, 10*time.Millisecond, holder.stderr.String())
	waiter := s.startFencer(nil, "acquire", "--wait-timeout", "8s", "jobs", "--", "true")
	require.Eventually(t, func() bool { return strings.Contains(waiter.stderr.String(), "waiting for jobs") }, printBound, 10*time.Millisecond, waiter.stderr.String())
	s.stop()
	require.Equal(t, exitUnavailable, waiter.wait(t, 20*time.Second), waiter.stderr.String())
	require.Regexp(t, `gave up waiting for jobs after --wait-timeout 8s, having failed to reach the server for the last [0-9.]+m?s of it \(held by \S+ before\): cannot reach fencer at `, waiter.stderr.String())
	requireNoLeaks(t, waiter.stderr.String())
}

// TestReconnectTimeoutBoundsAcquireAndWatch: acquire without
// --wait-timeout and watch retry an unreachable server only for
// --reconnect-timeout (or $FENCER_RECONNECT_TIMEOUT), saying once that
// they retry, and then exit 7 naming the server and the bound.
func TestReconnectTimeoutBoundsAcquireAndWatch(t *testing.T) {
	s := downServer(t)
	for _, tc := range []struct {
		name string
		env  []string
		args []string
	}{
		{"acquire", nil, []string{"acquire", "--reconnect-timeout", "2s", "orders", "--", "true"}},
		{"acquire without a command", []string{"FENCER_RECONNECT_TIMEOUT=2s"}, []string{"acquire", "orders"}},
		{"watch", nil, []string{"watch", "--session", "5", "--reconnect-timeout", "2s"}},
		{"watch, from the environment", []string{"FENCER_RECONNECT_TIMEOUT=2s", "FENCER_SESSION=5"}, []string{"watch"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := s.startFencer(tc.env, tc.args...)
			require.Equal(t, exitUnavailable, p.wait(t, 15*time.Second), p.stderr.String())
			stderr := p.stderr.String()
			prefix := "fencer " + tc.args[0] + ": cannot reach fencer at " + s.addr
			require.Equal(t, 2, strings.Count(stderr, prefix), stderr)
			require.Equal(t, 1, strings.Count(stderr, "; retrying\n"), stderr)
			require.Contains(t, stderr, "; gave up after --reconnect-timeout 2s\n")
			requireNoLeaks(t, stderr)
		})
	}
}

// TestAcquireInterruptedWhileWaiting: an acquire waiting for a held lease
// (or for a server it cannot reach) that gets SIGINT, SIGTERM or SIGHUP
// exits 128+N, as a shell reports a command ended by signal N, and says
// so.
func TestAcquireInterruptedWhileWaiting(t *testing.T) {
	s := startServeProc(t)
	rtHold(t, s, "busy")
	for _, tc := range []struct {
		sig  syscall.Signal
		name string
	}{{syscall.SIGINT, "SIGINT"}, {syscall.SIGTERM, "SIGTERM"}, {syscall.SIGHUP, "SIGHUP"}} {
		t.Run(tc.name, func(t *testing.T) {
			w := s.startFencer(nil, "acquire", "busy", "--", "true")
			require.Eventually(t, func() bool { return strings.Contains(w.stderr.String(), "waiting for busy") }, printBound, 10*time.Millisecond, w.stderr.String())
			require.NoError(t, w.cmd.Process.Signal(tc.sig))
			require.Equal(t, 128+int(tc.sig), w.wait(t, 10*time.Second), w.stderr.String())
			require.Contains(t, w.stderr.String(), "fencer acquire: interrupted by "+tc.name+"\n")
		})
	}
	t.Run("while the server cannot be reached", func(t *testing.T) {
		w := downServer(t).startFencer(nil, "acquire", "busy", "--", "true")
		require.Eventually(t, func() bool { return strings.Contains(w.stderr.String(), "; retrying") }, printBound, 10*time.Millisecond, w.stderr.String())
		require.NoError(t, w.cmd.Process.Signal(syscall.SIGINT))
		require.Equal(t, 128+int(syscall.SIGINT), w.wait(t, 10*time.Second), w.stderr.String())
	})
}

// TestAcquireSaysWhenItKillsItsCommand: a command that ignores the
// SIGTERM that fencer passes on is killed after --grace, and fencer says
// so on standard error.
func TestAcquireSaysWhenItKillsItsCommand(t *testing.T) {
	s := startServeProc(t)
	p, pid, _ := rtCommand(t, s, nil, []string{"--grace", "1s"}, "stubborn-term",
		`trap '' TERM; echo $$ x; while :; do sleep 0.1; done`)
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	require.Equal(t, 128+int(syscall.SIGKILL), p.wait(t, 10*time.Second), p.stderr.String())
	require.False(t, alive(pid))
	require.Contains(t, p.stderr.String(), "fencer acquire: sh did not exit within --grace 1s of SIGTERM; sent SIGKILL to its process group\n")
}

// TestFlagValuesThatDoNotParse: a flag or variable value that does not
// parse is a usage error (exit 2) naming the flag (or variable) and the
// form it wants, without the parser's own text.
func TestFlagValuesThatDoNotParse(t *testing.T) {
	s := downServer(t)
	for _, tc := range []struct {
		env  []string
		args []string
		msg  string
	}{
		{nil, []string{"watch", "--session", "nope"}, `invalid --session "nope": want a whole number, e.g. --session 5`},
		{nil, []string{"watch", "--session", "-3"}, `invalid --session -3: want a session id, a whole number above 0`},
		{[]string{"FENCER_SESSION=nope"}, []string{"watch"}, `$FENCER_SESSION="nope": want a whole number, e.g. FENCER_SESSION=5 (the variable of --session)`},
		{nil, []string{"watch", "--session", "5", "--reconnect-timeout", "1"}, `invalid --reconnect-timeout "1": want a duration with its unit`},
		{nil, []string{"watch", "--session", "5", "--reconnect-timeout", "-1s"}, `--reconnect-timeout -1s is negative`},
		{nil, []string{"acquire", "--reconnect-timeout", "-1s", "x"}, `--reconnect-timeout -1s is negative`},
		{nil, []string{"acquire", "--ttl", "5", "x"}, `invalid --ttl "5": want a duration with its unit (ns, us, ms, s, m, h), e.g. --ttl 10s`},
		{nil, []string{"acquire", "--wait-timeout", "soon", "x"}, `invalid --wait-timeout "soon"`},
		{nil, []string{"acquire", "--grace", "x", "x"}, `invalid --grace "x"`},
		{nil, []string{"acquire", "--wait=maybe", "x"}, `invalid --wait "maybe": want true or false, e.g. --wait=true`},
		{[]string{"FENCER_TTL=10"}, []string{"acquire", "x"}, `$FENCER_TTL="10": want a duration with its unit`},
		{[]string{"FENCER_TIMEOUT=soon"}, []string{"status"}, `$FENCER_TIMEOUT="soon": want a duration`},
		{nil, []string{"status", "--timeout", "soon"}, `invalid --timeout "soon"`},
		{nil, []string{"bench", "--clients", "many"}, `invalid --clients "many": want a whole number`},
		{nil, []string{"bench", "--duration", "3"}, `invalid --duration "3"`},
		{nil, []string{"serve", "--batch", "x"}, `invalid --batch "x": want a whole number`},
		{nil, []string{"serve", "--etcd-quota-bytes", "2G"}, `invalid --etcd-quota-bytes "2G"`},
	} {
		t.Run(strings.Join(append(tc.env, tc.args...), " "), func(t *testing.T) {
			code, _, stderr := s.fencer(tc.env, tc.args...)
			require.Equal(t, exitUsage, code, stderr)
			require.Contains(t, stderr, "fencer "+tc.args[0]+": "+tc.msg)
			for _, leak := range []string{"strconv", "time: ", "ParseInt", "invalid syntax", "invalid argument"} {
				require.NotContains(t, stderr, leak)
			}
		})
	}
}

// TestAcquirePassesReconnectTimeoutOn: CMD gets acquire's
// --reconnect-timeout in $FENCER_RECONNECT_TIMEOUT, so that a fencer watch
// it runs gives up on the server when acquire would.
func TestAcquirePassesReconnectTimeoutOn(t *testing.T) {
	s := startServeProc(t)
	code, stdout, stderr := s.fencer(nil, "acquire", "--reconnect-timeout", "7s", "env", "--", "sh", "-c", `echo "$FENCER_RECONNECT_TIMEOUT"`)
	require.Equal(t, 0, code, stderr)
	require.Equal(t, "7s\n", stdout)
}
