package server

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestServiceChecksEachInputOnce holds the service to one check of each
// input: it checks a request with etcdstore's Check* functions before it
// authorizes the token (validate.go), so its writes go through the store
// calls that take that checked input (PutChecked and the like), never
// through the ones that check their arguments again. A call of one of
// those from the service's code fails here.
func TestServiceChecksEachInputOnce(t *testing.T) {
	rechecking := map[string]string{
		"Put": "PutChecked", "Delete": "DeleteChecked", "Txn": "TxnChecked",
		"Advance": "AdvanceChecked", "Release": "ReleaseChecked", "ReleaseOn": "ReleaseChecked",
	}
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	fset := token.NewFileSet()
	var found []string
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		require.NoError(t, err)
		// s.store.Put(...), or s.store.Put taken as a value
		ast.Inspect(f, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			if recv, ok := sel.X.(*ast.SelectorExpr); ok && recv.Sel.Name == "store" {
				if use, bad := rechecking[sel.Sel.Name]; bad {
					found = append(found, fset.Position(sel.Pos()).String()+": store."+sel.Sel.Name+" checks its input again; use store."+use)
				}
			}
			return true
		})
	}
	require.Empty(t, found)
}
