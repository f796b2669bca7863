package kubefencertest

import (
	"context"
	"errors"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestStartAPIServerNeedsEtcd checks that without an etcd binary
// StartAPIServer says so, with ErrNoEtcd, and starts nothing.
func TestStartAPIServerNeedsEtcd(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "etcd")
	t.Setenv(EtcdEnv, missing)
	_, err := EtcdPath()
	require.ErrorIs(t, err, ErrNoEtcd)
	require.ErrorContains(t, err, missing)
	if _, berr := BinaryPath(); berr != nil {
		t.Skipf("no kube-apiserver to get past: %v", berr)
	}
	_, err = StartAPIServer(context.Background(), t.TempDir())
	require.ErrorIs(t, err, ErrNoEtcd)
}

// TestAPIServerStopEndsEtcd checks that Stop leaves no etcd process
// behind (the test process lives on, so the kernel's parent-death signal
// would not end it).
func TestAPIServerStopEndsEtcd(t *testing.T) {
	e := APIServerForTest(t)
	pid := e.etcd.cmd.Process.Pid
	require.NoError(t, syscall.Kill(pid, 0), "etcd is running while the API server is")
	e.Stop()
	require.Eventually(t, func() bool {
		return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
	}, 10*time.Second, 50*time.Millisecond, "etcd (pid %d) outlived Stop", pid)
}
