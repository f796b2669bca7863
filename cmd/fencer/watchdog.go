package main

import (
	"encoding/binary"
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
	d := &watchdog{w: w, cmd: cmd, done: make(chan struct{})}
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
		fired = fired || b[0] == wdFired
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

// heartbeat tells the watchdog that the session now ends at end, unless
// renewed. The write is bounded: a watchdog that does not read (stopped)
// cannot hold up the session's renewals.
func (d *watchdog) heartbeat(end time.Time) {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	// Read before time.Until, so the sum is never later than end.
	d.send(ts.Nano() + int64(time.Until(end)))
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
// started as one, and never returns then: it ignores every signal that
// can be ignored (whatever the command or a terminal sends its group,
// SIGUSR1 and SIGPIPE included), says wdReady on descriptor 4, guards the
// group with the heartbeats read on descriptor 3 until end of file there
// or until it stopped the group itself, and kills its process group,
// itself included.
func runWatchdogIfAsked() {
	v, ok := os.LookupEnv(watchdogEnv)
	if !ok {
		return
	}
	signal.Ignore()
	grace, err := time.ParseDuration(v)
	if err != nil {
		grace = 0
	}
	says := os.NewFile(4, "says")
	_, _ = says.Write([]byte{wdReady})
	beats := make(chan int64)
	go readHeartbeats(os.NewFile(3, "fencer"), beats)
	guard(beats, grace, func(sig syscall.Signal) {
		_, _ = says.Write([]byte{wdFired})
		_ = syscall.Kill(-syscall.Getpgrp(), sig)
	})
	_ = syscall.Kill(-syscall.Getpgrp(), syscall.SIGKILL)
	os.Exit(0)
}

// readHeartbeats sends each number fencer writes on r to beats, and closes
// beats at end of file.
func readHeartbeats(r io.Reader, beats chan<- int64) {
	defer close(beats)
	b := make([]byte, 8)
	for {
		if _, err := io.ReadFull(r, b); err != nil {
			return
		}
		beats <- int64(binary.BigEndian.Uint64(b))
	}
}

// guard follows the heartbeats until beats closes (fencer's pipe ended)
// or the session's end has passed with no heartbeat since: then it has
// signalled the group (SIGTERM watchdogLate after the end, unless fencer
// said it stops CMD itself, and SIGKILL --grace after the end, at least
// watchdogLate) and returns. Once the time for SIGKILL has come, no
// SIGTERM is sent any more: the grace is over.
func guard(beats <-chan int64, grace time.Duration, act func(syscall.Signal)) {
	var term, kill <-chan time.Time // nil: no end known yet
	var termT, killT *time.Timer
	stopping := false
	defer func() {
		if termT != nil {
			termT.Stop()
			killT.Stop()
		}
	}()
	for {
		select {
		case <-kill:
			act(syscall.SIGKILL)
			return
		default:
		}
		select {
		case v, ok := <-beats:
			switch {
			case !ok:
				return
			case v == hbStopping:
				stopping = true
				term = nil
				continue
			}
			if termT != nil {
				termT.Stop()
				killT.Stop()
			}
			var ts unix.Timespec
			_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
			left := time.Duration(v - ts.Nano())
			termT = time.NewTimer(left + watchdogLate)
			killT = time.NewTimer(left + max(grace, watchdogLate))
			term, kill = termT.C, killT.C
			if stopping || grace <= watchdogLate {
				term = nil
			}
		case <-term:
			term = nil
			act(syscall.SIGTERM)
		case <-kill:
			act(syscall.SIGKILL)
			return
		}
	}
}
