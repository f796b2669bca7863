package main

import (
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

// startWatchdog starts a watchdog in process group pgid, which must exist.
func startWatchdog(pgid int) (*watchdog, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), watchdogEnv+"=1")
	cmd.ExtraFiles = []*os.File{r}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pgid: pgid}
	if err := cmd.Start(); err != nil {
		w.Close()
		return nil, err
	}
	return &watchdog{w: w, cmd: cmd}, nil
}

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
// started as one, and never returns then: it ignores the signals a
// terminal or fencer sends the group, waits for end of file on descriptor
// 3, and kills its process group, itself included.
func runWatchdogIfAsked() {
	if os.Getenv(watchdogEnv) != "1" {
		return
	}
	signal.Ignore(syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGTSTP, syscall.SIGTTIN, syscall.SIGTTOU)
	_, _ = io.Copy(io.Discard, os.NewFile(3, "fencer"))
	_ = syscall.Kill(-syscall.Getpgrp(), syscall.SIGKILL)
	os.Exit(0)
}
