//go:build !linux

package main

import "syscall"

// setParentDeathSignal does nothing: only Linux has a parent-death signal,
// so elsewhere CMD survives a fencer killed with SIGKILL.
func setParentDeathSignal(*syscall.SysProcAttr) {}
