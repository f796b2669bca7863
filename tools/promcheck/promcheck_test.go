package promcheck

import (
	"bytes"
	"encoding/json"
	"go/ast"
	"go/constant"
	"go/parser"
	"go/token"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	promql "github.com/prometheus/prometheus/promql/parser"
)

// root is fencer's repository root, from this package's directory.
const root = "../.."

// metricLibraries are the modules whose metrics fencer registers as they
// come: go-grpc-middleware's Prometheus provider (grpc_server_*).
var metricLibraries = []string{"github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"}

// registered returns the names of every Prometheus metric that fencer's
// non-test Go code, or that of metricLibraries at the versions fencer's
// go.mod selects, declares in a prometheus.*Opts literal, with the series
// suffixes of histograms and summaries. A Name given by a constant is
// resolved within its package.
func registered(t *testing.T) map[string]bool {
	t.Helper()
	type pkgFiles struct{ files []*ast.File }
	pkgs := map[string]*pkgFiles{}
	fset := token.NewFileSet()
	dirs := []string{root}
	for _, m := range metricLibraries {
		cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", m)
		cmd.Dir = root
		out, err := cmd.Output()
		if err != nil || len(bytes.TrimSpace(out)) == 0 {
			t.Fatalf("go list -m %s in fencer's module: %v", m, err)
		}
		dirs = append(dirs, string(bytes.TrimSpace(out)))
	}
	for _, dir := range dirs {
		walkGo(t, dir, func(path string, f *ast.File) {
			d := filepath.Dir(path)
			if pkgs[d] == nil {
				pkgs[d] = &pkgFiles{}
			}
			pkgs[d].files = append(pkgs[d].files, f)
		}, fset)
	}

	names := map[string]bool{}
	for _, p := range pkgs {
		consts := map[string]string{}
		for _, f := range p.files {
			for _, decl := range f.Decls {
				gd, ok := decl.(*ast.GenDecl)
				if !ok || gd.Tok != token.CONST {
					continue
				}
				for _, spec := range gd.Specs {
					vs := spec.(*ast.ValueSpec)
					for i, n := range vs.Names {
						if i < len(vs.Values) {
							if s, ok := stringLit(vs.Values[i]); ok {
								consts[n.Name] = s
							}
						}
					}
				}
			}
		}
		for _, f := range p.files {
			ast.Inspect(f, func(n ast.Node) bool {
				cl, ok := n.(*ast.CompositeLit)
				if !ok {
					return true
				}
				sel, ok := cl.Type.(*ast.SelectorExpr)
				if !ok || !strings.HasSuffix(sel.Sel.Name, "Opts") {
					return true
				}
				if pkg, ok := sel.X.(*ast.Ident); !ok || pkg.Name != "prometheus" {
					return true
				}
				var parts []string
				for _, field := range []string{"Namespace", "Subsystem", "Name"} {
					v := fieldValue(cl, field)
					if v == nil {
						continue
					}
					s, ok := stringLit(v)
					if !ok {
						id, isIdent := v.(*ast.Ident)
						if !isIdent {
							t.Errorf("%s: %s: the %s is not a string or a constant", fset.Position(v.Pos()), sel.Sel.Name, field)
							return true
						}
						if s, ok = consts[id.Name]; !ok {
							t.Errorf("%s: %s: constant %s not found in its package", fset.Position(v.Pos()), sel.Sel.Name, id.Name)
							return true
						}
					}
					if s != "" {
						parts = append(parts, s)
					}
				}
				name := strings.Join(parts, "_")
				names[name] = true
				switch sel.Sel.Name {
				case "HistogramOpts":
					names[name+"_bucket"], names[name+"_sum"], names[name+"_count"] = true, true, true
				case "SummaryOpts":
					names[name+"_sum"], names[name+"_count"] = true, true
				}
				return true
			})
		}
	}
	return names
}

