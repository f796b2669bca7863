package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fencer-dev/fencer/embedetcd"
	"github.com/fencer-dev/fencer/fencertest"
	"github.com/fencer-dev/fencer/internal/freeport"
)

// TestServeRefusesANestedPrefix runs fencer serve with a prefix inside the
// data space of a deployment that exists in the same etcd: it refuses to
// start, naming both prefixes, since the outer deployment's guarded writes
// could forge its leases and tokens. A prefix beside it starts.
func TestServeRefusesANestedPrefix(t *testing.T) {
	member := fencertest.Etcd(t)
	cli := fencertest.Client(t, member.Endpoint())
	_, err := cli.Put(fencertest.Context(t), "/fencer/epochs/T0", "1")
	require.NoError(t, err)
	for _, prefix := range []string{"/fencer/data/tenant2/", "/fencer/owners/x/"} {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		var stderr bytes.Buffer
		code := runServe(ctx, []string{"--listen", freeAddr(t), "--metrics-listen", "", "--etcd-endpoints", member.Endpoint(), "--prefix", prefix}, &bytes.Buffer{}, &stderr)
		cancel()
		require.Equal(t, 1, code, "prefix %s: %s", prefix, stderr.String())
		require.Contains(t, stderr.String(), `fencer serve: --prefix "`+prefix+`" lies inside the key space of the deployment with prefix "/fencer/"`)
		requireNoLeaks(t, stderr.String())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	var stderr bytes.Buffer
	code := runServe(ctx, []string{"--listen", freeAddr(t), "--metrics-listen", "", "--etcd-endpoints", member.Endpoint(), "--prefix", "/tenant2/"}, &bytes.Buffer{}, &stderr)
	require.Equal(t, 0, code, stderr.String())
	require.Contains(t, stderr.String(), "serving")
}

// TestServeRefusesANestedPrefixOnceEtcdAnswers starts fencer serve, with a
// prefix inside another deployment's key space, while its etcd is down: it
// starts, says it could not check the prefix yet, and stops with the
// refusal once etcd is back.
func TestServeRefusesANestedPrefixOnceEtcdAnswers(t *testing.T) {
	dir := t.TempDir()
	ports, release, err := freeport.Take(2)
	require.NoError(t, err)
	release()
	m := embedetcd.Member{Name: "nested", Dir: dir, ClientPort: ports[0], PeerPort: ports[1]}
	member, err := embedetcd.Start(fencertest.Context(t), m)
	require.NoError(t, err)
	_, err = fencertest.Client(t, member.Endpoint()).Put(fencertest.Context(t), "/fencer/leases/T0", "x")
	require.NoError(t, err)
	endpoint := member.Endpoint()
	member.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var stderr safeBuffer
	done := make(chan int, 1)
	go func() {
		done <- runServe(ctx, []string{"--listen", freeAddr(t), "--metrics-listen", "", "--etcd-endpoints", endpoint, "--prefix", "/fencer/data/t2/"}, &bytes.Buffer{}, &stderr)
	}()
	require.Eventually(t, func() bool { return strings.Contains(stderr.String(), "could not check --prefix yet") }, printBound, 20*time.Millisecond, "%s", &stderr)
	member, err = embedetcd.Start(fencertest.Context(t), m)
	require.NoError(t, err)
	t.Cleanup(member.Close)
	select {
	case code := <-done:
		require.Equal(t, 1, code, stderr.String())
		require.Contains(t, stderr.String(), `prefix "/fencer/data/t2/" lies inside the key space of the deployment with prefix "/fencer/"`)
	case <-time.After(30 * time.Second):
		t.Fatalf("fencer serve did not stop once etcd answered: %s", stderr.String())
	}
}
