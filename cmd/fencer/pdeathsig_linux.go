package main

import "syscall"

// setParentDeathSignal makes the kernel SIGKILL the child when the thread
// that started it ends, which start keeps alive as long as fencer runs:
// so CMD dies with fencer, even when fencer is killed with SIGKILL.
func setParentDeathSignal(attr *syscall.SysProcAttr) { attr.Pdeathsig = syscall.SIGKILL }
