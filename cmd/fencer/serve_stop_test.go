package main

import (
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// storageVersionRetry is how long after a new member's start etcd's
// storage-version monitor has tried again (it tries every 4 s), so that a
// failure at start that repeats has been logged.
const storageVersionRetry = 5 * time.Second

// TestServeStartsCleanAndStopsOnSignals starts fencer serve on fresh data
// directories, as a first `make run` does, several at once (the
// storage-version race at start is timing-dependent), and stops them with
// SIGINT (Ctrl-C) and SIGTERM: no ERROR line is logged from start to
// stop, each logs "stopped" and exits 0.
func TestServeStartsCleanAndStopsOnSignals(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGINT, syscall.SIGTERM} {
		t.Run(sig.String(), func(t *testing.T) {
			t.Parallel()
			s := startServeProc(t)
			time.Sleep(storageVersionRetry)
			require.NoError(t, s.cmd.Process.Signal(sig))
			code := s.waitExit(t)
			logs := s.log.String()
			require.Equal(t, 0, code, "fencer serve exited %d on %s:\n%s", code, sig, logs)
			require.Contains(t, logs, `level=INFO msg=stopped`)
			require.NotContains(t, logs, "level=ERROR", "a clean start and stop logged an error")
		})
	}
}

// TestServeInterruptedWhileStartingExitsZero interrupts fencer serve
// while its embedded etcd starts: the member is stopped, and fencer serve
// logs "stopped" and exits 0, as after a full start.
func TestServeInterruptedWhileStartingExitsZero(t *testing.T) {
	s := &serveProc{t: t, bin: fencerBinary(t), addr: freeAddr(t), dataDir: t.TempDir(), log: &safeBuffer{}}
	s.cmd = exec.Command(s.bin, "serve", "--listen", s.addr, "--metrics-listen", "", "--data-dir", s.dataDir)
	s.cmd.Env = cleanEnv()
	s.cmd.Stdout, s.cmd.Stderr = s.log, s.log
	require.NoError(t, s.cmd.Start())
	s.exited = make(chan error, 1)
	go func() { s.exited <- s.cmd.Wait() }()
	t.Cleanup(s.stop)
	// Its first line is etcd's, from configuring the member.
	require.Eventually(t, func() bool { return s.log.String() != "" }, printBound, 5*time.Millisecond, "fencer serve printed nothing")
	require.NoError(t, s.cmd.Process.Signal(syscall.SIGINT))
	code := s.waitExit(t)
	logs := s.log.String()
	require.Equal(t, 0, code, "fencer serve exited %d:\n%s", code, logs)
	require.True(t, strings.HasSuffix(logs, "level=INFO msg=stopped\n"), "the last line is not \"stopped\":\n%s", logs)
}

// waitExit waits for the serve process, already signalled, to exit, and
// returns its exit code.
func (s *serveProc) waitExit(t *testing.T) int {
	t.Helper()
	select {
	case err := <-s.exited:
		s.cmd = nil
		return childStatus(err)
	case <-time.After(printBound):
		t.Fatalf("fencer serve still runs %s after the signal:\n%s", printBound, s.log)
		return -1
	}
}
