//go:build !unix

package etcdstore_test

import (
	"testing"
	"time"
)

// cpuTime returns 0: the process's CPU time is read only on Unix.
func cpuTime(testing.TB) time.Duration { return 0 }
