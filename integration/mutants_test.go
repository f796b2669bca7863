package integration_test

import (
	"context"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fencer-dev/fencer/internal/mutant"
	"github.com/fencer-dev/fencer/kubeadapter/kubefencertest"
)

// mutantCase is one mutant and the tests that must catch it: tests of one
// package, run from its fencer_mutants test binary.
type mutantCase struct {
	mutant mutant.Name
	pkg    string   // the package's directory in the repository
	tests  []string // top-level tests of pkg that catch the mutant; one failing is enough
	kube   bool     // the tests need the kube-apiserver
	chaos  bool     // the etcd chaos test: minutes, so only with -mutants.chaos
}

// mutantsChaos adds the etcd chaos test's rows to the mutant table. make
// chaos sets it; make test leaves them to the faster tests of each row.
var mutantsChaos = flag.Bool("mutants.chaos", false, "also run the etcd chaos test under the mutants it must catch (minutes; make chaos sets it)")

// mutantCases are the mutants of internal/mutant/names.go, each with the
// fastest of fencer's tests that catch it. A mutant may have more than one
// case, one per package whose tests catch it; each case is a row of the
// table.
var mutantCases = []mutantCase{
	{mutant: mutant.EpochCompareDropped, pkg: "etcdstore", tests: []string{"TestForgedTokensAreRefusedByEveryGuardedCall", "TestTakeOverIsExplicitAndFenced"}},
	{mutant: mutant.OwnerCompareDropped, pkg: "etcdstore", tests: []string{"TestForeignLeaseCannotWriteAnotherLeasesKeys", "TestTxnChecksAndClaimsEveryDataKeyItMayWrite", "TestBatchedWritesOfMixedOwnersActAsAlone"}},
	{mutant: mutant.BatchSharedGuard, pkg: "etcdstore", tests: []string{"TestBatchedWritesShareATxnAndKeepTheirOwnGuards", "TestBatchedWritesOfMixedOwnersActAsAlone"}},
	{mutant: mutant.ReleaseAnyHolder, pkg: "etcdstore", tests: []string{"TestRetriedReleaseKeepsNewerHolder"}},
	{mutant: mutant.KubeTrustCallerMarks, pkg: "kubeadapter/fenced", tests: []string{"TestRedTeamCarelessCaller", "TestRedTeamSharedCacheMemory"}, kube: true},
	{mutant: mutant.KubeTrustCallerVersion, pkg: "kubeadapter/fenced", tests: []string{"TestRedTeamWriteBetweenCheckAndWrite", "TestSupersededHolderAttacks"}, kube: true},
	{mutant: mutant.PolicyNoMarkRule, pkg: "kubeadapter/internal/kubetest", tests: []string{"TestAdmissionPolicy", "TestPolicyDifferential"}, kube: true},
	{mutant: mutant.SharderTrustsRenewTime, pkg: "kubeadapter/shard", tests: []string{"TestFutureRenewTimeIgnored"}},
	// The etcd chaos test's forged and foreign writes at each takeover
	// make these two guards' absence a linearizability violation. It does
	// not catch batch-shared-guard (each holder process batches only its
	// own token's writes) nor release-any-holder (a wrong release costs
	// exclusivity, not fencing: the register stays linearizable).
	{mutant: mutant.EpochCompareDropped, pkg: "integration", tests: []string{"TestChaosEtcdFencedRegister"}, chaos: true},
	{mutant: mutant.OwnerCompareDropped, pkg: "integration", tests: []string{"TestChaosEtcdFencedRegister"}, chaos: true},
}

// Bounds of the mutant table's commands.
const (
	mutantBuildTimeout = 15 * time.Minute // a cold build of the test binaries
	mutantRunTimeout   = 3 * time.Minute  // one run of a test binary
)

