package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestPythonInstall follows python/README.md's Install section as it is
// written: it runs the block marked python-install with sh -e in a
// directory holding a copy of python/ (so that ./python resolves and the
// venv lands in the test's temporary directory), then runs the writer
// block marked python-writer with the venv's Python against fencer serve,
// from another directory, and compares what it prints. The doc and the
// test cannot drift apart. It needs Debian's python3-venv and
// python3-wheel besides grpc and protobuf (make python-deps); without
// them it skips, except in CI (CI=true), where that is a failure.
func TestPythonInstall(t *testing.T) {
	requirePython(t, "grpc", "google.protobuf", "ensurepip", "wheel")
	readme, err := os.ReadFile("../../python/README.md")
	require.NoError(t, err)
	install := markedCodeBlock(t, string(readme), "<!-- python-install:")
	writer := markedCodeBlock(t, string(readme), "<!-- python-writer:")

	root := t.TempDir()
	require.NoError(t, os.CopyFS(filepath.Join(root, "python"), os.DirFS("../../python")))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "sh", "-e", "-c", install)
	cmd.Dir, cmd.Env = root, cleanEnv()
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "python/README.md's install block failed:\n%s\n%s", install, out)

	venvPython := filepath.Join(root, ".venv", "bin", "python")
	elsewhere := t.TempDir()
	cmd = exec.CommandContext(ctx, venvPython, "-c", "import fencer; print(fencer.__file__)")
	cmd.Dir, cmd.Env = elsewhere, cleanEnv()
	out, err = cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.True(t, strings.HasPrefix(string(out), filepath.Join(root, ".venv")+"/"), "fencer is not imported from the venv: %s", out)

	s := startServeProc(t)
	cmd = exec.CommandContext(ctx, venvPython, "-c", writer)
	cmd.Dir, cmd.Env = elsewhere, cleanEnv("FENCER_SERVER="+s.addr)
	out, err = cmd.CombinedOutput()
	require.NoError(t, err, "python/README.md's writer failed:\n%s", out)
	require.Equal(t, "b'100'\n", string(out))
}

// markedCodeBlock returns the body of the fenced code block that follows the line
// of doc beginning with marker.
func markedCodeBlock(t *testing.T, doc, marker string) string {
	t.Helper()
	lines := strings.Split(doc, "\n")
	for i, line := range lines {
		if !strings.HasPrefix(line, marker) {
			continue
		}
		require.Less(t, i+1, len(lines), "no code block after %s", marker)
		require.True(t, strings.HasPrefix(lines[i+1], "```"), "the line after %s opens no code block: %q", marker, lines[i+1])
		for j := i + 2; j < len(lines); j++ {
			if lines[j] == "```" {
				return strings.Join(lines[i+2:j], "\n") + "\n"
			}
		}
		t.Fatalf("the code block after %s is not closed", marker)
	}
	t.Fatalf("no line begins with %s", marker)
	return ""
}
