package fencertest_test

import (
	"fmt"
	"os"
)

// exampleT is the fencertest.TB of the examples, which have no
// *testing.T: Fatalf panics and cleanup runs what Cleanup registered, last
// first. In a test, pass the test's t instead.
type exampleT struct {
	cleanups []func()
}

func (e *exampleT) Helper() {}

func (e *exampleT) Cleanup(f func()) { e.cleanups = append(e.cleanups, f) }

func (e *exampleT) Fatalf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }

func (e *exampleT) TempDir() string {
	dir, err := os.MkdirTemp("", "fencertest-example-")
	if err != nil {
		e.Fatalf("%v", err)
	}
	e.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// cleanup runs the registered functions, last first.
func (e *exampleT) cleanup() {
	for i := len(e.cleanups) - 1; i >= 0; i-- {
		e.cleanups[i]()
	}
}
