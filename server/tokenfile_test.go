package server_test

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/fencer-dev/fencer/internal/etcdtest"
	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
	"github.com/fencer-dev/fencer/server"
)

// writeAtomically replaces path's content the way editors and secret
// mounts do: a new file renamed over the old.
func writeAtomically(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	require.NoError(t, os.WriteFile(tmp, []byte(content), 0o600))
	require.NoError(t, os.Rename(tmp, path))
}

// follow runs a file's Start until the test ends, and checks that it
// ended without an error.
func follow(t *testing.T, start func(context.Context) error) {
	ctx, cancel := context.WithCancel(context.Background())
	watching := make(chan error, 1)
	go func() { watching <- start(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-watching)
	})
}

// TestTokenFileRotation rotates a served token file: the new token is
// accepted and the old one refused without a restart; a broken file
// keeps the tokens in force.
func TestTokenFileRotation(t *testing.T) {
	ctx := etcdtest.Context(t)
	path := filepath.Join(t.TempDir(), "tokens")
	const oldTok, newTok = "old-token-0123456789", "new-token-0123456789"
	writeAtomically(t, path, oldTok+" alice\n")
	rec := newRecorder()
	tf, err := server.NewTokenFile(path, slog.New(rec))
	require.NoError(t, err)
	follow(t, tf.Start)
	addr, _ := serve(t, server.Config{Store: etcdtest.Store(t), Authenticator: tf})
	call := func(tok string) codes.Code {
		_, err := fencerv1.NewFencerServiceClient(dial(t, tok, addr)).ListLeases(ctx, &fencerv1.ListLeasesRequest{})
		return status.Code(err)
	}
	require.Equal(t, codes.OK, call(oldTok))
	require.Equal(t, codes.Unauthenticated, call(newTok))

	writeAtomically(t, path, newTok+" alice\n")
	require.Eventually(t, func() bool { return call(newTok) == codes.OK }, 10*time.Second, 20*time.Millisecond)
	require.Equal(t, codes.Unauthenticated, call(oldTok))

	writeAtomically(t, path, "short alice\n")
	failed := func(m map[string]any) bool { return m["level"] == slog.LevelError }
	require.Eventually(t, func() bool { return len(rec.find(failed)) > 0 }, 10*time.Second, 20*time.Millisecond)
	require.Equal(t, codes.OK, call(newTok))
	require.Equal(t, codes.Unauthenticated, call("short"))
}

func TestNewTokenFileRejectsABadFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens")
	require.NoError(t, os.WriteFile(path, []byte("short alice\n"), 0o600))
	_, err := server.NewTokenFile(path, nil)
	require.Error(t, err)
	_, err = server.NewTokenFile(filepath.Join(t.TempDir(), "missing"), nil)
	require.ErrorIs(t, err, os.ErrNotExist)
}

// TestTokenFileBadReloadLoggedOnce logs to a file beside the token file,
// as a server whose standard error goes to its working directory does:
// a token file that does not load (bad in place, bad renamed over, then
// missing) is logged once per change, not again for the events its own
// log records make, and a good file afterwards is loaded.
func TestTokenFileBadReloadLoggedOnce(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "tokens")
	const tok, newTok = "token-0123456789ab", "new-token-0123456789"
	writeAtomically(t, path, tok+" alice\n")
	logFile, err := os.Create(filepath.Join(dir, "serve.log"))
	require.NoError(t, err)
	t.Cleanup(func() { logFile.Close() })
	tf, err := server.NewTokenFile(path, slog.New(slog.NewTextHandler(logFile, nil)))
	require.NoError(t, err)
	follow(t, tf.Start)
	failures := func() int {
		raw, err := os.ReadFile(logFile.Name())
		require.NoError(t, err)
		return strings.Count(string(raw), "reload failed")
	}
	// breaks makes the file fail to load and returns how many failures
	// were logged over a short while after the first.
	breaks := func(what string, change func()) int {
		before := failures()
		change()
		require.Eventually(t, func() bool { return failures() > before }, 10*time.Second, 10*time.Millisecond, what)
		time.Sleep(300 * time.Millisecond)
		return failures() - before
	}
	principal := func(tok string) string {
		p, _ := tf.Authenticate(metadata.NewIncomingContext(context.Background(), metadata.Pairs("authorization", "Bearer "+tok)))
		return p
	}
	require.LessOrEqual(t, breaks("bad in place", func() {
		require.NoError(t, os.WriteFile(path, []byte("short alice\n"), 0o600))
	}), 3, "bad in place")
	require.LessOrEqual(t, breaks("bad renamed over", func() { writeAtomically(t, path, "short bob\n") }), 3, "bad renamed over")
	require.LessOrEqual(t, breaks("missing", func() { require.NoError(t, os.Rename(path, path+".bak")) }), 3, "missing")
	require.Equal(t, "alice", principal(tok), "the tokens last loaded stay in force")

	writeAtomically(t, path, newTok+" carol\n")
	require.Eventually(t, func() bool { return principal(newTok) == "carol" }, 10*time.Second, 10*time.Millisecond)
	require.Empty(t, principal(tok))
}
