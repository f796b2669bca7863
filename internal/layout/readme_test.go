package layout_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestReadmeLayout checks the README's Layout tree against the checkout:
// every directory it names exists, and every Go package of every module is
// in a directory it names or under one.
func TestReadmeLayout(t *testing.T) {
	dir := repoRoot(t)
	readme, err := os.ReadFile(filepath.Join(dir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(readme), "\n## Layout\n")
	if !ok {
		t.Fatal("README.md has no Layout section")
	}
	_, block, _ := strings.Cut(section, "```\n")
	block, _, _ = strings.Cut(block, "```")
	named := map[string]bool{}
	var parents []string // the directory at each indentation level
	for _, line := range strings.Split(strings.TrimSpace(block), "\n") {
		name, _, _ := strings.Cut(strings.TrimLeft(line, " "), " ")
		level := (len(line) - len(strings.TrimLeft(line, " "))) / 2
		if !strings.HasSuffix(name, "/") || level > len(parents) {
			t.Fatalf("README Layout line %q: want a directory ending in / under its parent's indentation", line)
		}
		path := strings.TrimSuffix(name, "/")
		if level > 0 {
			path = filepath.Join(parents[level-1], path)
		}
		parents = append(parents[:level], path)
		if fi, err := os.Stat(filepath.Join(dir, path)); err != nil || !fi.IsDir() {
			t.Errorf("README Layout names %s/, which is not a directory", path)
		}
		named[path] = true
	}
	var out []string
	for _, m := range append([]string{"."}, modules...) {
		out = append(out, strings.Fields(string(run(t, filepath.Join(dir, m), nil, "list", "-f", "{{.Dir}}", "./...")))...)
	}
	for _, pkgDir := range out {
		rel, err := filepath.Rel(dir, pkgDir)
		if err != nil {
			t.Fatal(err)
		}
		covered := false
		for p := rel; p != "." && !covered; p = filepath.Dir(p) {
			covered = named[p]
		}
		if !covered {
			t.Errorf("package directory %s is not in the README's Layout tree", rel)
		}
	}
}
