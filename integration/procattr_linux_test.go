package integration_test

import "syscall"

// childProcAttr makes the kernel kill a holder or fencer serve process the
// chaos test started when the test binary dies, so that a test killed
// mid-run leaks none, not even a holder it had stopped with SIGSTOP.
func childProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
