package main

import (
	"encoding/json"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// benchLeases returns the leases fencer status --prefix bench- lists
// on s, by name.
func benchLeases(t *testing.T, s *serveProc) map[string]statusRow {
	t.Helper()
	code, stdout, stderr := s.fencer(nil, "status", "--prefix", "bench-", "-o", "json")
	require.Equal(t, 0, code, stderr)
	var rows []statusRow
	require.NoError(t, json.Unmarshal([]byte(stdout), &rows))
	out := map[string]statusRow{}
	for _, r := range rows {
		out[r.Name] = r
	}
	return out
}

// TestBenchCleansUpAndReusesItsNames: fencer bench deletes the keys it
// wrote and releases its leases when it ends, also when interrupted
// (exit 130); a later run reuses the names of an earlier one, and a bench
// beside a running one takes the next slot, so that what benches leave
// (the epoch counters of their leases, and the owner records of their
// keys) does not grow with the number of runs.
func TestBenchCleansUpAndReusesItsNames(t *testing.T) {
	s := startServeProc(t)
	for range 2 {
		code, _, stderr := s.fencer(nil, "bench", "--clients", "2", "--duration", "300ms")
		require.Equal(t, 0, code, stderr)
	}
	leases := benchLeases(t, s)
	names := make([]string, 0, len(leases))
	for name, r := range leases {
		names = append(names, name)
		require.False(t, r.Held, "bench left %s held", name)
	}
	require.ElementsMatch(t, []string{"bench-0", "bench-0-0", "bench-0-0-cycle", "bench-0-1", "bench-0-1-cycle"}, names)
	for _, key := range []string{"bench/0/0", "bench/0/1"} {
		code, _, stderr := s.fencer(nil, "get", key)
		require.Equal(t, exitNotFound, code, "bench left %s: %s", key, stderr)
	}

	// Interrupted while it writes, beside a second bench.
	long := s.startFencer(nil, "bench", "--clients", "2", "--duration", "1m", "--ops", "put")
	require.Eventually(t, func() bool { code, _, _ := s.fencer(nil, "get", "bench/0/1"); return code == 0 }, printBound, 50*time.Millisecond, long.stderr.String())
	code, _, stderr := s.fencer(nil, "bench", "--clients", "1", "--duration", "300ms", "--ops", "put")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, benchLeases(t, s), "bench-1-0", "the second bench took the next slot")
	require.NoError(t, long.cmd.Process.Signal(syscall.SIGINT))
	require.Equal(t, 128+int(syscall.SIGINT), long.wait(t, 20*time.Second), long.stderr.String())
	for name, r := range benchLeases(t, s) {
		require.False(t, r.Held, "the interrupted bench left %s held", name)
	}
	for _, key := range []string{"bench/0/0", "bench/0/1", "bench/1/0"} {
		code, _, stderr := s.fencer(nil, "get", key)
		require.Equal(t, exitNotFound, code, "bench left %s: %s", key, stderr)
	}
}

// TestStatusFilters: fencer status NAME... lists those leases, --prefix
// those whose names start with a NAME; a NAME that matches none is exit
// code 3, --prefix without one a usage error.
func TestStatusFilters(t *testing.T) {
	s := startServeProc(t)
	for _, name := range []string{"orders", "orders-eu", "billing"} {
		code, _, stderr := s.fencer(nil, "acquire", name, "--", "true")
		require.Equal(t, 0, code, stderr)
	}
	for _, tc := range []struct {
		args []string
		code int
		want []string
		msg  string
	}{
		{[]string{"status"}, 0, []string{"billing", "orders", "orders-eu"}, ""},
		{[]string{"status", "orders"}, 0, []string{"orders"}, ""},
		{[]string{"status", "billing", "orders"}, 0, []string{"billing", "orders"}, ""},
		{[]string{"status", "--prefix", "orders"}, 0, []string{"orders", "orders-eu"}, ""},
		{[]string{"status", "orders", "nosuch"}, exitNotFound, []string{"orders"}, `fencer status: no lease named "nosuch" has ever been acquired`},
		{[]string{"status", "--prefix", "bench-"}, exitNotFound, nil, `fencer status: no lease whose name starts with "bench-" has ever been acquired`},
		{[]string{"status", "--prefix"}, exitUsage, nil, "fencer status: --prefix needs a NAME prefix"},
		{[]string{"status", "orders/eu"}, exitUsage, nil, `fencer status: invalid NAME "orders/eu": contains the key separator "/"`},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			code, stdout, stderr := s.fencer(nil, append(tc.args, "-o", "json")...)
			require.Equal(t, tc.code, code, stderr)
			require.Contains(t, stderr, tc.msg)
			if tc.want == nil {
				require.Empty(t, stdout, "nothing matched: the error alone, no empty table")
				return
			}
			var rows []statusRow
			require.NoError(t, json.Unmarshal([]byte(stdout), &rows))
			var got []string
			for _, r := range rows {
				got = append(got, r.Name)
			}
			require.Equal(t, tc.want, got)
		})
	}
}
