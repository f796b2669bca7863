package layout_test

import (
	"bytes"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// mutantNames returns the names of the mutants declared in
// internal/mutant/names.go: the values of its string constants.
func mutantNames(t *testing.T, repo string) []string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), filepath.Join(repo, "internal", "mutant", "names.go"), nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, decl := range f.Decls {
		gen, ok := decl.(*ast.GenDecl)
		if !ok || gen.Tok != token.CONST {
			continue
		}
		for _, spec := range gen.Specs {
			for _, v := range spec.(*ast.ValueSpec).Values {
				if lit, ok := v.(*ast.BasicLit); ok && lit.Kind == token.STRING {
					name, err := strconv.Unquote(lit.Value)
					if err != nil {
						t.Fatal(err)
					}
					names = append(names, name)
				}
			}
		}
	}
	if len(names) == 0 {
		t.Fatal("internal/mutant/names.go declares no mutant")
	}
	return names
}

// TestReleaseBuildHasNoMutants builds ./cmd/fencer as a release is built,
// without the fencer_mutants tag, and checks that the binary holds none
// of the mutant names of internal/mutant/names.go and that its build
// information has no fencer_mutants tag: the mutated branches are dead
// code, not linked. So that the check bites, it builds the binary again
// with the tag and requires the tag in the build information and the
// names of the etcd store's mutants, whose switches the binary links, in
// the binary.
func TestReleaseBuildHasNoMutants(t *testing.T) {
	repo := repoRoot(t)
	names := mutantNames(t, repo)
	dir := t.TempDir()
	build := func(bin string, args ...string) ([]byte, string) {
		t.Helper()
		out := filepath.Join(dir, bin)
		run(t, repo, nil, append(append([]string{"build"}, args...), "-o", out, "./cmd/fencer")...)
		data, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		info := string(run(t, repo, nil, "version", "-m", out))
		return data, info
	}

	release, info := build("fencer")
	for _, name := range names {
		if bytes.Contains(release, []byte(name)) {
			t.Errorf("the release build of cmd/fencer contains mutant %q", name)
		}
	}
	if strings.Contains(info, "fencer_mutants") {
		t.Errorf("the release build's information names the fencer_mutants tag:\n%s", info)
	}

	tagged, info := build("fencer-mutants", "-tags", "fencer_mutants")
	if !strings.Contains(info, "-tags=fencer_mutants") {
		t.Errorf("the tagged build's information lacks the fencer_mutants tag:\n%s", info)
	}
	for _, name := range []string{"epoch-compare-dropped", "owner-compare-dropped", "batch-shared-guard", "release-any-holder"} {
		if !bytes.Contains(tagged, []byte(name)) {
			t.Errorf("the fencer_mutants build of cmd/fencer lacks mutant %q: the check above would not see one", name)
		}
	}
}
