package fencertest_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestConsumerModule copies this package's examples and TestMain into a
// module of its own that requires fencer (replaced by this checkout) and
// runs Example_supersededController there: a reconciler superseded on
// embedded etcd, through the public API only, since a module outside
// fencer cannot import anything internal. It needs no network when the
// module cache already holds fencer's dependencies, as it does wherever
// fencer builds.
func TestConsumerModule(t *testing.T) {
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	dir := t.TempDir()
	goMod := "module example.com/consumer\n\ngo 1.26.0\n\n" +
		"require github.com/fencer-dev/fencer v0.0.0\n\n" +
		"replace github.com/fencer-dev/fencer => " + root + "\n"
	// A dependency's replace directives do not apply to its consumers, so
	// the consumer replaces fencer's light modules too, as it would require
	// their released versions.
	for _, m := range []string{"token", "proto", "client", "kubeadapter", "internal/mutant", "internal/freeport", "internal/rendezvous"} {
		goMod += "replace github.com/fencer-dev/fencer/" + m + " => " + filepath.Join(root, m) + "\n"
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "go.mod"), []byte(goMod), 0o600))
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "go.sum"), sum, 0o600))
	for _, name := range []string{"main_test.go", "example_test.go", "example_t_test.go"} {
		src, err := os.ReadFile(name)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), src, 0o600))
	}

	goBin, err := exec.LookPath("go")
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	args := append([]string{"test", "-count=1", "-run", "^Example_supersededController$", "-v"}, raceFlags...)
	cmd := exec.CommandContext(ctx, goBin, append(args, ".")...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOWORK=off")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "go test in the consumer module:\n%s", out)
	require.Contains(t, string(out), "--- PASS: Example_supersededController")
}
