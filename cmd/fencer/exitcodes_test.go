package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
)

// TestExitCodes runs the fencer binary into each documented exit code
// against a fencer serve with bearer tokens and an authorization file, and
// checks the message says what to do next and quotes no transport text
// or Go package.
func TestExitCodes(t *testing.T) {
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	require.NoError(t, os.WriteFile(tokens, []byte("alice-token-0123456789 alice\nbob-token-01234567890 bob\n"), 0o600))
	authz := filepath.Join(dir, "authz.yaml")
	require.NoError(t, os.WriteFile(authz, []byte("principals:\n  alice:\n    leases: [\"*\"]\n    write: [\"*\"]\n    resources: [\"*\"]\n  bob:\n    leases: [\"bob-*\"]\n"), 0o600))
	s := startServeProc(t, "--token-file", tokens, "--authz-file", authz)
	alice := []string{"FENCER_AUTH_TOKEN=alice-token-0123456789"}
	bob := []string{"FENCER_AUTH_TOKEN=bob-token-01234567890"}

	// Two tokens of lease "orders": old is stale once cur is acquired.
	code, old, stderr := s.fencer(alice, "acquire", "orders", "--", "sh", "-c", `echo "$FENCER_TOKEN"`)
	require.Equal(t, 0, code, stderr)
	old = strings.TrimSpace(old)
	holder := s.startFencer(alice, "acquire", "orders")
	require.Eventually(t, func() bool { return strings.HasSuffix(holder.stdout.String(), "\n") }, printBound, 10*time.Millisecond, holder.stderr.String())
	cur := strings.TrimSpace(holder.stdout.String())
	code, _, stderr = s.fencer(alice, "put", "--token", cur, "orders/total", "100")
	require.Equal(t, 0, code, stderr)
	billing := s.startFencer(alice, "acquire", "billing")
	require.Eventually(t, func() bool { return strings.HasSuffix(billing.stdout.String(), "\n") }, printBound, 10*time.Millisecond, billing.stderr.String())
	other := strings.TrimSpace(billing.stdout.String())

	for _, tc := range []struct {
		name string
		env  []string
		args []string
		code int
		msg  string // a regexp the message on stderr must match
	}{
		{"usage: unknown flag", alice, []string{"status", "--bogus"}, exitUsage, `unknown flag: --bogus`},
		{"usage: flag after NAME, command without --", alice, []string{"acquire", "x", "--ttl", "2s", "sh", "-c", "true"}, exitUsage, `goes after --`},
		{"usage: no --", alice, []string{"acquire", "x", "true"}, exitUsage, `put -- between NAME and the command`},
		{"usage: malformed token", alice, []string{"put", "--token", "v9:nope", "k", "v"}, exitUsage, `malformed token: version "v9": want "v1"`},
		{"usage: bad environment variable", append([]string{"FENCER_TIMEOUT=soon"}, alice...), []string{"status"}, exitUsage, `\$FENCER_TIMEOUT="soon"`},
		{"not found", alice, []string{"get", "orders/none"}, exitNotFound, `key "orders/none" not found`},
		{"stale put", alice, []string{"put", "--token", old, "orders/total", "999"}, exitStale, `stale token: .* is superseded by ` + regexp.QuoteMeta(cur) + `; nothing was written`},
		{"stale check", alice, []string{"check", "--token", old}, exitStale, `^$`},
		{"held", alice, []string{"acquire", "--wait=false", "orders", "--", "true"}, exitHeld, `lease "orders" is held by alice/`},
		{"held, wait timed out", alice, []string{"acquire", "--wait-timeout", "2s", "orders"}, exitHeld, `gave up waiting for orders after --wait-timeout 2s, held by alice/`},
		{"permission denied", bob, []string{"acquire", "orders", "--", "true"}, exitDenied, `permission denied by fencer at`},
		{"unauthenticated", []string{"FENCER_AUTH_TOKEN=wrong-token-0123456789"}, []string{"status"}, exitDenied, `refused the credentials: set --auth-token-file`},
		{"unavailable", append([]string{"FENCER_SERVER=" + freeAddr(t)}, alice...), []string{"status"}, exitUnavailable, "cannot reach fencer at .*: is `fencer serve` running\\? set --server or FENCER_SERVER"},
		{"foreign lease", alice, []string{"put", "--token", other, "orders/total", "0"}, exitForeign, `the key belongs to lease "orders", not "billing".*--take-over`},
		{"command not executable", alice, []string{"acquire", "cmd", "--", tokens}, exitCannotExec, `cannot run ` + regexp.QuoteMeta(tokens)},
		{"command not found", alice, []string{"acquire", "cmd", "--", "/no/such/command"}, exitNoCommand, `cannot run /no/such/command`},
		{"command's own status", alice, []string{"acquire", "cmd", "--", "sh", "-c", "exit 42"}, 42, `^$`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := s.fencer(tc.env, tc.args...)
			require.Equal(t, tc.code, code, "stdout: %s\nstderr: %s", stdout, stderr)
			require.Regexp(t, tc.msg, message(stderr), "stderr: %s", stderr)
			requireNoLeaks(t, stderr)
		})
	}

	t.Run("lease lost while the command ran", func(t *testing.T) {
		p := s.startFencer(alice, "acquire", "--grace", "1s", "lost", "--", "sh", "-c", `echo "$FENCER_TOKEN"; exec sleep 30`)
		require.Eventually(t, func() bool { return strings.HasSuffix(p.stdout.String(), "\n") }, printBound, 10*time.Millisecond, p.stderr.String())
		tok := strings.TrimSpace(p.stdout.String())
		code, _, stderr := s.fencer(alice, "release", "--token", tok)
		require.Equal(t, 0, code, stderr)
		require.Equal(t, exitLeaseLost, p.wait(t, 10*time.Second), p.stderr.String())
		require.Contains(t, p.stderr.String(), "lease lost ("+tok+": its holder key was deleted or replaced)")
		require.Contains(t, p.stderr.String(), "the lease was lost while it ran")
		requireNoLeaks(t, p.stderr.String())
	})
}

