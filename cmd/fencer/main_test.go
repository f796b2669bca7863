package main

import (
	"os"
	"testing"

	"github.com/fencer-dev/fencer/fencertest"
	"github.com/fencer-dev/fencer/internal/testkit/etcdproc"
)

func TestMain(m *testing.M) {
	// The etcd cluster test runs etcd members as re-executions of this
	// binary.
	etcdproc.RunIfMember()
	runWatchdogIfAsked() // in-process acquire runs this binary as its watchdog
	code := m.Run()
	removeBinary()
	fencertest.StopShared()
	os.Exit(fencertest.CheckLeaks(code, fencertest.IgnoreInProcessPeers()))
}
