package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestDemoShowsStaleWriteRejected(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out, errOut bytes.Buffer
	// A's session never renews, so it must acquire within one TTL of its
	// grant: 3s leaves room on a loaded machine.
	code := dispatch(ctx, []string{"demo", "--ttl", "3s", "--data-dir", t.TempDir()}, &out, &errOut)
	require.Equal(t, 0, code, "stderr: %s", errOut.String())
	text := out.String()
	for _, want := range []string{
		`A  acquired lease "orders"            token v1:1:`,
		`B  acquired lease "orders"            token v1:2:`,
		"REJECTED by etcd: token: stale:",
		`final value of orders/total: "250 (written by B)"`,
	} {
		require.Contains(t, text, want)
	}
	require.Less(t, strings.Index(text, "B  put orders/total = 250"), strings.Index(text, "REJECTED"))
}

func TestDispatchUsage(t *testing.T) {
	var out, errOut bytes.Buffer
	require.Equal(t, 2, dispatch(context.Background(), nil, &out, &errOut))
	require.Contains(t, errOut.String(), "a command is required")
	require.Contains(t, errOut.String(), "fencer --help")
	errOut.Reset()
	require.Equal(t, 2, dispatch(context.Background(), []string{"nope"}, &out, &errOut))
	require.Contains(t, errOut.String(), `unknown command "nope"`)
	require.Equal(t, 2, dispatch(context.Background(), []string{"demo", "--bogus"}, &out, &errOut))
}
