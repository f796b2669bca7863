//go:build !unix

package server_test

import (
	"testing"
	"time"
)

// cpuTime returns 0: the process's CPU time is read only on Unix.
func cpuTime(*testing.B) time.Duration { return 0 }
