//go:build !linux

package integration_test

import "syscall"

// childProcAttr sets nothing: only Linux has a parent-death signal, so
// elsewhere a test killed mid-run may leak the processes it started.
func childProcAttr() *syscall.SysProcAttr { return nil }
