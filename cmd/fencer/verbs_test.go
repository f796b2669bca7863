package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"
)

// TestVerbs runs the data and lease verbs through the fencer binary
// against fencer serve, with their output formats.
func TestVerbs(t *testing.T) {
	s := startServeProc(t)
	holder := s.startFencer(nil, "acquire", "-o", "json", "orders")
	require.Eventually(t, func() bool { return strings.HasSuffix(holder.stdout.String(), "}\n") }, printBound, 10*time.Millisecond, holder.stderr.String())
	var held holdView
	require.NoError(t, json.Unmarshal([]byte(holder.stdout.String()), &held))
	require.Equal(t, "orders", held.Lease)
	require.NotZero(t, held.Session)
	var raw map[string]any
	require.NoError(t, json.Unmarshal([]byte(holder.stdout.String()), &raw))
	require.Equal(t, strconv.FormatInt(held.Session, 10), raw["session"], "the session is a string in json, so a reader that parses numbers as doubles keeps it exact")
	tok := []string{"FENCER_TOKEN=" + held.Token}

	run := func(env []string, args ...string) string {
		t.Helper()
		code, stdout, stderr := s.fencer(env, args...)
		require.Equal(t, 0, code, "fencer %v: %s", args, stderr)
		return stdout
	}

	t.Run("put, get, delete", func(t *testing.T) {
		require.Equal(t, "KEY           REVISION\n", strings.SplitAfter(run(tok, "put", "-o", "table", "orders/total", "100"), "\n")[0])
		require.Equal(t, "100\n", run(nil, "get", "orders/total"))
		var g getView
		require.NoError(t, yaml.Unmarshal([]byte(run(nil, "get", "orders/total", "-o", "yaml")), &g))
		require.Equal(t, getView{Key: "orders/total", Found: true, Value: []byte("100"), CreateRevision: g.CreateRevision, ModRevision: g.ModRevision}, g)
		require.Equal(t, "deleted\n", run(tok, "delete", "orders/total"))
		require.Equal(t, "not found (nothing deleted)\n", run(tok, "delete", "orders/total"))
	})

	t.Run("txn from standard input and from a file", func(t *testing.T) {
		run(tok, "put", "orders/state", "open")
		p := s.startFencerIn(strings.NewReader("value(orders/state) = open\n\nput orders/state \"half closed\"\n"), tok, "txn")
		require.Equal(t, 0, p.wait(t, 10*time.Second), p.stderr.String())
		require.Regexp(t, `^SUCCESS\nput orders/state revision \d+\n$`, p.stdout.String())
		require.Equal(t, "half closed\n", run(nil, "get", "orders/state"))
		run(tok, "put", "orders/state", "open")
		file := filepath.Join(t.TempDir(), "txn")
		require.NoError(t, os.WriteFile(file, []byte("value(orders/state) = open\n\nput orders/state closed\nget orders/state\n\nget orders/state\n"), 0o600))
		var v txnView
		require.NoError(t, json.Unmarshal([]byte(run(tok, "txn", "-o", "json", file)), &v))
		require.True(t, v.Succeeded)
		require.Len(t, v.Results, 2)
		require.Equal(t, "closed", string(*v.Results[1].Value))
		require.Equal(t, "FAILURE\nget orders/state \"closed\"\n", run(tok, "txn", file))
	})

	t.Run("advance", func(t *testing.T) {
		require.Equal(t, "orders-db advanced to "+held.Token+"\n", run(tok, "advance", "orders-db"))
	})

	t.Run("status, with and without headers", func(t *testing.T) {
		out := run(nil, "status")
		require.True(t, strings.HasPrefix(out, "LEASE"), out)
		require.Contains(t, out, held.Token)
		out = run(nil, "status", "--no-headers")
		require.True(t, strings.HasPrefix(out, "orders "), out)
		var rows []statusRow
		require.NoError(t, json.Unmarshal([]byte(run(nil, "status", "-o", "json")), &rows))
		require.Equal(t, []statusRow{{Name: "orders", Epoch: 1, Held: true, Holder: rows[0].Holder, Token: held.Token, LockDelay: "14s", LockDelayState: "armed"}}, rows,
			"acquire's default lock-delay: --ttl 10s + --grace + 1s, in whole seconds")
		require.Contains(t, out, " 14s armed\n")
	})

	t.Run("health", func(t *testing.T) {
		require.Equal(t, s.addr+" is SERVING\n", run(nil, "health"))
		var h healthView
		require.NoError(t, json.Unmarshal([]byte(run(nil, "health", "-o", "json")), &h))
		require.Equal(t, "SERVING", h.Status)
	})

	t.Run("watch prints the loss, release ends the lease", func(t *testing.T) {
		w := s.startFencer([]string{"FENCER_SESSION=" + strconv.FormatInt(held.Session, 10)}, "watch")
		require.Eventually(t, func() bool { return strings.Contains(w.stderr.String(), "watching session") }, printBound, 10*time.Millisecond, w.stderr.String())
		require.Equal(t, "released "+held.Token+"\n", run(tok, "release"))
		require.Eventually(t, func() bool { return strings.Contains(w.stdout.String(), "lost "+held.Token+": deleted") }, printBound, 10*time.Millisecond, w.stderr.String())
		require.Equal(t, held.Token+" had already ended\n", run(tok, "release"))
		var rows []statusRow
		require.NoError(t, json.Unmarshal([]byte(run(nil, "status", "-o", "json", "orders")), &rows))
		require.Equal(t, []statusRow{{Name: "orders", Epoch: 1, LockDelay: "14s", LockDelayState: "pending"}}, rows, "a release by token is not clean")
		require.Equal(t, exitLeaseLost, holder.wait(t, 10*time.Second), holder.stderr.String())
		require.Equal(t, exitNotFound, w.wait(t, 10*time.Second), "watch ends with the session: %s", w.stderr)
	})
}

