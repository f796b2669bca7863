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
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/fencer-dev/fencer/fencertest"
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
	ctx := fencertest.Context(t)
	path := filepath.Join(t.TempDir(), "tokens")
	const oldTok, newTok = "old-token-0123456789", "new-token-0123456789"
	writeAtomically(t, path, oldTok+" alice\n")
	rec := newRecorder()
	tf, err := server.NewTokenFile(path, slog.New(rec))
	require.NoError(t, err)
	follow(t, tf.Start)
	addr, _ := serve(t, server.Config{Store: fencertest.SharedStore(t), Authenticator: tf})
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

// renew keeps session id alive over one KeepAlive stream, a renewal
// every 200ms, until the stream ends; the stream's end goes to the
// returned channel.
func renew(t *testing.T, ctx context.Context, rpc fencerv1.FencerServiceClient, id int64) <-chan error {
	ka, err := rpc.KeepAlive(ctx)
	require.NoError(t, err)
	ended := make(chan error, 1)
	go func() {
		for {
			if err := ka.Send(&fencerv1.KeepAliveRequest{SessionId: id}); err != nil {
				_, err = ka.Recv() // the stream's status
				ended <- err
				return
			}
			if _, err := ka.Recv(); err != nil {
				ended <- err
				return
			}
			select {
			case <-ctx.Done():
				ended <- ctx.Err()
				return
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	return ended
}

// TestTokenFileRemovedTokenEndsItsStreams removes a token from the token
// file while its KeepAlive and WatchLease streams are open: both end with
// UNAUTHENTICATED, so the session is no longer renewed and expires after
// its TTL. A session renewed with a token the file keeps stays alive.
func TestTokenFileRemovedTokenEndsItsStreams(t *testing.T) {
	ctx := fencertest.Context(t)
	path := filepath.Join(t.TempDir(), "tokens")
	const carolTok, daveTok = "carol-token-0123456789", "dave-token-0123456789"
	writeAtomically(t, path, carolTok+" carol\n"+daveTok+" dave\n")
	tf, err := server.NewTokenFile(path, nil)
	require.NoError(t, err)
	follow(t, tf.Start)
	st := fencertest.SharedStore(t)
	addr, _ := serve(t, server.Config{Store: st, Authenticator: tf})
	carol := fencerv1.NewFencerServiceClient(dial(t, carolTok, addr))
	dave := fencerv1.NewFencerServiceClient(dial(t, daveTok, addr))
	const ttl = 2
	carolLease, err := carol.Acquire(ctx, &fencerv1.AcquireRequest{Name: "carols", TtlSeconds: ttl})
	require.NoError(t, err)
	daveLease, err := dave.Acquire(ctx, &fencerv1.AcquireRequest{Name: "daves", TtlSeconds: ttl})
	require.NoError(t, err)
	carolRenewal := renew(t, ctx, carol, carolLease.GetSessionId())
	daveRenewal := renew(t, ctx, dave, daveLease.GetSessionId())
	watch, err := carol.WatchLease(ctx, &fencerv1.WatchLeaseRequest{SessionId: carolLease.GetSessionId()})
	require.NoError(t, err)
	_, err = watch.Recv() // SYNCED
	require.NoError(t, err)

	writeAtomically(t, path, daveTok+" dave\n")
	select {
	case err := <-carolRenewal:
		require.Equal(t, codes.Unauthenticated, status.Code(err), "%v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("carol's KeepAlive stream still renews after her token was removed")
	}
	watchEnded := make(chan error, 1)
	go func() {
		for {
			if _, err := watch.Recv(); err != nil {
				watchEnded <- err
				return
			}
		}
	}()
	select {
	case err := <-watchEnded:
		require.Equal(t, codes.Unauthenticated, status.Code(err), "%v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("carol's WatchLease stream still open after her token was removed")
	}
	remaining := func(id int64) int64 {
		resp, err := st.Client().TimeToLive(ctx, clientv3.LeaseID(id))
		require.NoError(t, err)
		return resp.TTL
	}
	require.Eventually(t, func() bool { return remaining(carolLease.GetSessionId()) < 0 }, 10*time.Second, 100*time.Millisecond,
		"carol's session expires once no longer renewed")
	require.Positive(t, remaining(daveLease.GetSessionId()), "dave's session is still renewed")
	select {
	case err := <-daveRenewal:
		t.Fatalf("dave's KeepAlive stream ended: %v", err)
	default:
	}
}

// TestBearerSchemeIsCaseInsensitive sends the authorization scheme in
// other cases, which RFC 7235 allows; other schemes are still refused.
func TestBearerSchemeIsCaseInsensitive(t *testing.T) {
	const tok = "token-0123456789ab"
	auth, err := server.NewBearerTokens(map[string]string{tok: "alice"})
	require.NoError(t, err)
	authenticate := func(header string) (string, error) {
		return auth.Authenticate(metadata.NewIncomingContext(context.Background(), metadata.Pairs("authorization", header)))
	}
	for _, scheme := range []string{"Bearer", "bearer", "BEARER", "bEaReR"} {
		p, err := authenticate(scheme + " " + tok)
		require.NoError(t, err, scheme)
		require.Equal(t, "alice", p, scheme)
	}
	for _, header := range []string{"Basic " + tok, "Bearer" + tok, tok, "Bearer  " + tok, "Bearer " + tok + " "} {
		_, err := authenticate(header)
		require.ErrorIs(t, err, server.ErrUnauthenticated, header)
	}
}

// TestTokenFileRemovedTokenEndsAnIdleKeepAlive removes a token from the
// token file while its KeepAlive stream waits for the next renewal: the
// stream ends with UNAUTHENTICATED at once, not when the client next
// renews.
func TestTokenFileRemovedTokenEndsAnIdleKeepAlive(t *testing.T) {
	ctx := fencertest.Context(t)
	path := filepath.Join(t.TempDir(), "tokens")
	const carolTok = "carol-token-0123456789"
	writeAtomically(t, path, carolTok+" carol\n")
	tf, err := server.NewTokenFile(path, nil)
	require.NoError(t, err)
	follow(t, tf.Start)
	addr, _ := serve(t, server.Config{Store: fencertest.SharedStore(t), Authenticator: tf})
	carol := fencerv1.NewFencerServiceClient(dial(t, carolTok, addr))
	ar, err := carol.Acquire(ctx, &fencerv1.AcquireRequest{Name: "idle-carol"})
	require.NoError(t, err)
	ka, err := carol.KeepAlive(ctx)
	require.NoError(t, err)
	require.NoError(t, ka.Send(&fencerv1.KeepAliveRequest{SessionId: ar.GetSessionId()}))
	_, err = ka.Recv()
	require.NoError(t, err)

	writeAtomically(t, path, "dave-token-0123456789 dave\n")
	ended := make(chan error, 1)
	go func() {
		_, err := ka.Recv()
		ended <- err
	}()
	select {
	case err := <-ended:
		require.Equal(t, codes.Unauthenticated, status.Code(err), "%v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("carol's idle KeepAlive stream outlived her token")
	}
}
