package main

import (
	"encoding/binary"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// monoIn is the CLOCK_MONOTONIC time d from now, as heartbeats carry it.
func monoIn(d time.Duration) int64 { return monoNow() + int64(d) }

// guardPipe runs guard on a pipe that already holds beats, and closes its
// write end once guard has read them all if closeAfter is set; it returns
// the signals guard sent.
func guardPipe(t *testing.T, grace time.Duration, closeAfter bool, beats ...int64) []syscall.Signal {
	t.Helper()
	r, w, err := os.Pipe()
	require.NoError(t, err)
	defer r.Close()
	for _, b := range beats {
		_, err := w.Write(binary.BigEndian.AppendUint64(nil, uint64(b)))
		require.NoError(t, err)
	}
	if closeAfter {
		w.Close()
	} else {
		defer w.Close()
	}
	var got []syscall.Signal
	done := make(chan struct{})
	go func() {
		defer close(done)
		guard(r, grace, func(sig syscall.Signal) { got = append(got, sig) })
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("guard did not return")
	}
	return got
}

// TestWatchdogGuard: with no heartbeat after the session's end, the
// watchdog sends SIGTERM and then SIGKILL (SIGKILL alone once the grace is
// over), and returns; told that fencer is stopping CMD itself, it sends
// only SIGKILL; a --grace shorter than watchdogLate gets SIGKILL alone;
// while heartbeats move the end on, or once fencer's pipe closes, it sends
// nothing; and heartbeats waiting in the pipe count before an end that
// has passed, as when the watchdog itself was stopped while fencer renewed.
func TestWatchdogGuard(t *testing.T) {
	both := []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL}
	kill := []syscall.Signal{syscall.SIGKILL}
	require.Equal(t, both, guardPipe(t, 2*time.Second, false, monoIn(10*time.Millisecond)))
	require.Equal(t, kill, guardPipe(t, time.Second, false, monoIn(-time.Hour)), "an end passed longer than the grace ago")
	require.Equal(t, kill, guardPipe(t, time.Second, false, monoIn(10*time.Millisecond), hbStopping))
	require.Equal(t, kill, guardPipe(t, time.Second, false, hbStopping, monoIn(10*time.Millisecond)), "the next heartbeat does not undo stopping")
	require.Equal(t, kill, guardPipe(t, 0, false, monoIn(10*time.Millisecond)))
	require.Equal(t, both, guardPipe(t, 2*time.Second, false, monoIn(time.Hour), monoIn(10*time.Millisecond)), "the latest heartbeat counts")
	require.Empty(t, guardPipe(t, time.Second, true, monoIn(time.Hour)), "heartbeats an hour ahead, then the pipe closes")
	require.Empty(t, guardPipe(t, time.Second, true, monoIn(-time.Hour), monoIn(-time.Minute), monoIn(time.Hour)),
		"ends long passed, but a later heartbeat waits in the pipe")
}
