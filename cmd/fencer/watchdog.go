package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// watchdogEnv marks a fencer process started as a watchdog, and holds
// --grace; see startWatchdog.
const watchdogEnv = "FENCER_INTERNAL_WATCHDOG"

// What the watchdog and fencer say to each other. fencer writes 8-byte
// big-endian numbers on the heartbeat pipe: each positive one is the time
// at which the session ends unless renewed (on CLOCK_MONOTONIC, which all
// processes of a machine share), hbStopping says that fencer is stopping
// CMD itself. The watchdog writes one byte on the other pipe: wdReady once
// it ignores signals, wdFired when it stops CMD on its own clock.
const (
	hbStopping int64 = -1
	wdReady    byte  = 1
	wdFired    byte  = 2
)

// watchdogLate is how long after the session's end the watchdog stops CMD
// itself: a running fencer has said it stops CMD by then (hbStopping), so
// CMD gets SIGTERM once. It is less than killMargin, so the watchdog's
// SIGKILL still comes before the lease's local deadline.
const watchdogLate = killMargin / 2

// watchdog is a fencer process in CMD's process group. It kills the whole
// group with SIGKILL once fencer closes its end of the heartbeat pipe, or
// dies: the kernel closes a dead process's files, however it died. So
// processes that CMD started (sh -c 'a; b', a daemon) never outlive fencer
// acquire either, which the parent-death signal alone does not ensure: it
// reaches CMD only. It also keeps the session's end on its own clock, fed by
// fencer's heartbeats, and stops the group itself (SIGTERM, SIGKILL after
// --grace, both before the lease's local deadline) when no heartbeat has
// moved the end on in time: so a stopped fencer (SIGSTOP, a frozen cgroup)
// does not keep CMD running either.
//
// Invariants: CMD starts only after the watchdog ignores signals; done is
// closed only after the watchdog has exited and fired is final; w is nil
// once closed, and every write to it holds mu.
type watchdog struct {
	cmd   *exec.Cmd
	mu    sync.Mutex
	w     *os.File      // fencer's end of the heartbeat pipe
	done  chan struct{} // closed once the watchdog has exited and was reaped
	fired bool          // it said wdFired; read only after done
	said  chan struct{} // closed as soon as it says wdFired
}

// startWatchdog starts a watchdog as the leader of a new process group,
// and returns once the watchdog ignores signals, so that nothing sent to
// the group can end it early. CMD is then started in that group (pgid).
// grace is CMD's --grace.
func startWatchdog(grace time.Duration) (*watchdog, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	saysR, saysW, err := os.Pipe()
	if err != nil {
		w.Close()
		return nil, err
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), watchdogEnv+"="+grace.String())
	cmd.ExtraFiles = []*os.File{r, saysW}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	err = cmd.Start()
	saysW.Close()
	if err != nil {
		w.Close()
		saysR.Close()
		return nil, err
	}
	d := &watchdog{w: w, cmd: cmd, done: make(chan struct{}), said: make(chan struct{})}
	// The watchdog says wdReady once it ignores signals; end of file
	// before that means it died first.
	_ = saysR.SetReadDeadline(time.Now().Add(10 * time.Second))
	b := make([]byte, 1)
	_, err = io.ReadFull(saysR, b)
	_ = saysR.SetReadDeadline(time.Time{})
	go d.follow(saysR)
	if err != nil || b[0] != wdReady {
		_ = cmd.Process.Kill()
		d.fire()
		return nil, fmt.Errorf("the watchdog did not start: %v", err)
	}
	return d, nil
}

// follow reads what the watchdog says until it exits, reaps it and closes
// done.
func (d *watchdog) follow(says *os.File) {
	b := make([]byte, 1)
	fired := false
	for {
		if _, err := says.Read(b); err != nil {
			break
		}
		if b[0] == wdFired && !fired {
			fired = true
			close(d.said)
		}
	}
	says.Close()
	_ = d.cmd.Wait()
	d.fired = fired
	close(d.done)
}

// pgid is the process group the watchdog leads, CMD's.
func (d *watchdog) pgid() int { return d.cmd.Process.Pid }

// Done is closed once the watchdog has exited.
func (d *watchdog) Done() <-chan struct{} { return d.done }

// Fired reports, once Done is closed, whether the watchdog stopped CMD
// because no heartbeat came before the session's end.
func (d *watchdog) Fired() bool {
	<-d.done
	return d.fired
}

// stoppedCMD reports whether the watchdog has said it stopped CMD on its
// own clock, waiting up to wait for it to say so: it says so before it
// signals the group, so once CMD has died of its signal the word is on
// its way. With no watchdog it reports false.
func (d *watchdog) stoppedCMD(wait time.Duration) bool {
	if d == nil {
		return false
	}
	select {
	case <-d.said:
		return true
	default:
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-d.said:
		return true
	case <-t.C:
		return false
	}
}

