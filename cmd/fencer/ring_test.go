package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// ringScript is a CMD for ring join that appends "start SHARDS LINES"
// to log when it starts (SHARDS from $FENCER_RING_SHARDS, LINES the
// shards file's line count) and "stop" when it gets SIGTERM.
func ringScript(log string) []string {
	return []string{"sh", "-c", `echo "start $FENCER_RING_SHARDS $(wc -l < "$FENCER_RING_SHARDS_FILE")" >> ` + log +
		`; trap 'echo stop >> ` + log + `; exit 0' TERM; while :; do sleep 0.05; done`}
}

// ringLog returns the lines of a ringScript log.
func ringLog(t *testing.T, log string) []string {
	t.Helper()
	b, err := os.ReadFile(log)
	if os.IsNotExist(err) {
		return nil
	}
	require.NoError(t, err)
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

// lastStart returns the shards of the last "start" line of log, and
// whether CMD is running (no "stop" after it).
func lastStart(t *testing.T, log string) ([]string, bool) {
	t.Helper()
	lines := ringLog(t, log)
	for i := len(lines) - 1; i >= 0; i-- {
		if rest, ok := strings.CutPrefix(lines[i], "start "); ok {
			list, _, _ := strings.Cut(rest, " ")
			var shards []string
			if list != "" {
				shards = strings.Split(list, ",")
			}
			return shards, i == len(lines)-1
		}
	}
	return nil, false
}

// eventually waits up to 20 seconds for cond, and fails the test with
// what describes the state at the end if it does not hold by then.
func eventually(t *testing.T, cond func() bool, what func() string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within 20s: %s", what())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// requireConsistentStarts checks that each start in a ringScript log
// had as many shards in $FENCER_RING_SHARDS as lines in the shards file.
func requireConsistentStarts(t *testing.T, log string) {
	t.Helper()
	for _, line := range ringLog(t, log) {
		rest, ok := strings.CutPrefix(line, "start ")
		if !ok {
			continue
		}
		list, count, _ := strings.Cut(rest, " ")
		n := 0
		if list != "" {
			n = len(strings.Split(list, ","))
		}
		require.Equal(t, strconv.Itoa(n), strings.TrimSpace(count), "%s: %q", log, line)
	}
}

// ringStatusOf runs fencer ring status -o json.
func ringStatusOf(t *testing.T, s *serveProc, ring string) ringStatusView {
	t.Helper()
	code, stdout, stderr := s.fencer(nil, "ring", "status", ring, "-o", "json")
	require.Equal(t, 0, code, stderr)
	var v ringStatusView
	require.NoError(t, json.Unmarshal([]byte(stdout), &v))
	return v
}

// fencer ring join runs CMD with the shards it owns, restarts it with
// the new ones when a member joins (the shards it loses are released once
// it has stopped, and go to the new member), and on SIGTERM stops it and
// leaves the ring, handing everything to the other member.
func TestRingJoinRunsRestartsAndLeaves(t *testing.T) {
	s := startServeProc(t)
	code, stdout, stderr := s.fencer(nil, "ring", "create", "jobs", "--shards", "8")
	require.Equal(t, 0, code, stderr)
	require.Equal(t, "created ring jobs with 8 shards\n", stdout)
	dir := t.TempDir()
	logA, logB := filepath.Join(dir, "a.log"), filepath.Join(dir, "b.log")
	all := []string{"0", "1", "2", "3", "4", "5", "6", "7"}

	a := s.startFencer(nil, append([]string{"ring", "join", "jobs", "--member", "a", "--settle", "300ms", "--"}, ringScript(logA)...)...)
	eventually(t, func() bool {
		shards, running := lastStart(t, logA)
		return running && slices.Equal(shards, all)
	}, func() string { return fmt.Sprintf("a starts with every shard: %v\n%s", ringLog(t, logA), a.stderr) })
	require.Equal(t, []string{"start 0,1,2,3,4,5,6,7 8"}, ringLog(t, logA), "the shards file has a line per shard")

	b := s.startFencer(nil, append([]string{"ring", "join", "jobs", "--member", "b", "--settle", "300ms", "--"}, ringScript(logB)...)...)
	var sa, sb []string
	eventually(t, func() bool {
		var ra, rb bool
		sa, ra = lastStart(t, logA)
		sb, rb = lastStart(t, logB)
		if !ra || !rb || len(sa) == 0 || len(sb) == 0 {
			return false
		}
		both := slices.Sorted(slices.Values(append(slices.Clone(sa), sb...)))
		return slices.Equal(both, all)
	}, func() string {
		return fmt.Sprintf("a and b share the shards\na: %v\nb: %v\n%s\n%s", ringLog(t, logA), ringLog(t, logB), a.stderr, b.stderr)
	})
	require.Contains(t, ringLog(t, logA), "stop", "a was stopped before it was restarted with fewer shards")
	requireConsistentStarts(t, logA)
	requireConsistentStarts(t, logB)
	require.Contains(t, a.stderr.String(), "fencer ring join: restarting sh with ")
	st := ringStatusOf(t, s, "jobs")
	require.Len(t, st.Members, 2)
	require.Zero(t, st.Unowned)
	require.Equal(t, len(sa), st.Members[0].Owned)
	require.Equal(t, len(sb), st.Members[1].Owned)

	require.NoError(t, a.cmd.Process.Signal(syscall.SIGTERM))
	require.Equal(t, 0, a.wait(t, 20*time.Second), a.stderr.String())
	require.Contains(t, a.stderr.String(), "fencer ring join: left jobs\n")
	require.Equal(t, "stop", ringLog(t, logA)[len(ringLog(t, logA))-1])
	eventually(t, func() bool {
		shards, running := lastStart(t, logB)
		return running && slices.Equal(shards, all)
	}, func() string { return fmt.Sprintf("b takes every shard: %v\n%s", ringLog(t, logB), b.stderr) })

	requireConsistentStarts(t, logB)
	code, stdout, stderr = s.fencer(nil, "ring", "status", "jobs")
	require.Equal(t, 0, code, stderr)
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	require.Len(t, lines, 3, stdout)
	require.Equal(t, []string{"MEMBER", "OWNED", "LEAVING", "HOLDER"}, strings.Fields(lines[0]))
	require.Equal(t, []string{"b", "8", "no"}, strings.Fields(lines[1])[:3])
	require.True(t, strings.HasPrefix(strings.Fields(lines[1])[3], "anonymous/"), lines[1])
	require.Equal(t, []string{"(unowned)", "0", "-", "-"}, strings.Fields(lines[2]))
}

// With --on-change signal=HUP, CMD is not restarted: the shards file is
// rewritten and CMD gets SIGHUP.
func TestRingJoinSignalsOnChange(t *testing.T) {
	s := startServeProc(t)
	code, _, stderr := s.fencer(nil, "ring", "create", "sig", "--shards", "6")
	require.Equal(t, 0, code, stderr)
	dir := t.TempDir()
	log := filepath.Join(dir, "a.log")
	script := `echo "start $FENCER_RING_SHARDS" >> ` + log + `; trap 'echo "hup $(cut -d " " -f 1 "$FENCER_RING_SHARDS_FILE" | tr "\n" ,)" >> ` + log +
		`' HUP; trap 'exit 0' TERM; while :; do sleep 0.05; done`
	a := s.startFencer(nil, "ring", "join", "sig", "--member", "a", "--settle", "300ms", "--drain", "1s", "--on-change", "signal=HUP", "--", "sh", "-c", script)
	eventually(t, func() bool { return slices.Equal(ringLog(t, log), []string{"start 0,1,2,3,4,5"}) },
		func() string { return fmt.Sprintf("%v\n%s", ringLog(t, log), a.stderr) })
	b := s.startFencer(nil, "ring", "join", "sig", "--member", "b", "--settle", "300ms", "--", "sh", "-c", "exec sleep 60")
	eventually(t, func() bool {
		st := ringStatusOf(t, s, "sig")
		return len(st.Members) == 2 && st.Members[1].Owned > 0 && st.Unowned == 0
	}, func() string { return fmt.Sprintf("b gains shards once a's drain passes\n%s\n%s", a.stderr, b.stderr) })
	lines := ringLog(t, log)
	require.Equal(t, "start 0,1,2,3,4,5", lines[0], "CMD was not restarted")
	require.Greater(t, len(lines), 1, "CMD got SIGHUP")
	require.True(t, strings.HasPrefix(lines[1], "hup "), lines)
	require.Less(t, len(strings.Split(strings.TrimSuffix(strings.TrimPrefix(lines[1], "hup "), ","), ",")), 6, "the rewritten file lists fewer shards: %v", lines)
}

// When its session is lost (the server stops, so no renewal succeeds
// within the TTL), ring join stops CMD and exits 9, saying why.
func TestRingJoinExitsWhenTheSessionIsLost(t *testing.T) {
	s := startServeProc(t)
	code, _, stderr := s.fencer(nil, "ring", "create", "jobs", "--shards", "2")
	require.Equal(t, 0, code, stderr)
	log := filepath.Join(t.TempDir(), "a.log")
	a := s.startFencer(nil, append([]string{"ring", "join", "jobs", "--ttl", "2s", "--settle", "100ms", "--"}, ringScript(log)...)...)
	eventually(t, func() bool { _, running := lastStart(t, log); return running }, func() string { return a.stderr.String() })
	s.stop()
	require.Equal(t, exitLeaseLost, a.wait(t, 20*time.Second), a.stderr.String())
	require.Contains(t, a.stderr.String(), "membership of ring jobs lost: the session ended")
	require.Equal(t, "stop", ringLog(t, log)[len(ringLog(t, log))-1], "CMD was stopped")
}

func TestRingUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{"ring", "join", "jobs"}, "ring join needs a command after --"},
		{[]string{"ring", "join", "jobs", "--on-change", "bounce", "--", "true"}, `invalid --on-change "bounce"`},
		{[]string{"ring", "create", "jobs"}, "give the ring's shards"},
		{[]string{"ring", "create", "jobs", "--shards", "2", "--shard", "a"}, "not both"},
		{[]string{"ring", "frob"}, `unknown ring command "frob"`},
	} {
		var out, errOut strings.Builder
		code := dispatch(t.Context(), tc.args, &out, &errOut)
		require.Equal(t, exitUsage, code, "%v: %s", tc.args, errOut.String())
		require.Contains(t, errOut.String(), tc.msg, tc.args)
	}
}

