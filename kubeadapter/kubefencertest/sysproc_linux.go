package kubefencertest

import "syscall"

// sysProcAttr makes the kernel kill kube-apiserver when the process that
// started it dies, so that a test binary killed mid-run leaks no API server.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