// execOutput runs bin with args, without FENCER_ variables, and returns
// its standard output.
func execOutput(bin string, args ...string) ([]byte, error) {
	cmd := exec.Command(bin, args...)
	cmd.Env = cleanEnv()
	return cmd.Output()
}

// TestVersionAndCompletion: version reports the Go toolchain and the
// module version; completion scripts come out for bash, zsh and fish;
// help goes to standard output.
func TestVersionAndCompletion(t *testing.T) {
	bin := fencerBinary(t)
	out, err := execOutput(bin, "version", "-o", "json")
	require.NoError(t, err)
	var v versionView
	require.NoError(t, json.Unmarshal(out, &v))
	require.Equal(t, runtime.Version(), v.GoVersion)
	require.NotEmpty(t, v.Version)
	for shell, want := range map[string]string{"bash": "__start_fencer", "zsh": "#compdef fencer", "fish": "complete -c fencer"} {
		out, err := execOutput(bin, "completion", shell)
		require.NoError(t, err, shell)
		require.Contains(t, string(out), want, shell)
	}
	stamped := filepath.Join(t.TempDir(), "fencer")
	build, err := exec.Command("go", "build", "-ldflags", "-X main.version=v9.8.7 -X main.commit=0123abcd", "-o", stamped, ".").CombinedOutput()
	require.NoError(t, err, "%s", build)
	out, err = execOutput(stamped, "version")
	require.NoError(t, err)
	require.Contains(t, string(out), "fencer v9.8.7, commit 0123abcd")
	out, err = execOutput(bin, "acquire", "--help")
	require.NoError(t, err)
	require.Contains(t, string(out), "Exit codes:")
	require.Contains(t, string(out), "--wait-timeout")
	require.Contains(t, string(out), "[$FENCER_SERVER]")
}