// heartbeat tells the watchdog that the session now ends at end, unless
// renewed. The write is bounded: a watchdog that does not read (stopped)
// cannot hold up the session's renewals.
func (d *watchdog) heartbeat(end time.Time) {
	now := monoNow() // read before time.Until, so the sum is never later than end
	d.send(now + int64(time.Until(end)))
}

// stopping tells the watchdog that fencer is stopping CMD itself, so it
// sends no SIGTERM of its own.
func (d *watchdog) stopping() { d.send(hbStopping) }

// send writes v on the heartbeat pipe; with no watchdog (d nil), or once
// fire closed the pipe, it does nothing.
func (d *watchdog) send(v int64) {
	if d == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.w == nil {
		return
	}
	_ = d.w.SetWriteDeadline(time.Now().Add(time.Second))
	_, _ = d.w.Write(binary.BigEndian.AppendUint64(nil, uint64(v)))
}

// fire makes the watchdog kill what is left of CMD's process group, and
// waits a moment for it to have done so.
func (d *watchdog) fire() {
	d.mu.Lock()
	if d.w != nil {
		d.w.Close()
		d.w = nil
	}
	d.mu.Unlock()
	select {
	case <-d.done:
	case <-time.After(5 * time.Second):
		_ = d.cmd.Process.Kill()
		<-d.done
	}
}

// runWatchdogIfAsked turns this process into a watchdog, if it was
// started as one, and never returns then: it names itself
// fencer-watchdog (so that pkill -STOP -x fencer leaves it running),
// ignores every signal that can be ignored (whatever the command or a
// terminal sends its group, SIGUSR1 and SIGPIPE included), says wdReady on
// descriptor 4, guards the group with the heartbeats read on descriptor 3
// until end of file there or until it stopped the group itself, and kills
// its process group, itself included.
func runWatchdogIfAsked() {
	v, ok := os.LookupEnv(watchdogEnv)
	if !ok {
		return
	}
	signal.Ignore()
	_ = os.WriteFile("/proc/self/comm", []byte(watchdogName), 0)
	grace, err := time.ParseDuration(v)
	if err != nil {
		grace = 0
	}
	says := os.NewFile(4, "says")
	_, _ = says.Write([]byte{wdReady})
	guard(os.NewFile(3, "fencer"), grace, func(sig syscall.Signal) {
		_, _ = says.Write([]byte{wdFired})
		_ = syscall.Kill(-syscall.Getpgrp(), sig)
	})
	_ = syscall.Kill(-syscall.Getpgrp(), syscall.SIGKILL)
	os.Exit(0)
}

// watchdogName is the watchdog's process name (at most 15 bytes, the
// kernel's limit).
const watchdogName = "fencer-watchdog"

// guard follows the heartbeats fencer writes on r until r ends (fencer's
// pipe closed) or the session's end has passed with no heartbeat since:
// then it has signalled the group (SIGTERM watchdogLate after the end,
// unless fencer said it stops CMD itself, and SIGKILL --grace after the
// end, at least watchdogLate) and returns. Once the time for SIGKILL has
// come, no SIGTERM is sent any more: the grace is over.
//
// Heartbeats waiting in the pipe always count before a deadline does: a
// watchdog that was stopped itself, while fencer went on renewing, reads
// the renewals it missed before it judges the session's end, so it does
// not stop CMD under a lease that is still held.
func guard(r *os.File, grace time.Duration, act func(syscall.Signal)) {
	fd := int(r.Fd())
	var termAt, killAt int64 // CLOCK_MONOTONIC nanoseconds; 0: no end known yet
	stopping := false
	var pending []byte // a heartbeat read in part
	buf := make([]byte, 8*64)
	for {
		timeout := -1 // no end known: wait for a heartbeat
		if killAt != 0 {
			next := killAt
			if termAt != 0 {
				next = min(next, termAt)
			}
			timeout = int(max(0, time.Duration(next-monoNow()).Milliseconds()+1))
		}
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, timeout)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if n > 0 {
			m, err := r.Read(buf)
			if err != nil {
				return // fencer's end closed: the caller kills the group
			}
			pending = append(pending, buf[:m]...)
			for len(pending) >= 8 {
				v := int64(binary.BigEndian.Uint64(pending))
				pending = pending[8:]
				if v == hbStopping {
					stopping, termAt = true, 0
					continue
				}
				termAt, killAt = v+int64(watchdogLate), v+int64(max(grace, watchdogLate))
				if stopping || grace <= watchdogLate {
					termAt = 0
				}
			}
			continue
		}
		now := monoNow()
		switch {
		case killAt != 0 && now >= killAt:
			act(syscall.SIGKILL)
			return
		case termAt != 0 && now >= termAt:
			termAt = 0
			act(syscall.SIGTERM)
		}
	}
}

// monoNow is the CLOCK_MONOTONIC time in nanoseconds, which all processes
// of a machine share.
func monoNow() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}
