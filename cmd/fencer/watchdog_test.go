package main

import (
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// monoIn is the CLOCK_MONOTONIC time d from now, as heartbeats carry it.
func monoIn(d time.Duration) int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano() + int64(d)
}

// TestWatchdogGuard: with no heartbeat after the session's end, the
// watchdog sends SIGTERM and then SIGKILL (SIGKILL alone once the grace is
// over), and returns; told that fencer
// is stopping CMD itself, it sends only SIGKILL; a --grace shorter than
// watchdogLate gets SIGKILL alone; while heartbeats move the end on, or
// once fencer's pipe closes, it sends nothing.
func TestWatchdogGuard(t *testing.T) {
	run := func(grace time.Duration, beats ...int64) []syscall.Signal {
		ch := make(chan int64, len(beats))
		for _, b := range beats {
			ch <- b
		}
		var got []syscall.Signal
		done := make(chan struct{})
		go func() {
			defer close(done)
			guard(ch, grace, func(sig syscall.Signal) { got = append(got, sig) })
		}()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Fatal("guard did not return")
		}
		return got
	}
	both := []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL}
	kill := []syscall.Signal{syscall.SIGKILL}
	require.Equal(t, both, run(2*time.Second, monoIn(10*time.Millisecond)))
	require.Equal(t, kill, run(time.Second, monoIn(-time.Hour)), "an end passed longer than the grace ago")
	require.Equal(t, kill, run(time.Second, monoIn(10*time.Millisecond), hbStopping))
	require.Equal(t, kill, run(time.Second, hbStopping, monoIn(10*time.Millisecond)), "the next heartbeat does not undo stopping")
	require.Equal(t, kill, run(0, monoIn(10*time.Millisecond)))
	require.Equal(t, both, run(2*time.Second, monoIn(time.Hour), monoIn(10*time.Millisecond)), "the latest heartbeat counts")

	// Heartbeats an hour ahead, then the pipe closes: nothing is sent.
	ch := make(chan int64, 1)
	ch <- monoIn(time.Hour)
	close(ch)
	var got []syscall.Signal
	guard(ch, time.Second, func(sig syscall.Signal) { got = append(got, sig) })
	require.Empty(t, got)
}
