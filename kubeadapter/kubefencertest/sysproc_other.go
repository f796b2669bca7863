//go:build !linux

package kubefencertest

import "syscall"

// sysProcAttr returns the default attributes: outside Linux there is no
// parent-death signal, and only Stop ends kube-apiserver.
func sysProcAttr() *syscall.SysProcAttr { return nil }
