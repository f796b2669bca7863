package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"
)

// watchdogEnv marks a fencer process started as a watchdog; see
// startWatchdog.
const watchdogEnv = "FENCER_INTERNAL_WATCHDOG"

// watchdog is a fencer process in CMD's process group that kills the whole
// group with SIGKILL once fencer closes its end of a pipe, or dies: the
// kernel closes a dead process's files, however it died. So processes that
// CMD started (sh -c 'a; b', a daemon) never outlive fencer acquire either,
// which the parent-death signal alone does not ensure: it reaches CMD only.
type watchdog struct {
	w   *os.File
	cmd *exec.Cmd
}

// startWatchdog starts a watchdog as the leader of a new process group,
// and returns once the watchdog ignores signals, so that nothing sent to
// the group can end it early. CMD is then started in that group (pgid).
func startWatchdog() (*watchdog, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	readyR, readyW, err := os.Pipe()
	if err != nil {
		w.Close()
		return nil, err
	}
	defer readyR.Close()
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), watchdogEnv+"=1")
	cmd.ExtraFiles = []*os.File{r, readyW}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	err = cmd.Start()
	readyW.Close()
	if err != nil {
		w.Close()
		return nil, err
	}
	d := &watchdog{w: w, cmd: cmd}
	// The watchdog closes its end once it ignores signals; end of file
	// without that byte means it died first.
	_ = readyR.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(readyR, make([]byte, 1)); err != nil {
		_ = cmd.Process.Kill()
		d.fire()
		return nil, fmt.Errorf("the watchdog did not start: %w", err)
	}
	return d, nil
}

// pgid is the process group the watchdog leads, CMD's.
func (d *watchdog) pgid() int { return d.cmd.Process.Pid }

// fire makes the watchdog kill what is left of CMD's process group, and
// waits a moment for it to have done so.
func (d *watchdog) fire() {
	d.w.Close()
	done := make(chan struct{})
	go func() {
		_ = d.cmd.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = d.cmd.Process.Kill()
		<-done
	}
}

// runWatchdogIfAsked turns this process into a watchdog, if it was
// started as one, and never returns then: it ignores every signal that
// can be ignored (whatever the command or a terminal sends its group,
// SIGUSR1 and SIGPIPE included), says so on descriptor 4, waits for end of
// file on descriptor 3, and kills its process group, itself included.
func runWatchdogIfAsked() {
	if os.Getenv(watchdogEnv) != "1" {
		return
	}
	signal.Ignore()
	ready := os.NewFile(4, "ready")
	_, _ = ready.Write([]byte{1})
	ready.Close()
	_, _ = io.Copy(io.Discard, os.NewFile(3, "fencer"))
	_ = syscall.Kill(-syscall.Getpgrp(), syscall.SIGKILL)
	os.Exit(0)
}