// TestRingJoinProcessesOwnEachShardOnce runs 3 fencer ring join
// processes over one ring (1,000 shards; FENCER_RING_JOIN_SHARDS sets
// another number, as make bench does with 10,000) and samples, until the
// ring has settled, the shards files of the three (what each CMD may act
// for) and the ring's status: no shard is ever in two files, the status
// never counts a shard twice, and once settled every shard is owned, by
// the member whose file lists it.
func TestRingJoinProcessesOwnEachShardOnce(t *testing.T) {
	n := 1000
	if v := os.Getenv("FENCER_RING_JOIN_SHARDS"); v != "" {
		var err error
		n, err = strconv.Atoi(v)
		require.NoError(t, err)
	}
	s := startServeProc(t)
	code, _, stderr := s.fencer(nil, "ring", "create", "big", "--shards", strconv.Itoa(n))
	require.Equal(t, 0, code, stderr)
	dir := t.TempDir()
	var procs []*proc
	for i := range 3 {
		member := fmt.Sprintf("m%d", i)
		script := `echo "$FENCER_RING_SHARDS_FILE" > ` + filepath.Join(dir, member+".path") + `; exec sleep 600`
		procs = append(procs, s.startFencer(nil, "ring", "join", "big", "--member", member, "--settle", "200ms", "--", "sh", "-c", script))
	}
	files := func() []map[string]bool {
		out := make([]map[string]bool, 3)
		for i := range out {
			out[i] = map[string]bool{}
			path, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("m%d.path", i)))
			if err != nil {
				continue
			}
			b, err := os.ReadFile(strings.TrimSpace(string(path)))
			if err != nil {
				continue // removed as the process ends
			}
			for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
				if shard, _, ok := strings.Cut(line, " "); ok {
					out[i][shard] = true
				}
			}
		}
		return out
	}
	start := time.Now()
	samples := 0
	for {
		samples++
		fs := files()
		seen := map[string]int{}
		for i, f := range fs {
			for shard := range f {
				if j, dup := seen[shard]; dup {
					t.Fatalf("shard %s is in the files of m%d and m%d at once", shard, j, i)
				}
				seen[shard] = i
			}
		}
		st := ringStatusOf(t, s, "big")
		sum := st.Unowned
		for _, m := range st.Members {
			sum += m.Owned
		}
		require.Equal(t, n, sum, "the status counts each shard once: %+v", st)
		settled := len(st.Members) == 3 && st.Unowned == 0 && len(seen) == n
		for i, m := range st.Members {
			settled = settled && m.Owned == len(fs[i]) && m.Owned > 0
		}
		if settled {
			break
		}
		if time.Since(start) > 3*time.Minute {
			t.Fatalf("not settled after %s: %+v, files %d %d %d\n%s\n%s\n%s", time.Since(start), st, len(fs[0]), len(fs[1]), len(fs[2]),
				procs[0].stderr, procs[1].stderr, procs[2].stderr)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("ring_join_processes: %d shards over 3 processes settled in %s; %d samples, never two owners", n, time.Since(start).Round(time.Millisecond), samples)
}

// A signal while ring join waits for its shards to settle ends it before
// CMD starts (128+N), and the member leaves the ring.
func TestRingJoinInterruptedBeforeCMDStarts(t *testing.T) {
	s := startServeProc(t)
	code, _, stderr := s.fencer(nil, "ring", "create", "early", "--shards", "3")
	require.Equal(t, 0, code, stderr)
	log := filepath.Join(t.TempDir(), "a.log")
	a := s.startFencer(nil, append([]string{"ring", "join", "early", "--member", "a", "--settle", "30s", "--"}, ringScript(log)...)...)
	eventually(t, func() bool {
		st := ringStatusOf(t, s, "early")
		return len(st.Members) == 1 && st.Members[0].Owned == 3
	}, func() string { return a.stderr.String() })
	require.NoError(t, a.cmd.Process.Signal(syscall.SIGTERM))
	require.Equal(t, 128+int(syscall.SIGTERM), a.wait(t, 20*time.Second), a.stderr.String())
	require.Nil(t, ringLog(t, log), "CMD never started")
	require.Contains(t, a.stderr.String(), "fencer ring join: left early\n")
	st := ringStatusOf(t, s, "early")
	require.Empty(t, st.Members)
	require.Equal(t, 3, st.Unowned)
}
