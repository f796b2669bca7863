package main

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestServeOnABusyPortStartsNothing runs fencer serve with its gRPC or
// its metrics address held by another listener: it exits non-zero naming
// the address, before it creates its data directory or starts etcd.
func TestServeOnABusyPortStartsNothing(t *testing.T) {
	held, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer held.Close()
	busy := held.Addr().String()
	for _, c := range []struct {
		name, listen, metrics string
	}{
		{"gRPC port", busy, ""},
		{"metrics port", freeAddr(t), busy},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "data")
			cmd := exec.Command(fencerBinary(t), "serve", "--listen", c.listen, "--metrics-listen", c.metrics, "--data-dir", dir)
			cmd.Env = cleanEnv()
			var out safeBuffer
			cmd.Stdout, cmd.Stderr = &out, &out
			require.NoError(t, cmd.Start())
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			select {
			case err = <-exited:
			case <-time.After(printBound):
				_ = cmd.Process.Kill()
				<-exited
				t.Fatalf("fencer serve on a busy port still runs: %s", out.String())
			}
			require.Error(t, err, out.String())
			require.NotZero(t, childStatus(err), out.String())
			require.Contains(t, out.String(), busy)
			require.Contains(t, out.String(), "address already in use")
			require.NotContains(t, out.String(), "embedded etcd")
			require.NotContains(t, out.String(), "component=etcd")
			_, statErr := os.Stat(dir)
			require.ErrorIs(t, statErr, os.ErrNotExist, "fencer serve created its data directory: %s", out.String())
		})
	}
}
