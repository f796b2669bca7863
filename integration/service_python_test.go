package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/fencer-dev/fencer/client"
	"github.com/fencer-dev/fencer/etcdstore"
	"github.com/fencer-dev/fencer/fencertest"
	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
	"github.com/fencer-dev/fencer/server"
	"github.com/fencer-dev/fencer/token"
)

// requirePythonGRPC returns the Python interpreter with grpc and protobuf,
// skipping the test without them, except in CI (CI=true), where their
// absence is a failure: scripts/install-python-deps.sh installs them.
func requirePythonGRPC(t *testing.T) string {
	t.Helper()
	const python = "/usr/bin/python3"
	out, err := exec.Command(python, "-c", "import grpc, google.protobuf").CombinedOutput()
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s with grpc and protobuf is required in CI (scripts/install-python-deps.sh): %v\n%s", python, err, out)
		}
		t.Skipf("no %s with grpc and protobuf (run scripts/install-python-deps.sh): %v", python, err)
	}
	return python
}

// TestServicePythonWriterIsFenced: a Python writer acquires and writes, is
// paused past its TTL, a Go writer supersedes it and writes, and the Python
// writer's late write is rejected with STALE_TOKEN; the data is the Go
// writer's.
func TestServicePythonWriterIsFenced(t *testing.T) {
	python := requirePythonGRPC(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	st, err := etcdstore.New(fencertest.Client(t, fencertest.Etcd(t).Endpoint()))
	require.NoError(t, err)
	const pyToken, goToken = "python-writer-token-0001", "go-writer-token-00000001"
	auth, err := server.NewBearerTokens(map[string]string{pyToken: "python-writer", goToken: "go-writer"})
	require.NoError(t, err)
	addr, _ := fencertest.Serve(t, server.Config{Store: st, Authenticator: auth})

	_, file, _, _ := runtime.Caller(0)
	pyDir := filepath.Join(filepath.Dir(file), "..", "python")
	cmd := exec.CommandContext(ctx, python, filepath.Join(pyDir, "stale_writer.py"), "orders", "orders/42")
	cmd.Env = append(os.Environ(), "PYTHONPATH="+pyDir, "FENCER_SERVER="+addr, "FENCER_AUTH_TOKEN="+pyToken, "PYTHONDONTWRITEBYTECODE=1")
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	lines := bufio.NewScanner(stdout)
	readStep := func() map[string]string {
		t.Helper()
		require.True(t, lines.Scan(), "python writer ended early: %v", lines.Err())
		var m map[string]string
		require.NoError(t, json.Unmarshal(lines.Bytes(), &m), lines.Text())
		return m
	}

	// 1. The Python writer acquired and wrote.
	wrote := readStep()
	require.Equal(t, "wrote", wrote["step"])
	pyTok, err := token.Parse(wrote["token"])
	require.NoError(t, err)

	// 2. A Go writer supersedes it once its lease expires, and writes.
	cc, err := grpc.NewClient("passthrough:///"+addr,
		grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithPerRPCCredentials(client.BearerToken(goToken, false)))
	require.NoError(t, err)
	t.Cleanup(func() { cc.Close() })
	c := client.New(cc)
	sess, err := c.NewSession()
	require.NoError(t, err)
	t.Cleanup(func() { _ = sess.Close(context.Background()) })
	lease, err := sess.Acquire(ctx, "orders")
	require.NoError(t, err)
	require.Greater(t, lease.Token().Revision, pyTok.Revision)
	_, err = c.Put(ctx, lease.Token(), "orders/42", []byte("go"))
	require.NoError(t, err)

	// 3. The Python writer's next write is rejected as stale.
	_, err = stdin.Write([]byte("go\n"))
	require.NoError(t, err)
	late := readStep()
	require.Equal(t, "late", late["step"])
	require.Equal(t, "FAILED_PRECONDITION", late["code"])
	require.Equal(t, fencerv1.ErrorReason_ERROR_REASON_STALE_TOKEN.Reason(), late["reason"])
	require.Equal(t, lease.Token().String(), late["newer_token"])
	require.NoError(t, cmd.Wait())

	v, found, err := c.Get(ctx, "orders/42")
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, "go", string(v.Data))
}
