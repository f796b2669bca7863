package main

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

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

// TestPythonRingExample runs docs/ring.md's Python worker, the block marked
// ring-example, exactly as written, with Debian's Python against fencer
// serve, and compares what it prints with the block marked
// ring-example-output. It skips without that Python, except in CI.
func TestPythonRingExample(t *testing.T) {
	requirePython(t, "grpc", "google.protobuf")
	doc, err := os.ReadFile("../../docs/ring.md")
	require.NoError(t, err)
	example := markedCodeBlock(t, string(doc), "<!-- ring-example:")
	want := markedCodeBlock(t, string(doc), "<!-- ring-example-output:")
	require.LessOrEqual(t, strings.Count(example, "\n"), 20, "docs/ring.md promises a 20-line example")

	s := startServeProc(t)
	pyDir, err := filepath.Abs("../../python")
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, python, "-c", example)
	cmd.Dir, cmd.Env = t.TempDir(), cleanEnv("FENCER_SERVER="+s.addr, "PYTHONPATH="+pyDir, "PYTHONDONTWRITEBYTECODE=1")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "docs/ring.md's example failed:\n%s", out)
	require.Equal(t, want, string(out))
}

// TestPythonRingRidesOutAServerRestart runs python/tests/ring_worker.py, a
// Python ring member that writes with each shard's token every 50 ms,
// and restarts fencer serve under it. The client must reopen the member's
// stream through its session, which etcd kept: the new snapshot matches
// what the member had, so it reports no change, and its writes succeed
// again with the same tokens.
func TestPythonRingRidesOutAServerRestart(t *testing.T) {
	requirePython(t, "grpc", "google.protobuf")
	s := startServeProc(t)
	code, _, stderr := s.fencer(nil, "ring", "create", "orders", "--shards", "4")
	require.Equal(t, 0, code, stderr)
	pyDir, err := filepath.Abs("../../python")
	require.NoError(t, err)
	cmd := exec.Command(python, filepath.Join(pyDir, "tests", "ring_worker.py"), "orders", "w", "10")
	cmd.Env = cleanEnv("FENCER_SERVER="+s.addr, "PYTHONPATH="+pyDir, "PYTHONDONTWRITEBYTECODE=1")
	var errOut safeBuffer
	cmd.Stderr = &errOut
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	lines := make(chan map[string]string, 1000)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var l map[string]string
			if json.Unmarshal(sc.Bytes(), &l) == nil {
				lines <- l
			}
		}
	}()
	// until reads lines until each shard has printed key, within bound,
	// and returns them.
	until := func(key string, bound time.Duration) []map[string]string {
		var got []map[string]string
		seen := map[string]bool{}
		timeout := time.After(bound)
		for len(seen) < 4 {
			select {
			case l, ok := <-lines:
				require.True(t, ok, "the worker exited after printing %v: %s", got, errOut.String())
				got = append(got, l)
				if shard, ok := l[key]; ok {
					seen[shard] = true
				}
			case <-timeout:
				t.Fatalf("the worker printed %v in %s: %s", got, bound, errOut.String())
			}
		}
		return got
	}
	tokens := map[string]string{}
	for _, l := range until("wrote", 30*time.Second) {
		if shard, ok := l["wrote"]; ok {
			tokens[shard] = l["token"]
		}
	}

	s.stop()
	s.start()
	again := until("wrote", 30*time.Second)
	unavailable := 0
	for _, l := range again {
		require.NotContains(t, l, "kind", "the member reported a change across the restart: %v", again)
		require.NotContains(t, l, "stale", "a write was refused across the restart: %v", again)
		if shard, ok := l["wrote"]; ok {
			require.Equal(t, tokens[shard], l["token"], "shard %s", shard)
		}
		if _, ok := l["unavailable"]; ok {
			unavailable++
		}
	}
	require.Positive(t, unavailable, "no write failed while the server was down: %v", again)
}
