package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestArgumentsMustBeUTF8 gives every verb a name, key or resource that
// is not valid UTF-8, against a running server: each exits 2 naming the
// argument, before any call, and the server is left unchanged. A value
// need not be UTF-8: it is bytes.
func TestArgumentsMustBeUTF8(t *testing.T) {
	addr, st := startService(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	tok := "v1:1:1:x"
	txnFile := func(text string) []string {
		file := filepath.Join(t.TempDir(), "txn")
		require.NoError(t, os.WriteFile(file, []byte(text), 0o600))
		return []string{"txn", "--token", tok, file}
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"put", "--token", tok, "a\xffb", "v"}, `invalid KEY "a\xffb": not valid UTF-8`},
		{[]string{"get", "a\xffb"}, `invalid KEY "a\xffb": not valid UTF-8`},
		{[]string{"delete", "--token", tok, "a\xffb"}, `invalid KEY "a\xffb": not valid UTF-8`},
		{[]string{"advance", "--token", tok, "r\xff"}, `invalid RESOURCE "r\xff": not valid UTF-8`},
		{[]string{"acquire", "x\xff"}, `invalid NAME "x\xff": not valid UTF-8`},
		{[]string{"acquire", "x\xff", "--", "true"}, `invalid NAME "x\xff": not valid UTF-8`},
		{txnFile("\nput \"a\\xffb\" v\n"), `key "a\xffb": not valid UTF-8`},
		{txnFile("version(\"a\\xffb\") = 0\n"), `key "a\xffb": not valid UTF-8`},
	} {
		var stdout, stderr bytes.Buffer
		code := dispatch(ctx, append(c.args, "--server", addr), &stdout, &stderr)
		require.Equal(t, 2, code, "fencer %q: %s", c.args, stderr.String())
		require.Contains(t, stderr.String(), c.want, "fencer %q", c.args)
	}
	resp, err := st.Client().Get(ctx, st.Prefix(), clientv3.WithPrefix(), clientv3.WithCountOnly())
	require.NoError(t, err)
	require.Zero(t, resp.Count, "keys written: %v", resp.Kvs)

	// A value need not be UTF-8: the put reaches the server, which finds
	// the token stale (exit 4).
	var stdout, stderr bytes.Buffer
	require.Equal(t, exitStale, runPut(ctx, []string{"--server", addr, "--token", tok, "k", "a\xffb"}, &stdout, &stderr), stderr.String())
}
