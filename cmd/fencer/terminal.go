package main

import (
	"os/signal"
	"syscall"

	"golang.org/x/sys/unix"
)

// terminalForeground makes attr start the child as the terminal's
// foreground process group when standard input is a terminal whose
// foreground group is fencer's own, so that a child reading standard input
// (cat, read, an interactive shell) is not stopped by SIGTTIN. It reports
// whether it did; the caller then gives the terminal back with
// reclaimTerminal once the child has exited. In the background (fencer
// run with &), the child stays in the background too.
func terminalForeground(attr *syscall.SysProcAttr) bool {
	fg, err := unix.IoctlGetInt(0, unix.TIOCGPGRP)
	if err != nil || fg != syscall.Getpgrp() {
		return false
	}
	attr.Foreground, attr.Ctty = true, 0
	return true
}

// reclaimTerminal makes fencer's process group the terminal's foreground
// group again. fencer is then in the background, where changing it would
// stop fencer with SIGTTOU unless that is ignored.
func reclaimTerminal() {
	signal.Ignore(syscall.SIGTTOU)
	_ = unix.IoctlSetPointerInt(0, unix.TIOCSPGRP, syscall.Getpgrp())
}