// TestMutantsAreCaught builds the test binaries of the packages in
// mutantCases with the fencer_mutants tag, runs each package's listed
// tests once with no mutant (they must pass, so that a failure below is
// the mutant's doing), then runs each mutant's tests with FENCER_MUTANT
// naming it, and requires at least one of them to fail. A mutant that
// survives fails the test, naming it. It logs the table of mutant, the
// tests that caught it, the first failure's message and the seconds the
// run took. Mutants whose tests need the kube-apiserver are skipped or
// failed, when there is none, as the kube tests are (kubefencertest.RequireEnv).
func TestMutantsAreCaught(t *testing.T) {
	if testing.Short() {
		t.Skip("builds three test binaries")
	}
	repo, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	declared := declaredMutants(t, repo)
	var listed []string
	for _, c := range mutantCases {
		listed = append(listed, string(c.mutant))
	}
	// A mutant may have several cases (tests of several packages).
	if slices.Sort(declared); !slices.Equal(declared, slices.Compact(slices.Sorted(slices.Values(listed)))) {
		t.Fatalf("internal/mutant/names.go declares %v, the table lists %v: give every mutant the tests that catch it", declared, listed)
	}

	// The kube cases skip, or fail, without a kube-apiserver
	// (kubefencertest.BinaryForTest); the others run regardless.
	_, err = kubefencertest.BinaryPath()
	kubeOK := err == nil
	bins := t.TempDir()
	built := map[string]string{} // package → test binary
	passed := map[string]bool{}  // package → its listed tests passed with no mutant
	binary := func(t *testing.T, pkg string) string {
		t.Helper()
		if bin, ok := built[pkg]; ok {
			return bin
		}
		out := filepath.Join(bins, strings.ReplaceAll(pkg, "/", "-")+".test")
		ctx, cancel := context.WithTimeout(t.Context(), mutantBuildTimeout)
		defer cancel()
		start := time.Now()
		dir, rel := moduleOf(repo, pkg)
		args := slices.Concat([]string{"test", "-c", "-tags", mutant.Tag}, mutantBuildFlags, []string{"-o", out, "./" + rel})
		cmd := exec.CommandContext(ctx, goForMutants(), args...)
		cmd.Dir = dir
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, b)
		}
		t.Logf("built ./%s with %s in %.1fs", pkg, strings.Join(args[2:len(args)-3], " "), time.Since(start).Seconds())
		built[pkg] = out
		return out
	}

	type row struct {
		mutant, caught, how string
		seconds             float64
	}
	var rows []row
	start := time.Now()
	for _, c := range mutantCases {
		t.Run(string(c.mutant), func(t *testing.T) {
			if c.kube {
				kubefencertest.BinaryForTest(t)
			}
			if c.chaos && !*mutantsChaos {
				t.Skip("the etcd chaos test runs under mutants with -mutants.chaos (make chaos)")
			}
			bin := binary(t, c.pkg)
			if !passed[c.pkg] {
				var all []string
				for _, o := range mutantCases {
					if o.pkg == c.pkg && (!o.kube || kubeOK) && (!o.chaos || *mutantsChaos) {
						all = append(all, o.tests...)
					}
				}
				res := runMutantTests(t, bin, filepath.Join(repo, c.pkg), "", all)
				if res.err != nil || len(res.failed) > 0 {
					t.Fatalf("./%s with no mutant: %v, failed %v (a mutant's failure below would prove nothing):\n%s", c.pkg, res.err, res.failed, res.tail())
				}
				if missing := slices.DeleteFunc(slices.Clone(all), func(n string) bool { return slices.Contains(res.passed, n) }); len(missing) > 0 {
					t.Fatalf("./%s with no mutant: %v did not pass (skipped, or not found):\n%s", c.pkg, missing, res.tail())
				}
				passed[c.pkg] = true
			}
			res := runMutantTests(t, bin, filepath.Join(repo, c.pkg), c.mutant, c.tests)
			r := row{mutant: string(c.mutant), seconds: res.seconds}
			var caught []string
			for _, f := range res.failed {
				if slices.Contains(c.tests, f) {
					caught = append(caught, f)
				}
			}
			if len(caught) == 0 {
				r.caught, r.how = "SURVIVED", fmt.Sprint(res.err)
				t.Errorf("mutant %s survived %v in ./%s: a test is missing\n%s", c.mutant, c.tests, c.pkg, res.tail())
			} else {
				r.caught, r.how = strings.Join(caught, ", "), res.how
			}
			rows = append(rows, r)
		})
	}

	var b strings.Builder
	fmt.Fprintf(&b, "\n| mutant | test that caught it | how it failed | seconds |\n|---|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %s | %s | %.1f |\n", r.mutant, r.caught, strings.ReplaceAll(r.how, "|", `\|`), r.seconds)
	}
	fmt.Fprintf(&b, "\n%d mutants, all caught unless marked SURVIVED; %.0fs in all, builds included", len(rows), time.Since(start).Seconds())
	if skipped := len(mutantCases) - len(rows); skipped > 0 {
		fmt.Fprintf(&b, "; %d not run (see the skipped subtests)", skipped)
	}
	t.Log(b.String())
}

// mutantRun is the outcome of one run of a test binary.
type mutantRun struct {
	out            []byte
	err            error    // the binary's exit status, nil when it passed
	passed, failed []string // top-level tests, by their --- PASS and --- FAIL lines
	how            string   // the first failure's message, on one line
	seconds        float64
}

