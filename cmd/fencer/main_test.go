package main

import (
	"testing"

	"github.com/fencer-dev/fencer/internal/etcdproc"
	"github.com/fencer-dev/fencer/internal/etcdtest"
)

func TestMain(m *testing.M) {
	// The etcd cluster test runs etcd members as re-executions of this
	// binary.
	etcdproc.RunIfMember()
	etcdtest.Main(m)
}
