package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestMessagesNameTheCommandOnce runs commands that fail on their input
// through the built binary: each message starts with "fencer CMD: " once,
// followed by what went wrong, never by the command's name again or a Go
// package's prefix.
func TestMessagesNameTheCommandOnce(t *testing.T) {
	bin := fencerBinary(t)
	dir := t.TempDir()
	file := func(name, text string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(text), 0o600))
		return p
	}
	data := filepath.Join(dir, "data")
	serve := []string{"serve", "--listen", "127.0.0.1:0", "--metrics-listen", "", "--data-dir", data}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"txn", "--token", "v1:1:1:x", file("txn", "bogus\n")}, `fencer txn: line 1: want a compare such as value(KEY) = VALUE, got "bogus"`},
		{append(serve, "--authz-file", filepath.Join(dir, "none")), "fencer serve: authorization file: open "},
		{append(serve, "--authz-file", file("authz", "principals: {}\n")), "fencer serve: authorization file " + filepath.Join(dir, "authz") + ": grants nothing to anyone"},
		{append(serve, "--authz-file", file("authz-bad", "principals:\n  \"a b\": {leases: [x]}\n")), `fencer serve: authorization file ` + filepath.Join(dir, "authz-bad") + `: principal "a b" contains`},
		{append(serve, "--token-file", filepath.Join(dir, "none"), "--authz-allow-all"), "fencer serve: token file: open "},
		{append(serve, "--token-file", file("tokens", "# none\n"), "--authz-allow-all"), "fencer serve: token file " + filepath.Join(dir, "tokens") + " holds no tokens"},
		{append(serve, "--token-file", file("tokens-bad", "0123456789abcdef0123456789abcdef a/b\n"), "--authz-allow-all"), "fencer serve: token file " + filepath.Join(dir, "tokens-bad") + `:1: principal "a/b" contains`},
	} {
		code, _, stderr := runBinary(t, bin, c.args...)
		require.NotZero(t, code, "fencer %q", c.args)
		require.True(t, strings.HasPrefix(stderr, c.want), "fencer %q: %s", c.args, stderr)
		requireNoLeaks(t, stderr)
	}
}

// runBinary runs the fencer binary bin with args, without a server or
// FENCER_ variables, and returns its exit code and output.
func runBinary(t *testing.T, bin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), printBound)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = cleanEnv()
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	require.NoError(t, ctx.Err(), "fencer %q still ran after %s", args, printBound)
	return childStatus(err), out.String(), errb.String()
}
