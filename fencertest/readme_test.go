package fencertest_test

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fencer-dev/fencer/fencertest"
	"github.com/fencer-dev/fencer/token"
)

// TestReconcilerStopsWhenSuperseded is the README's ten-line test: the
// reconciler of Example_supersededController is superseded, its next write
// is refused by etcd and it stops.
func TestReconcilerStopsWhenSuperseded(t *testing.T) {
	st := fencertest.Store(t) // a fresh embedded etcd
	lease, _ := fencertest.Session(t, st).Acquire(t.Context(), "orders")
	r := &reconciler{st: st, lease: lease} // the reconciler of Example_supersededController
	fencertest.Supersede(t, st, lease)     // another holder acquires "orders", now: no TTL wait
	err := r.reconcile(t.Context(), "999")
	require.ErrorIs(t, err, token.ErrStale) // refused by etcd itself
	require.True(t, r.stopped)
}

// TestReadmeSnippet checks that the README and the package doc show
// TestReconcilerStopsWhenSuperseded exactly as it is in this file, where
// it compiles and runs.
func TestReadmeSnippet(t *testing.T) {
	src, err := os.ReadFile("readme_test.go")
	require.NoError(t, err)
	start := strings.Index(string(src), "func TestReconcilerStopsWhenSuperseded")
	require.GreaterOrEqual(t, start, 0)
	snippet := string(src)[start:]
	snippet = snippet[:strings.Index(snippet, "\n}\n")+3]

	readme, err := os.ReadFile("../README.md")
	require.NoError(t, err)
	require.Contains(t, string(readme), "```go\n"+snippet+"```", "README.md must show the snippet as it compiles here")

	doc, err := os.ReadFile("doc.go")
	require.NoError(t, err)
	var inDoc strings.Builder
	for _, line := range strings.SplitAfter(strings.TrimSuffix(snippet, "\n"), "\n") {
		inDoc.WriteString("//\t" + line)
	}
	require.Contains(t, string(doc), inDoc.String()+"\n", "doc.go must show the snippet as it compiles here")
}
