package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// python is the interpreter fencer's Python client supports and is tested
// on: Debian's, with python3-grpcio and python3-protobuf from apt
// (scripts/install-python-deps.sh). Another python3 first on PATH (pyenv,
// a virtualenv) is not used.
const python = "/usr/bin/python3"

// TestPythonClient runs python/tests against fencer serve with Debian's
// Python: sessions with a keepalive thread, leases as context managers,
// guarded writes with their tokens, a stale write refused after the lease
// is taken, and typed exceptions. It skips without that Python, except in
// CI (CI=true), where that is a failure.
func TestPythonClient(t *testing.T) {
	requirePython(t, "grpc", "google.protobuf")
	s := startServeProc(t)
	pyDir, err := filepath.Abs("../../python")
	require.NoError(t, err)
	cmd := exec.Command(python, "-m", "unittest", "discover", "-v", "-s", filepath.Join(pyDir, "tests"))
	cmd.Env = cleanEnv("FENCER_SERVER="+s.addr, "PYTHONPATH="+pyDir, "PYTHONDONTWRITEBYTECODE=1")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "python tests failed:\n%s", out)
	t.Logf("%s", out)
}

// requirePython skips the test unless python can import modules, which
// make python-deps installs; in CI (CI=true) it fails the test instead.
func requirePython(t *testing.T, modules ...string) {
	t.Helper()
	list := strings.Join(modules, ", ")
	if out, err := exec.Command(python, "-c", "import "+list).CombinedOutput(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s with %s is required in CI (make python-deps): %v\n%s", python, list, err, out)
		}
		t.Skipf("no %s with %s (make python-deps): %v", python, list, err)
	}
}
