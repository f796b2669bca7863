package mcr_test

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestDocsQuoteExample checks that docs/multicluster.md quotes
// runFencedManager, which TestExampleFencedManager runs, as it is.
func TestDocsQuoteExample(t *testing.T) {
	src, err := os.ReadFile("example_test.go")
	require.NoError(t, err)
	doc, err := os.ReadFile("../docs/multicluster.md")
	require.NoError(t, err)
	s := string(src)
	start := strings.Index(s, "func runFencedManager(")
	require.NotEqual(t, -1, start)
	end := strings.Index(s[start:], "\n}\n")
	require.NotEqual(t, -1, end)
	require.Contains(t, string(doc), s[start:start+end+3], "docs/multicluster.md does not quote runFencedManager as it is")
}