// tail returns the end of the run's output, for a failure message.
func (r mutantRun) tail() string {
	const n = 4000
	if len(r.out) > n {
		return "…" + string(r.out[len(r.out)-n:])
	}
	return string(r.out)
}

var (
	testResultLine = regexp.MustCompile(`(?m)^--- (PASS|FAIL): (\S+)`)
	testLogLine    = regexp.MustCompile(`^\s+\S+_test\.go:\d+: (.+)$`)
)

// runMutantTests runs tests from the test binary bin in dir, as go test runs a
// package's tests, with FENCER_MUTANT set to m ("" for none), for at most
// mutantRunTimeout.
func runMutantTests(t *testing.T, bin, dir string, m mutant.Name, tests []string) mutantRun {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), mutantRunTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "-test.run", "^("+strings.Join(tests, "|")+")$", "-test.v", "-test.count=1", "-test.timeout", (mutantRunTimeout - 10*time.Second).String())
	cmd.Dir = dir
	cmd.Env = append(slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, mutant.Env+"=") }), mutant.Env+"="+string(m))
	cmd.WaitDelay = 10 * time.Second
	start := time.Now()
	out, err := cmd.CombinedOutput()
	r := mutantRun{out: out, err: err, seconds: time.Since(start).Seconds()}
	for _, m := range testResultLine.FindAllSubmatch(out, -1) {
		if string(m[1]) == "PASS" {
			r.passed = append(r.passed, string(m[2]))
		} else {
			r.failed = append(r.failed, string(m[2]))
		}
	}
	r.how = firstFailedAssertion(out)
	return r
}

// firstFailedAssertion returns the message of the first failed assertion in a
// test binary's output, on one line: a testify failure's Error (with the
// lines that continue it, such as expected and actual) and Messages; else
// the first line a test logged; else the first panic.
func firstFailedAssertion(out []byte) string {
	lines := strings.Split(string(out), "\n")
	field := func(l string) (name, value string) {
		for _, f := range []string{"Error Trace", "Error", "Test", "Messages", "Diff"} {
			if v, ok := strings.CutPrefix(strings.TrimSpace(l), f+":"); ok {
				return f, strings.TrimSpace(v)
			}
		}
		return "", strings.TrimSpace(l)
	}
	for i, l := range lines {
		if name, _ := field(l); name != "Error Trace" {
			continue
		}
		msg := map[string][]string{}
		in := ""
		for _, l := range lines[i+1:] {
			name, v := field(l)
			if name == "Error Trace" || strings.HasPrefix(l, "---") || strings.HasPrefix(l, "===") {
				break
			}
			if name != "" {
				in = name
			}
			if v != "" {
				msg[in] = append(msg[in], v)
			}
		}
		how := strings.Join(msg["Error"], " ")
		if m := msg["Messages"]; len(m) > 0 {
			how += " (" + strings.Join(m, " ") + ")"
		}
		return tableCell(how)
	}
	for _, l := range lines {
		if m := testLogLine.FindStringSubmatch(l); m != nil {
			return tableCell(m[1])
		}
	}
	for _, l := range lines {
		if strings.HasPrefix(l, "panic:") {
			return tableCell(l)
		}
	}
	return ""
}

// tableCell shortens s to one table cell.
func tableCell(s string) string {
	const n = 160
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// declaredMutants returns the values of the string constants of
// internal/mutant/names.go.
// moduleOf returns the directory of the module that holds pkg (a path
// relative to the repository root) and pkg's path within it: the
// Kubernetes packages are a module of their own.
func moduleOf(repo, pkg string) (dir, rel string) {
	if rest, ok := strings.CutPrefix(pkg, "kubeadapter/"); ok {
		return filepath.Join(repo, "kubeadapter"), rest
	}
	return repo, pkg
}

func declaredMutants(t *testing.T, repo string) []string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), filepath.Join(repo, "internal", "mutant", "names.go"), nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	ast.Inspect(f, func(n ast.Node) bool {
		if lit, ok := n.(*ast.BasicLit); ok && lit.Kind == token.STRING {
			name, err := strconv.Unquote(lit.Value)
			if err != nil {
				t.Fatal(err)
			}
			names = append(names, name)
		}
		return true
	})
	return names
}

// goForMutants returns the go command to build with: the one on PATH, else
// the one of the toolchain that built this test.
func goForMutants() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return filepath.Join(runtime.GOROOT(), "bin", "go")
}
