package main

import (
	"os"
	"testing"

	"github.com/fencer-dev/fencer/internal/etcdproc"
	"github.com/fencer-dev/fencer/internal/etcdtest"
)

func TestMain(m *testing.M) {
	// The etcd cluster test runs etcd members as re-executions of this
	// binary.
	etcdproc.RunIfMember()
	runWatchdogIfAsked() // in-process acquire runs this binary as its watchdog
	code := m.Run()
	removeBinary()
	etcdtest.StopShared()
	os.Exit(etcdtest.CheckLeaks(code))
}