// requireNoLeaks fails if fencer's messages quote a Go package's error
// prefix or gRPC transport text.
func requireNoLeaks(t *testing.T, stderr string) {
	t.Helper()
	for _, leak := range []string{"client: ", "etcdstore: ", "server: ", "token: stale", "token: malformed", "token: foreign", "token: lease", "rpc error", "transport", "preface"} {
		require.NotContains(t, stderr, leak)
	}
}

// message is what fencer said on stderr, without acquire's progress
// lines and the pointer to --help.
func message(stderr string) string {
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(stderr), "\n") {
		if !strings.HasPrefix(l, "fencer acquire: holding ") && !strings.HasPrefix(l, "fencer acquire: waiting for ") && !strings.HasPrefix(l, "Run '") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestDescribeSaysWhenEtcdIsOutOfSpace: a write the server's etcd refused
// for space (UNAVAILABLE, STORE_UNAVAILABLE, cause no_space, as the Go
// client returns it) exits 7 saying so, and that nothing was written;
// the server's other etcd failures keep the message that the write may
// have committed.
func TestDescribeSaysWhenEtcdIsOutOfSpace(t *testing.T) {
	refused := func(cause string) error {
		st, err := status.New(codes.Unavailable, "etcd refused the request").WithDetails(&errdetails.ErrorInfo{
			Reason: fencerv1.ErrorReason_ERROR_REASON_STORE_UNAVAILABLE.Reason(), Domain: fencerv1.ErrorDomain,
			Metadata: map[string]string{"cause": cause},
		})
		require.NoError(t, err)
		return fmt.Errorf("client: %w", st.Err())
	}
	f := describe(refused("no_space"), "127.0.0.1:7070", false)
	require.Equal(t, exitUnavailable, f.code)
	require.Contains(t, f.msg, "out of space (NOSPACE)")
	require.Contains(t, f.msg, "nothing was written")
	require.NotContains(t, f.msg, "may have committed")
	f = describe(refused("timeout"), "127.0.0.1:7070", false)
	require.Equal(t, exitUnavailable, f.code)
	require.Contains(t, f.msg, "cannot reach its etcd")
	require.Contains(t, f.msg, "may or may not have committed")
}
