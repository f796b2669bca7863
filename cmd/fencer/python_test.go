package main

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
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

// pyRingWorker is a python/tests/ring_worker.py process: a Python ring
// member that writes with each shard's token every 50 ms and prints a JSON
// line per change and per first write of a token.
type pyRingWorker struct {
	t      *testing.T
	lines  chan map[string]string
	stderr *safeBuffer
}

// startPyRingWorker starts ring_worker.py as member of ring against s, with
// a session of ttl seconds.
func startPyRingWorker(t *testing.T, s *serveProc, ring, member string, ttl int) *pyRingWorker {
	t.Helper()
	pyDir, err := filepath.Abs("../../python")
	require.NoError(t, err)
	cmd := exec.Command(python, filepath.Join(pyDir, "tests", "ring_worker.py"), ring, member, strconv.Itoa(ttl))
	cmd.Env = cleanEnv("FENCER_SERVER="+s.addr, "PYTHONPATH="+pyDir, "PYTHONDONTWRITEBYTECODE=1")
	w := &pyRingWorker{t: t, lines: make(chan map[string]string, 1000), stderr: &safeBuffer{}}
	cmd.Stderr = w.stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	go func() {
		defer close(w.lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var l map[string]string
			if json.Unmarshal(sc.Bytes(), &l) == nil {
				w.lines <- l
			}
		}
	}()
	return w
}

// until reads w's lines until done holds for them, within bound, and
// returns them.
func (w *pyRingWorker) until(done func([]map[string]string) bool, bound time.Duration) []map[string]string {
	w.t.Helper()
	var got []map[string]string
	timeout := time.After(bound)
	for !done(got) {
		select {
		case l, ok := <-w.lines:
			require.True(w.t, ok, "the worker exited after printing %v: %s", got, w.stderr.String())
			got = append(got, l)
		case <-timeout:
			w.t.Fatalf("the worker printed %v in %s: %s", got, bound, w.stderr.String())
		}
	}
	return got
}

// each is a condition of until: every one of shards has a line with key.
func each(key string, shards ...string) func([]map[string]string) bool {
	return func(lines []map[string]string) bool {
		seen := map[string]bool{}
		for _, l := range lines {
			if shard, ok := l[key]; ok {
				seen[shard] = true
			}
		}
		for _, s := range shards {
			if !seen[s] {
				return false
			}
		}
		return true
	}
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
	w := startPyRingWorker(t, s, "orders", "w", 10)
	shards := []string{"0", "1", "2", "3"}
	tokens := map[string]string{}
	for _, l := range w.until(each("wrote", shards...), 30*time.Second) {
		if shard, ok := l["wrote"]; ok {
			tokens[shard] = l["token"]
		}
	}

	s.stop()
	s.start()
	again := w.until(each("wrote", shards...), 30*time.Second)
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

// TestPythonAndCLIShareARing runs a Python member (ring_worker.py) and a
// `fencer ring join` member in one ring: when the CLI member joins, the
// Python one is told LOSING for the shards it is assigned and hands them
// off, the CLI's command runs with exactly those, and when it exits (and
// the CLI member leaves) the Python member gains them again, with greater
// tokens.
func TestPythonAndCLIShareARing(t *testing.T) {
	requirePython(t, "grpc", "google.protobuf")
	s := startServeProc(t)
	var shards []string
	for i := range 16 {
		shards = append(shards, strconv.Itoa(i))
	}
	code, _, stderr := s.fencer(nil, "ring", "create", "orders", "--shards", "16")
	require.Equal(t, 0, code, stderr)
	w := startPyRingWorker(t, s, "orders", "py", 10)
	first := map[string]string{}
	for _, l := range w.until(each("wrote", shards...), 30*time.Second) {
		if shard, ok := l["wrote"]; ok {
			first[shard] = l["token"]
		}
	}

	cli := s.startFencer(nil, "ring", "join", "orders", "--member", "cli", "--",
		"sh", "-c", `cut -d" " -f1 "$FENCER_RING_SHARDS_FILE" | sort | paste -sd" " -; sleep 1`)
	require.Equal(t, 0, cli.wait(t, 60*time.Second), cli.stderr.String())
	// The command's last run printed the shards the CLI member ended with.
	printed := strings.Split(strings.TrimSpace(cli.stdout.String()), "\n")
	cliShards := strings.Fields(printed[len(printed)-1])
	require.NotEmpty(t, cliShards, "the CLI member was assigned nothing of 16 shards: %s", cli.stderr.String())

	// The Python member lost exactly the CLI's shards, and gains them back.
	lines := w.until(func(lines []map[string]string) bool {
		gainedAgain := 0
		for _, l := range lines {
			if l["kind"] == "gained" {
				gainedAgain++
			}
		}
		return gainedAgain == len(cliShards)
	}, 30*time.Second)
	var losing, lost, gained []string
	for _, l := range lines {
		switch l["kind"] {
		case "losing":
			losing = append(losing, l["shard"])
		case "lost":
			lost = append(lost, l["shard"])
		case "gained":
			gained = append(gained, l["shard"])
			require.NotEqual(t, first[l["shard"]], l["token"], "shard %s came back with its old token", l["shard"])
		}
		require.NotContains(t, l, "stale", "a write with a handed-off shard's token: %v", lines)
	}
	require.ElementsMatch(t, cliShards, losing)
	require.ElementsMatch(t, cliShards, lost)
	require.ElementsMatch(t, cliShards, gained)
}
