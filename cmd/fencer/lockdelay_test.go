package main

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencer-dev/fencer/fencertest"
	"github.com/fencer-dev/fencer/internal/holderkey"
)

// TestLockDelaySuccessorStartsAfterStubbornHolder: a command that ignores
// SIGTERM and appends timestamps to a file, unguarded, runs under acquire
// until its lease ends on the server's side: its token released by another
// process, its holder key deleted in etcd, or its session revoked in etcd.
// A successor acquire, waiting all along, appends its own timestamps. With
// the default lock-delay (--grace + 1s) the store keeps the successor out
// until the stubborn command has been killed: the successor's first
// timestamp is after the old command's last. With --lock-delay 0 they
// overlap, which is the hole the delay closes.
func TestLockDelaySuccessorStartsAfterStubbornHolder(t *testing.T) {
	member := fencertest.Etcd(t)
	cli := fencertest.Client(t, member.Endpoint())
	s := startServeProc(t, "--etcd-endpoints", member.Endpoint())
	for _, end := range []struct {
		name string
		end  func(t *testing.T, ctx context.Context, name, tok, session string)
	}{
		{"token released by another process", func(t *testing.T, _ context.Context, _, tok, _ string) {
			code, _, stderr := s.fencer(nil, "release", "--token", tok)
			require.Equal(t, 0, code, stderr)
		}},
		{"holder key deleted", func(t *testing.T, ctx context.Context, name, _, _ string) {
			resp, err := cli.Delete(ctx, holderkey.Key("/fencer/", name))
			require.NoError(t, err)
			require.EqualValues(t, 1, resp.Deleted)
		}},
		{"session revoked", func(t *testing.T, ctx context.Context, _, _, session string) {
			id, err := strconv.ParseInt(session, 10, 64)
			require.NoError(t, err)
			_, err = cli.Revoke(ctx, clientv3.LeaseID(id))
			require.NoError(t, err)
		}},
	} {
		for _, delay := range []string{"", "0"} {
			t.Run(end.name+"/lock-delay="+delay, func(t *testing.T) {
				ctx := fencertest.Context(t)
				name := "stubborn" + strconv.Itoa(int(time.Now().UnixNano()%1e9))
				dir := t.TempDir()
				oldLog, newLog, sessFile := filepath.Join(dir, "old"), filepath.Join(dir, "new"), filepath.Join(dir, "session")
				flags := []string{"--ttl", "4s", "--grace", "1s"}
				if delay != "" {
					flags = append(flags, "--lock-delay", delay)
				}
				old, _, tok := rtCommand(t, s, nil, flags, name,
					`trap '' TERM; echo $FENCER_SESSION > `+sessFile+`; echo $$ $FENCER_TOKEN; while :; do date +%s%N >> `+oldLog+`; sleep 0.05; done`)
				succ := s.startFencer(nil, "acquire", "--ttl", "4s", name, "--", "sh", "-c", `date +%s%N >> `+newLog)
				require.Eventually(t, func() bool { return strings.Contains(succ.stderr.String(), "waiting for "+name) }, printBound, 10*time.Millisecond, succ.stderr.String())
				session, err := os.ReadFile(sessFile)
				require.NoError(t, err)

				end.end(t, ctx, name, tok, strings.TrimSpace(string(session)))
				require.Equal(t, rtExitLeaseLost, old.wait(t, 15*time.Second), old.stderr.String())
				require.Equal(t, 0, succ.wait(t, 15*time.Second), succ.stderr.String())

				lastOld, firstNew := stamps(t, oldLog, true), stamps(t, newLog, false)
				if delay == "0" {
					require.Less(t, firstNew, lastOld, "without a lock-delay the successor was expected to overlap the stubborn command")
					return
				}
				require.Greater(t, firstNew, lastOld, "the successor's command ran %s before the old command's last write", time.Duration(lastOld-firstNew))
			})
		}
	}
}

// stamps returns the last (or first) of the nanosecond timestamps in file.
func stamps(t *testing.T, file string, last bool) int64 {
	t.Helper()
	b, err := os.ReadFile(file)
	require.NoError(t, err)
	lines := strings.Fields(string(b))
	require.NotEmpty(t, lines, file)
	pick := lines[0]
	if last {
		pick = lines[len(lines)-1]
	}
	n, err := strconv.ParseInt(pick, 10, 64)
	require.NoError(t, err, file)
	return n
}