// TestBench runs fencer bench briefly against fencer serve: each workload
// reports calls, throughput and ordered percentiles, and no call failed.
func TestBench(t *testing.T) {
	s := startServeProc(t)
	code, stdout, stderr := s.fencer(nil, "bench", "--clients", "2", "--duration", "500ms", "-o", "json")
	require.Equal(t, 0, code, stderr)
	var results []benchResult
	require.NoError(t, json.Unmarshal([]byte(stdout), &results))
	require.Len(t, results, 2)
	for i, op := range []string{"put", "acquire"} {
		r := results[i]
		require.Equal(t, op, r.Op)
		require.Equal(t, 2, r.Clients)
		require.Positive(t, r.Ops)
		require.Zero(t, r.Errors)
		require.Positive(t, r.PerSecond)
		require.Positive(t, r.P50)
		require.LessOrEqual(t, r.P50, r.P90)
		require.LessOrEqual(t, r.P90, r.P99)
	}

	// The baselines: the same guarded puts and acquire/release cycles,
	// straight to the server's etcd, with the CPU time per call of the
	// bench and of the server.
	for _, op := range []string{"direct-put", "direct-acquire"} {
		code, _, stderr = s.fencer(nil, "bench", "--ops", op)
		require.Equal(t, exitUsage, code, stderr)
		require.Contains(t, stderr, "need --etcd-endpoints")
	}
	code, _, stderr = s.fencer(nil, "bench", "--connections", "0")
	require.Equal(t, exitUsage, code, stderr)
	code, stdout, stderr = s.fencer(nil, "bench", "--clients", "2", "--duration", "500ms", "-o", "json",
		"--ops", "put,direct-put,acquire,direct-acquire", "--etcd-endpoints", "unix://"+filepath.Join(s.dataDir, "etcd.sock"),
		"--server-pid", strconv.Itoa(s.cmd.Process.Pid))
	require.Equal(t, 0, code, stderr)
	results = nil
	require.NoError(t, json.Unmarshal([]byte(stdout), &results))
	require.Len(t, results, 4)
	for i, op := range []string{"put", "direct-put", "acquire", "direct-acquire"} {
		require.Equal(t, op, results[i].Op)
		require.Positive(t, results[i].Ops)
		require.Zero(t, results[i].Errors)
		require.Positive(t, results[i].CPUPerOp, op)
		require.Positive(t, results[i].ServerCPUPerOp, op)
	}
	require.Contains(t, stderr, "put through the server ran at")
	require.Contains(t, stderr, "times the throughput of direct-put")
	require.Contains(t, stderr, "times the throughput of direct-acquire")
	// With --connections, the direct workloads get as many etcd clients,
	// a store each, shared round robin like the connections.
	code, stdout, stderr = s.fencer(nil, "bench", "--clients", "3", "--connections", "2", "--duration", "300ms", "-o", "json",
		"--ops", "direct-put,direct-acquire", "--etcd-endpoints", "unix://"+filepath.Join(s.dataDir, "etcd.sock"))
	require.Equal(t, 0, code, stderr)
	results = nil
	require.NoError(t, json.Unmarshal([]byte(stdout), &results))
	require.Len(t, results, 2)
	for _, r := range results {
		require.Positive(t, r.Ops, r.Op)
		require.Zero(t, r.Errors, r.Op)
		require.Equal(t, 2, r.Connections, r.Op)
	}

	code, stdout, stderr = s.fencer(nil, "status", "-o", "json")
	require.Equal(t, 0, code, stderr)
	var rows []statusRow
	require.NoError(t, json.Unmarshal([]byte(stdout), &rows))
	for _, r := range rows {
		require.False(t, r.Held, "bench left %s held", r.Name)
	}
}

// TestWatchRidesOutAServerRestart: fencer watch says once that the
// server is gone, goes on watching while fencer serve restarts, and
// prints a loss that comes after it.
func TestWatchRidesOutAServerRestart(t *testing.T) {
	s := startServeProc(t)
	holder := s.startFencer(nil, "acquire", "-o", "json", "--ttl", "20s", "reports")
	require.Eventually(t, func() bool { return strings.HasSuffix(holder.stdout.String(), "}\n") }, printBound, 10*time.Millisecond, holder.stderr.String())
	var held holdView
	require.NoError(t, json.Unmarshal([]byte(holder.stdout.String()), &held))
	w := s.startFencer([]string{"FENCER_SESSION=" + strconv.FormatInt(held.Session, 10)}, "watch")
	require.Eventually(t, func() bool { return strings.Count(w.stderr.String(), "watching session") == 1 }, 10*time.Second, 10*time.Millisecond, w.stderr.String())

	s.stop()
	s.start()
	require.Eventually(t, func() bool { return strings.Count(w.stderr.String(), "watching session") == 2 }, 20*time.Second, 10*time.Millisecond, w.stderr.String())
	// It said once that it could not reach the server (or that the server
	// shut down), and that it retries.
	require.Equal(t, 1, strings.Count(w.stderr.String(), "; retrying\n"), w.stderr.String())
	code, _, stderr := s.fencer([]string{"FENCER_TOKEN=" + held.Token}, "release")
	require.Equal(t, 0, code, stderr)
	require.Eventually(t, func() bool { return strings.Contains(w.stdout.String(), "lost "+held.Token+": deleted") }, printBound, 10*time.Millisecond, w.stderr.String())
	require.Equal(t, exitLeaseLost, holder.wait(t, 10*time.Second), holder.stderr.String())
	require.Equal(t, exitNotFound, w.wait(t, 10*time.Second), "watch ends with the session: %s", w.stderr)
}
