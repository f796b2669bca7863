package fencertest_test

import (
	"io"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fencer-dev/fencer/fencertest"
)

// leftRunning blocks until stop is closed: the goroutine a test forgot.
func leftRunning(started chan<- struct{}, stop <-chan struct{}) {
	close(started)
	<-stop
}

// TestCheckLeaksReportsALeftGoroutine checks that the leak check of Main
// bites: with a goroutine left running, CheckLeaks turns a passing run's
// code into 1 and names the goroutine on standard error; a failing run's
// code is kept. The goroutine is stopped before the test ends, so Main's
// own check of this package still passes.
func TestCheckLeaksReportsALeftGoroutine(t *testing.T) {
	started, stop := make(chan struct{}), make(chan struct{})
	go leftRunning(started, stop)
	defer close(stop)
	<-started

	r, w, err := os.Pipe()
	require.NoError(t, err)
	read := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(r) // a report longer than the pipe's buffer must not block CheckLeaks
		read <- b
	}()
	stderr := os.Stderr
	os.Stderr = w
	code := fencertest.CheckLeaks(0)
	kept := fencertest.CheckLeaks(3)
	os.Stderr = stderr
	require.NoError(t, w.Close())
	report := <-read

	require.Equal(t, 1, code)
	require.Contains(t, string(report), "fencertest_test.leftRunning")
	require.Equal(t, 3, kept)
}