// walkGo parses every non-test Go file under dir, but for hidden, tools
// and testdata directories, and hands each to add.
func walkGo(t *testing.T, dir string, add func(path string, f *ast.File), fset *token.FileSet) {
	t.Helper()
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != dir && (strings.HasPrefix(d.Name(), ".") || d.Name() == "tools" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		add(path, f)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func fieldValue(cl *ast.CompositeLit, field string) ast.Expr {
	for _, e := range cl.Elts {
		if kv, ok := e.(*ast.KeyValueExpr); ok {
			if k, ok := kv.Key.(*ast.Ident); ok && k.Name == field {
				return kv.Value
			}
		}
	}
	return nil
}

func stringLit(e ast.Expr) (string, bool) {
	bl, ok := e.(*ast.BasicLit)
	if !ok || bl.Kind != token.STRING {
		return "", false
	}
	return constant.StringVal(constant.MakeFromLiteral(bl.Value, bl.Kind, 0)), true
}

// metricNames returns the metric names that expr selects. A selector
// without a metric name is an error: it could match anything.
func metricNames(t *testing.T, where, expr string) []string {
	t.Helper()
	e, err := promql.NewParser(promql.Options{}).ParseExpr(expr)
	if err != nil {
		t.Errorf("%s: %v", where, err)
		return nil
	}
	var names []string
	promql.Inspect(e, func(n promql.Node, _ []promql.Node) error {
		if vs, ok := n.(*promql.VectorSelector); ok {
			if vs.Name == "" {
				t.Errorf("%s: a selector without a metric name: %s", where, vs)
			}
			names = append(names, vs.Name)
		}
		return nil
	})
	if len(names) == 0 {
		t.Errorf("%s: selects no metric", where)
	}
	return names
}

// checkNames fails t for each name that fencer does not register.
func checkNames(t *testing.T, reg map[string]bool, where string, names []string) {
	t.Helper()
	for _, n := range names {
		if !reg[n] {
			t.Errorf("%s: metric %s is not registered by fencer", where, n)
		}
	}
}

func TestRegisteredFindsFencersMetrics(t *testing.T) {
	reg := registered(t)
	for _, n := range []string{"fencer_server_rejected_writes_total", "grpc_server_handling_seconds_bucket", "grpc_server_handled_total", "fencer_self_fence_total", "fencer_lease_renewal_failures_total"} {
		if !reg[n] {
			t.Errorf("%s not found among %d registered names", n, len(reg))
		}
	}
}

// TestAlertRules parses alerts.yaml with Prometheus's rule file parser
// (which parses each expression and template), checks that every metric
// an expression names is registered, and that each alert links to its
// section of docs/operations.md, which exists.
func TestAlertRules(t *testing.T) {
	path := filepath.Join(root, "deploy/monitoring/alerts.yaml")
	groups, errs := rulefmt.ParseFile(path, false, model.UTF8Validation, promql.NewParser(promql.Options{}), slog.New(slog.DiscardHandler))
	for _, err := range errs {
		t.Error(err)
	}
	if groups == nil {
		t.FailNow()
	}
	doc, err := os.ReadFile(filepath.Join(root, "docs/operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	reg := registered(t)
	alerts := 0
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			alerts++
			checkNames(t, reg, r.Alert, metricNames(t, r.Alert, r.Expr))
			anchor := "docs/operations.md#" + strings.ToLower(r.Alert)
			if !strings.Contains(r.Annotations["description"], anchor) {
				t.Errorf("%s: the description does not link %s", r.Alert, anchor)
			}
			if !regexp.MustCompile(`(?m)^#+ ` + regexp.QuoteMeta(r.Alert) + `\s*$`).Match(doc) {
				t.Errorf("%s: docs/operations.md has no heading for it", r.Alert)
			}
		}
	}
	if alerts < 4 {
		t.Errorf("%d alerts; want at least stale writes, self-fence, renewal failures and etcd unreachable", alerts)
	}
}

// TestDashboard parses dashboard.json and every PromQL expression of its
// panels, and checks that each names only registered metrics.
func TestDashboard(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, "deploy/monitoring/dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Title  string `json:"title"`
		UID    string `json:"uid"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	dec := json.NewDecoder(strings.NewReader(string(b)))
	if err := dec.Decode(&d); err != nil {
		t.Fatal(err)
	}
	if d.Title == "" || d.UID == "" || len(d.Panels) == 0 {
		t.Fatalf("not a dashboard: title %q, uid %q, %d panels", d.Title, d.UID, len(d.Panels))
	}
	reg := registered(t)
	for _, p := range d.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			where := "panel " + p.Title
			checkNames(t, reg, where, metricNames(t, where, tg.Expr))
		}
	}
}
