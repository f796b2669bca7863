package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fencer-dev/fencer/etcdstore"
	"github.com/fencer-dev/fencer/fencertest"
	"github.com/fencer-dev/fencer/server"
)

// startService runs an embedded etcd and an in-process server and returns
// the server address and the store.
func startService(t *testing.T) (string, *etcdstore.Store) {
	t.Helper()
	st := fencertest.StoreOn(t, []string{startEtcd(t)})
	addr, _ := fencertest.Serve(t, server.Config{Store: st, Authenticator: server.Anonymous("tester")})
	return addr, st
}

// startEtcd runs an embedded etcd member until the test ends and returns
// its client endpoint.
func startEtcd(t *testing.T) string {
	t.Helper()
	return fencertest.Etcd(t).Endpoint()
}

func TestAcquireCommand(t *testing.T) {
	addr, st := startService(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	t.Run("propagates the exit code and passes the token", func(t *testing.T) {
		var out, errb bytes.Buffer
		code := runAcquire(ctx, []string{"--server", addr, "exit-code", "--", "sh", "-c", `echo "$FENCER_TOKEN"; exit 7`}, &out, &errb)
		require.Equal(t, 7, code, errb.String())
		require.True(t, strings.HasPrefix(out.String(), "v1:1:"), out.String())
	})

	t.Run("stops CMD when the lease is deleted", func(t *testing.T) {
		var out, errb safeBuffer
		done := make(chan int, 1)
		go func() {
			done <- runAcquire(ctx, []string{"--server", addr, "--grace", "2s", "deleted", "--", "sh", "-c", `echo started; exec sleep 60`}, &out, &errb)
		}()
		require.Eventually(t, func() bool { return strings.Contains(out.String(), "started") }, printBound, 20*time.Millisecond)

		// status lists the holder and token.
		var sout, serr bytes.Buffer
		require.Equal(t, 0, runStatus(ctx, []string{"--server", addr, "--output", "json"}, &sout, &serr), serr.String())
		var rows []statusRow
		require.NoError(t, json.Unmarshal(sout.Bytes(), &rows))
		require.Len(t, rows, 2)
		require.Equal(t, "deleted", rows[0].Name)
		require.True(t, rows[0].Held)
		require.True(t, strings.HasPrefix(rows[0].Holder, "tester/"))
		require.True(t, strings.HasPrefix(rows[0].Token, "v1:1:"))
		require.False(t, rows[1].Held, "exit-code was released")
		sout.Reset()
		require.Equal(t, 0, runStatus(ctx, []string{"--server", addr}, &sout, &serr))
		require.Contains(t, sout.String(), "LEASE")
		require.Contains(t, sout.String(), rows[0].Token)

		start := time.Now()
		_, err := st.Client().Delete(ctx, st.Prefix()+"leases/deleted")
		require.NoError(t, err)
		select {
		case code := <-done:
			require.Equal(t, exitLeaseLost, code, errb.String())
			require.Less(t, time.Since(start), 2*time.Second)
			require.Contains(t, errb.String(), "lease lost")
		case <-time.After(10 * time.Second):
			t.Fatal("CMD not stopped")
		}
	})
}

func TestPutGetCheckCommands(t *testing.T) {
	addr, _ := startService(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out, errb bytes.Buffer

	// Without a token, put refuses.
	t.Setenv("FENCER_TOKEN", "")
	require.Equal(t, exitUsage, runPut(ctx, []string{"--server", addr, "k", "v"}, &out, &errb))
	require.Contains(t, errb.String(), "no token")

	// A stale token is refused, and check says so.
	t.Setenv("FENCER_TOKEN", "v1:1:2:nobody")
	errb.Reset()
	require.Equal(t, exitStale, runPut(ctx, []string{"--server", addr, "k", "v"}, &out, &errb))
	require.Contains(t, errb.String(), "stale token: v1:1:2:nobody")
	out.Reset()
	require.Equal(t, exitStale, runCheck(ctx, []string{"--server", addr, "--output", "json"}, &out, &errb))
	require.Contains(t, out.String(), `"current": false`)
	require.Equal(t, exitNotFound, runGet(ctx, []string{"--server", addr, "k"}, &out, &errb))
}