// TestLockDelayNoWaitExitsHeld: acquire --wait=false on a lease in its
// lock-delay exits 5 with a message that names the delay, and a lease
// released by its own acquire is free at once.
func TestLockDelayNoWaitExitsHeld(t *testing.T) {
	s := startServeProc(t)
	code, _, stderr := s.fencer(nil, "acquire", "--lock-delay", "2s", "clean", "--", "true")
	require.Equal(t, 0, code, stderr)
	code, _, stderr = s.fencer(nil, "acquire", "--wait=false", "clean", "--", "true")
	require.Equal(t, 0, code, "a lease its holder released cleanly must be free at once: %s", stderr)

	p, tok := rtHold(t, s, "--lock-delay", "2s", "dirty")
	code, _, stderr = s.fencer(nil, "release", "--token", tok)
	require.Equal(t, 0, code, stderr)
	require.Equal(t, rtExitLeaseLost, p.wait(t, 10*time.Second), p.stderr.String())
	code, _, stderr = s.fencer(nil, "acquire", "--wait=false", "dirty", "--", "true")
	require.Equal(t, 5, code, stderr)
	require.Contains(t, stderr, `lease "dirty" is in its lock-delay of 2s`)
	code, _, stderr = s.fencer(nil, "acquire", "--wait-timeout", "15s", "dirty", "--", "true")
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stderr, "waiting for dirty: lease \"dirty\" is in its lock-delay")
}

// TestLockDelayCoversAHolderThatCannotHear: the holder's acquire reaches
// the store through a replica that freezes (SIGSTOP: a partition between
// them) just before another process releases its token through another
// replica. The holder cannot learn of the end; it stops its stubborn
// command only at its session's deadline, a TTL after its last renewal,
// and the watchdog kills it --grace later. The default lock-delay
// (--ttl + --grace + 1s) keeps a waiting successor out until then; the
// former default of --grace + 1s (here 2s) did not, by up to the TTL.
func TestLockDelayCoversAHolderThatCannotHear(t *testing.T) {
	member := fencertest.Etcd(t)
	s := startServeProc(t, "--etcd-endpoints", member.Endpoint())
	frozen := startServeProc(t, "--etcd-endpoints", member.Endpoint())
	for _, tc := range []struct {
		delay   string
		overlap bool
	}{{"", false}, {"2s", true}} {
		t.Run("lock-delay="+tc.delay, func(t *testing.T) {
			name := "unheard" + strconv.Itoa(int(time.Now().UnixNano()%1e9))
			dir := t.TempDir()
			oldLog, newLog := filepath.Join(dir, "old"), filepath.Join(dir, "new")
			flags := []string{"--ttl", "8s", "--grace", "1s"}
			if tc.delay != "" {
				flags = append(flags, "--lock-delay", tc.delay)
			}
			old, _, tok := rtCommand(t, frozen, nil, flags, name,
				`trap '' TERM; echo $$ $FENCER_TOKEN; while :; do date +%s%N >> `+oldLog+`; sleep 0.05; done`)
			succ := s.startFencer(nil, "acquire", "--ttl", "4s", name, "--", "sh", "-c", `date +%s%N >> `+newLog)
			require.Eventually(t, func() bool { return strings.Contains(succ.stderr.String(), "waiting for "+name) }, printBound, 10*time.Millisecond, succ.stderr.String())

			require.NoError(t, frozen.cmd.Process.Signal(syscall.SIGSTOP))
			thawed := false
			thaw := func() {
				if !thawed {
					thawed = true
					_ = frozen.cmd.Process.Signal(syscall.SIGCONT)
				}
			}
			defer thaw()
			code, _, stderr := s.fencer(nil, "release", "--token", tok)
			require.Equal(t, 0, code, stderr)
			require.Equal(t, 0, succ.wait(t, 30*time.Second), succ.stderr.String())
			require.Equal(t, rtExitLeaseLost, old.wait(t, 30*time.Second), old.stderr.String())
			thaw()

			lastOld, firstNew := stamps(t, oldLog, true), stamps(t, newLog, false)
			if tc.overlap {
				require.Less(t, firstNew, lastOld, "with a lock-delay shorter than the TTL the successor was expected to overlap the unhearing holder's command")
				return
			}
			require.Greater(t, firstNew, lastOld, "the successor's command ran %s before the old command's last write", time.Duration(lastOld-firstNew))
		})
	}
}
