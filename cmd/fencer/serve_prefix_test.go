package main

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fencer-dev/fencer/internal/etcdtest"
)

// TestServeRefusesANestedPrefix runs fencer serve with a prefix inside the
// data space of a deployment that exists in the same etcd: it refuses to
// start, naming both prefixes, since the outer deployment's guarded writes
// could forge its leases and tokens. A prefix beside it starts.
func TestServeRefusesANestedPrefix(t *testing.T) {
	member := etcdtest.Start(t)
	cli := etcdtest.Client(t, member.Endpoint())
	_, err := cli.Put(etcdtest.Context(t), "/fencer/epochs/T0", "1")
	require.NoError(t, err)
	for _, prefix := range []string{"/fencer/data/tenant2/", "/fencer/epochs/x/", "/fencer/other/"} {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		var stderr bytes.Buffer
		code := runServe(ctx, []string{"--listen", freeAddr(t), "--metrics-listen", "", "--etcd-endpoints", member.Endpoint(), "--prefix", prefix}, &bytes.Buffer{}, &stderr)
		cancel()
		require.Equal(t, 1, code, "prefix %s: %s", prefix, stderr.String())
		require.Contains(t, stderr.String(), `prefix "`+prefix+`" lies inside the key space of the deployment with prefix "/fencer/"`)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	var stderr bytes.Buffer
	code := runServe(ctx, []string{"--listen", freeAddr(t), "--metrics-listen", "", "--etcd-endpoints", member.Endpoint(), "--prefix", "/tenant2/"}, &bytes.Buffer{}, &stderr)
	require.Equal(t, 0, code, stderr.String())
	require.Contains(t, stderr.String(), "serving")
}
