package layout_test

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

const root = "github.com/fencer-dev/fencer"

// lightModules are the modules a gRPC user requires, by directory.
var lightModules = []string{"token", "proto", "client"}

// kubeModule is the module a Kubernetes user requires, by directory.
const kubeModule = "kubeadapter"

// modules are all of fencer's modules but the root and tools/, by
// directory: the light modules, the three small internal ones that the root
// and the Kubernetes module share, the Kubernetes module, the Sharder's
// end-to-end tests (a test-only module) and the multicluster-runtime
// Coordinator.
var modules = append(slices.Clone(lightModules), "internal/mutant", "internal/freeport", "internal/rendezvous", kubeModule, "kubeadapter/shard/e2e", "mcr")

// kube is the Kubernetes stack that only kubeadapter and its test helpers
// may pull in: not the binary, which it would double in size. k8s.io/utils
// (a clock, no client) is not in it.
var kube = []string{"k8s.io/api", "k8s.io/apimachinery", "k8s.io/client-go", "sigs.k8s.io/controller-runtime"}

// rule is what the packages matching pkg (a path, or a path ending in
// "/..." for the tree under it) must not import, directly or not.
type rule struct {
	pkg     string
	owns    string   // what the package owns, for people
	stdOnly bool     // only the standard library
	forbid  []string // import paths, each also forbidding the tree under it
	// only, when not nil, lists the fencer packages (paths, or trees
	// ending in "/...") that are all pkg may import of fencer's: any
	// other package of the root module or the light modules is refused.
	only []string
}

func rules() []rule {
	fencer := func(names ...string) []string {
		out := make([]string, len(names))
		for i, n := range names {
			out[i] = root + "/" + n
		}
		return out
	}
	cat := func(lists ...[]string) []string {
		var out []string
		for _, l := range lists {
			out = append(out, l...)
		}
		return out
	}
	noKubeAtAll := []string{"k8s.io", "sigs.k8s.io"}
	harnesses := fencer("internal/testkit", "fencertest", "kubeadapter/kubefencertest", "kubeadapter/internal/kubetest", "kubeadapter/internal/leasefake")
	rules := []rule{
		{pkg: root + "/token", owns: "Token, its errors, Holder and the shared write options", stdOnly: true},
		{pkg: root + "/internal/mutant", owns: "the switch of the deliberately wrong guards (build tag fencer_mutants); a module of its own, shared by the root and the Kubernetes module", stdOnly: true},
		{pkg: root + "/internal/freeport", owns: "free loopback ports for the servers and processes tests start; a module of its own, shared by the root and the Kubernetes module", stdOnly: true},
		{pkg: root + "/proto/...", owns: "the gRPC API and its generated code, the ErrorReason enum", forbid: cat([]string{"go.etcd.io"}, noKubeAtAll, fencer("token", "client", "etcdstore", "server", "kubeadapter"))},
		{pkg: root + "/client/...", owns: "the Go client of the service, and its test hooks (clienttest)", forbid: cat([]string{"go.etcd.io"}, noKubeAtAll, fencer("etcdstore", "server", "kubeadapter", "embedetcd", "fencertest", "internal"))},
		{pkg: root + "/etcdstore", owns: "the fencing-token store on etcd: sessions, leases, guarded writes, owner records", forbid: cat([]string{"go.etcd.io/etcd/server"}, kube, fencer("client", "server", "kubeadapter", "embedetcd", "proto"))},
		{pkg: root + "/server", owns: "the gRPC service on etcdstore: validation, authorization, sessions, lease watches", forbid: cat([]string{"go.etcd.io/etcd/server"}, kube, fencer("client", "kubeadapter", "embedetcd"))},
		{pkg: root + "/embedetcd", owns: "the embedded etcd member that fencer serve runs by default", forbid: cat(kube, fencer("etcdstore", "server", "client", "kubeadapter"))},
		{pkg: root + "/kubeadapter/...", owns: "the Kubernetes module: election, the watcher, fenced writes, sharding, their manifests and test kit; it requires token and the two small internal modules, never the root module", forbid: []string{"go.etcd.io", "github.com/anishathalye/porcupine", "sigs.k8s.io/kustomize"}, only: fencer("kubeadapter/...", "token", "internal/mutant", "internal/freeport", "internal/rendezvous")},
		{pkg: root + "/kubeadapter", owns: "Kubernetes Lease election (Elector, Held) and the Lease watcher, on client-go alone", forbid: cat([]string{"sigs.k8s.io/controller-runtime"}, fencer("kubeadapter/shard", "kubeadapter/fenced", "kubeadapter/leader", "kubeadapter/kubefencertest", "kubeadapter/internal/leasefake", "kubeadapter/internal/kubetest"))},
		{pkg: root + "/mcr", owns: "the multicluster-runtime Coordinator on the Sharder, and its gates; a module of its own, on the Kubernetes module", forbid: []string{"go.etcd.io", "github.com/anishathalye/porcupine", "sigs.k8s.io/kustomize"}, only: fencer("kubeadapter/...", "token", "internal/mutant", "internal/freeport", "internal/rendezvous")},
		{pkg: root + "/kubeadapter/leader", owns: "the controller-runtime Runnable that runs work under each acquisition of an Elector", only: fencer("kubeadapter", "kubeadapter/internal/...", "token")},
		{pkg: root + "/kubeadapter/internal/watcherr", owns: "a watch that reports its Error events and ends at Stop", forbid: []string{"k8s.io/client-go", "sigs.k8s.io/controller-runtime"}, only: []string{}},
		{pkg: root + "/kubeadapter/deploy", owns: "the Kubernetes library's manifests (admission policies, Role), embedded", stdOnly: true},
		{pkg: root + "/internal/rendezvous", owns: "the rendezvous hash that assigns shards to members; a module of its own, shared by the root and the Kubernetes module", stdOnly: true},
		{pkg: root + "/kubeadapter/kubefencertest", owns: "the public Kubernetes test kit: an API server of etcd and kube-apiserver processes, the policies and Role installed, Supersede", forbid: fencer("kubeadapter/shard", "kubeadapter/internal/kubetest", "kubeadapter/internal/leasefake")},
		{pkg: root + "/kubeadapter/internal/kubetest", owns: "the harness of the Kubernetes module's own tests, on the kit's API server", forbid: fencer("kubeadapter/shard")},
		{pkg: root + "/kubeadapter/fenced", owns: "the one fenced-write engine and the fenced client (Update, Patch, Apply, status, UpdateFenced, DeleteFenced)", only: fencer("token", "internal/mutant"), forbid: []string{"go.etcd.io"}},
		{pkg: root + "/kubeadapter/shard", owns: "the Sharder, View, Gate, AcquiredSource, the shard record and its metrics, on kubeadapter's exported API", forbid: []string{"go.etcd.io"}, only: fencer("kubeadapter", "kubeadapter/internal/leaserecord", "kubeadapter/internal/watcherr", "internal/rendezvous", "token", "internal/mutant")},
		{pkg: root + "/kubeadapter/internal/leaserecord", owns: "the pure Lease-record functions kubeadapter and kubeadapter/shard share: Kubernetes API types only", forbid: []string{"go.etcd.io", "k8s.io/client-go", "sigs.k8s.io/controller-runtime"}, only: []string{}},
		{pkg: root + "/kubeadapter/internal/leasefake", owns: "the fake Lease clientset of their unit tests: a harness, with no fencer package of its own", forbid: []string{"go.etcd.io", "sigs.k8s.io/controller-runtime"}, only: []string{}},
		{pkg: root + "/fencertest", owns: "the public test kit: etcd, stores, clusters, the service, Supersede", forbid: cat(kube, fencer("kubeadapter"))},
		{pkg: root + "/ring", owns: "rings: a fixed set of shards divided among members by rendezvous hashing, each shard a fencer lease, on etcdstore's exported API", forbid: cat([]string{"go.etcd.io/etcd/server"}, kube, fencer("client", "server", "kubeadapter", "embedetcd", "proto"))},
		{pkg: root + "/cmd/...", owns: "the fencer binary, without the Kubernetes client stack: with it (through controller-runtime's certwatcher) bin/fencer was 70.8 MB and an idle fencer serve's VmRSS about 45 000 kB, without it 38.0 MB and 32 000 kB (internal/certreload)", forbid: kube},
		{pkg: root + "/internal/certreload", owns: "fencer serve's TLS certificates, kept current from their files", forbid: noKubeAtAll, only: []string{}},
		{pkg: root + "/internal/etcdcmp", owns: "the etcd compares of the hot paths, built in place, shared by etcdstore and server", forbid: cat([]string{"go.etcd.io/etcd/server"}, noKubeAtAll, fencer("etcdstore", "server", "client", "kubeadapter", "proto", "token"))},
		{pkg: root + "/internal/holderkey", owns: "the holder key's layout, shared by etcdstore and server", forbid: cat([]string{"go.etcd.io/etcd/server", "go.etcd.io/etcd/client"}, noKubeAtAll, fencer("etcdstore", "server", "client", "kubeadapter", "proto"))},
	}
	// Production code never imports a test harness: the kit (fencertest)
	// or the project's own (internal/testkit).
	for _, p := range []string{"token", "ring", "proto/...", "client/...", "etcdstore", "server", "embedetcd", "kubeadapter", "kubeadapter/fenced", "kubeadapter/shard", "kubeadapter/leader", "kubeadapter/deploy", "kubeadapter/internal/watcherr", "kubeadapter/internal/leaserecord", "internal/rendezvous", "mcr", "cmd/...", "deploy", "internal/certreload", "internal/holderkey", "internal/etcdcmp", "internal/freeport", "internal/mutant"} {
		rules = append(rules, rule{pkg: root + "/" + p, owns: "production code", forbid: harnesses})
	}
	// The project's low-level harnesses are what the kit is built on, so
	// they never import the kit back.
	for _, p := range []string{"etcdproc", "faultproxy", "history", "rpcfault", "testca"} {
		rules = append(rules, rule{pkg: root + "/internal/testkit/" + p, owns: "a harness the kit builds on", forbid: fencer("fencertest", "etcdstore", "server", "client", "kubeadapter")})
	}
	return rules
}

func (r rule) matches(path string) bool {
	if tree, ok := strings.CutSuffix(r.pkg, "/..."); ok {
		return path == tree || strings.HasPrefix(path, tree+"/")
	}
	return path == r.pkg
}

// violations returns the deps that r forbids.
func (r rule) violations(deps []string) []string {
	var bad []string
	for _, d := range deps {
		if r.stdOnly {
			if first, _, _ := strings.Cut(d, "/"); strings.Contains(first, ".") {
				bad = append(bad, d)
			}
			continue
		}
		if r.only != nil && (d == root || strings.HasPrefix(d, root+"/")) && !slices.ContainsFunc(r.only, func(p string) bool { return (rule{pkg: p}).matches(d) }) {
			bad = append(bad, d)
			continue
		}
		for _, f := range r.forbid {
			if d == f || strings.HasPrefix(d, f+"/") {
				bad = append(bad, d)
				break
			}
		}
	}
	return bad
}

// goTool returns the go command that runs this test.
func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return filepath.Join(runtime.GOROOT(), "bin", "go")
}

// repoRoot returns the directory of the root module.
func repoRoot(t *testing.T) string {
	dir, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "go.mod")); err != nil {
		t.Fatalf("no go.mod at the repository root %s: %v", dir, err)
	}
	return dir
}

// commandTimeout bounds each command a test runs.
const commandTimeout = 10 * time.Minute

// tryCommand runs name with args in dir, with extra environment and
// without a go.work, for at most commandTimeout, and returns its standard
// output and standard error.
func tryCommand(t *testing.T, dir string, env []string, name string, args ...string) (stdout, stderr []byte, err error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), commandTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(append(os.Environ(), "GOWORK=off"), env...)
	var errOut bytes.Buffer
	cmd.Stderr = &errOut
	stdout, err = cmd.Output()
	return stdout, errOut.Bytes(), err
}

// command is tryCommand that fails t with the command's standard error.
func command(t *testing.T, dir string, env []string, name string, args ...string) []byte {
	t.Helper()
	out, stderr, err := tryCommand(t, dir, env, name, args...)
	if err != nil {
		t.Fatalf("%s %s in %s: %v\n%s%s", name, strings.Join(args, " "), dir, err, out, stderr)
	}
	return out
}

// run runs the go command in dir with extra environment and returns its
// standard output, failing t with its standard error.
func run(t *testing.T, dir string, env []string, args ...string) []byte {
	t.Helper()
	return command(t, dir, env, goTool(), args...)
}

// TestImportRules checks every package of every module against its
// rule (see each package's doc.go): the packages it imports, directly or
// through others, outside tests.
func TestImportRules(t *testing.T) {
	// Each module is listed in its own directory, with its own build list.
	var out []byte
	for _, m := range append([]string{"."}, modules...) {
		out = append(out, run(t, filepath.Join(repoRoot(t), m), nil, "list", "-f", "{{.ImportPath}}\t{{join .Deps \" \"}}", "./...")...)
	}
	checked := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 1<<24)
	for sc.Scan() {
		pkg, deps, _ := strings.Cut(sc.Text(), "\t")
		for _, r := range rules() {
			if !r.matches(pkg) {
				continue
			}
			checked[r.pkg] = true
			if bad := r.violations(strings.Fields(deps)); len(bad) > 0 {
				t.Errorf("%s must not import %v (%d in all; rule %s)", pkg, bad[:min(len(bad), 5)], len(bad), r.pkg)
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	for _, r := range rules() {
		if !checked[r.pkg] {
			t.Errorf("rule %s matched no package", r.pkg)
		}
		if r.owns == "" {
			t.Errorf("rule %s does not say what the package owns", r.pkg)
		}
	}
}

// TestRuleBites checks that the rules refuse the imports they name, so
// that TestImportRules cannot pass by matching nothing.
func TestRuleBites(t *testing.T) {
	for _, tc := range []struct {
		pkg, dep string
	}{
		{root + "/token", "github.com/cenkalti/backoff/v5"},
		{root + "/client", root + "/etcdstore"},
		{root + "/client/clienttest", "go.etcd.io/etcd/client/v3"},
		{root + "/client", "k8s.io/utils/clock"},
		{root + "/etcdstore", "k8s.io/client-go/kubernetes"},
		{root + "/kubeadapter", root + "/server"},
		{root + "/kubeadapter/fenced", root + "/kubeadapter"},
		{root + "/kubeadapter/fenced", root + "/etcdstore"},
		{root + "/kubeadapter/fenced", "go.etcd.io/etcd/client/v3"},
		{root + "/kubeadapter", root + "/kubeadapter/shard"},
		{root + "/kubeadapter/shard", root + "/etcdstore"},
		{root + "/kubeadapter/shard", root + "/server"},
		{root + "/kubeadapter/shard", root + "/fencertest"},
		{root + "/kubeadapter/shard", root + "/kubeadapter/internal/kubetest"},
		{root + "/kubeadapter/shard", "go.etcd.io/etcd/client/v3"},
		{root + "/kubeadapter/shard", "github.com/anishathalye/porcupine"},
		{root + "/kubeadapter/kubefencertest", "go.etcd.io/etcd/server/v3/embed"},
		{root + "/kubeadapter/kubefencertest", root + "/fencertest"},
		{root + "/kubeadapter/kubefencertest", root + "/internal/testkit/faultproxy"},
		{root + "/kubeadapter/internal/kubetest", root + "/embedetcd"},
		{root + "/kubeadapter", root + "/kubeadapter/kubefencertest"},
		{root + "/kubeadapter", "sigs.k8s.io/controller-runtime/pkg/manager"},
		{root + "/kubeadapter/leader", root + "/kubeadapter/shard"},
		{root + "/mcr", root + "/etcdstore"},
		{root + "/mcr", "go.etcd.io/etcd/client/v3"},
		{root + "/kubeadapter/deploy", "sigs.k8s.io/kustomize/api/krusty"},
		{root + "/kubeadapter/internal/leaserecord", root + "/token"},
		{root + "/kubeadapter", root + "/kubeadapter/internal/leasefake"},
		{root + "/kubeadapter/shard", root + "/kubeadapter/internal/leasefake"},
		{root + "/kubeadapter/internal/leaserecord", "k8s.io/client-go/kubernetes"},
		{root + "/server", "go.etcd.io/etcd/server/v3/embed"},
		{root + "/etcdstore", root + "/fencertest"},
		{root + "/ring", root + "/server"},
		{root + "/ring", "go.etcd.io/etcd/server/v3/embed"},
		{root + "/cmd/fencer", root + "/internal/testkit/faultproxy"},
		{root + "/cmd/fencer", "sigs.k8s.io/controller-runtime/pkg/certwatcher"},
		{root + "/cmd/fencer", "k8s.io/apimachinery/pkg/util/wait"},
		{root + "/cmd/fencer", "k8s.io/client-go/rest"},
		{root + "/cmd/fencer", "k8s.io/api/core/v1"},
		{root + "/internal/certreload", "k8s.io/utils/clock"},
		{root + "/internal/certreload", root + "/server"},
		{root + "/internal/testkit/testca", root + "/fencertest"},
	} {
		refused := false
		for _, r := range rules() {
			if r.matches(tc.pkg) && len(r.violations([]string{tc.dep})) > 0 {
				refused = true
			}
		}
		if !refused {
			t.Errorf("no rule refuses %s importing %s", tc.pkg, tc.dep)
		}
	}
}

// consumer is a program of a gRPC user: it calls a fencer server through
// the client module and nothing else of fencer's.
const consumer = `package main

import (
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/fencer-dev/fencer/client"
	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
	"github.com/fencer-dev/fencer/token"
)

var _ token.Holder = (*client.Lease)(nil)

func main() {
	cc, err := grpc.NewClient("127.0.0.1:7890", grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		panic(err)
	}
	defer cc.Close()
	c := client.New(cc)
	fmt.Println(c != nil, fencerv1.ErrorDomain, token.ErrStale)
}
`

// TestLightModuleGraph builds the consumer above in a module of its own
// that requires only the client module (with replace directives to this
// checkout, as a user's go.mod would name released versions), and checks
// that its module graph holds no Kubernetes module, no etcd module (server
// or client) and not fencer's root module. Modules come from GOPROXY as the environment sets
// it.
func TestLightModuleGraph(t *testing.T) {
	repo := repoRoot(t)
	dir := t.TempDir()
	gomod := "module example.com/consumer\n\ngo 1.26.0\n\nrequire github.com/fencer-dev/fencer/client v0.0.0-00010101000000-000000000000\n\n"
	for _, m := range lightModules {
		gomod += "replace " + root + "/" + m + " => " + filepath.Join(repo, m) + "\n"
	}
	for name, body := range map[string]string{"go.mod": gomod, "main.go": consumer} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	env := []string{"GOFLAGS=-mod=mod"}
	run(t, dir, env, "mod", "tidy")
	run(t, dir, env, "build", "-o", filepath.Join(dir, "consumer"), ".")
	graph := string(run(t, dir, env, "mod", "graph"))
	for _, line := range strings.Split(graph, "\n") {
		for _, bad := range []string{"k8s.io/", "go.etcd.io/", root + "@"} {
			if strings.Contains(line, bad) {
				t.Errorf("module graph of a client-only consumer has %q: %s", bad, line)
			}
		}
	}
	if !strings.Contains(graph, root+"/client@") {
		t.Fatalf("module graph does not hold the client module:\n%s", graph)
	}
}

// kubeConsumer is a controller's program: it uses every public package of
// the Kubernetes module, its test kit included.
const kubeConsumer = `package main

import (
	"fmt"

	"github.com/fencer-dev/fencer/kubeadapter"
	"github.com/fencer-dev/fencer/kubeadapter/deploy"
	"github.com/fencer-dev/fencer/kubeadapter/fenced"
	"github.com/fencer-dev/fencer/kubeadapter/kubefencertest"
	"github.com/fencer-dev/fencer/kubeadapter/shard"
	"github.com/fencer-dev/fencer/token"
)

func main() {
	fmt.Println(kubeadapter.DefaultConfig("ns", "lease", "me").LeaseDuration, fenced.NewClient, shard.LeaseName("ring", "a"),
		kubefencertest.Supersede, deploy.Policy, token.ErrStale)
}
`

// TestKubeModuleGraph builds the program above in a module of its own that
// requires only the Kubernetes module (with replace directives to this
// checkout, as a user's go.mod would name released versions), and checks
// what that costs a controller author:
//   - no etcd package is built into it (go list -deps);
//   - its module graph holds neither fencer's root module nor porcupine nor
//     kustomize;
//   - the graph's only edges to etcd's server module are Kubernetes' own:
//     controller-runtime's manager needs k8s.io/apiextensions-apiserver,
//     whose go.mod requires etcd's server, so every controller-runtime user
//     has those edges; fencer's modules add none, so etcd's server version
//     is Kubernetes' to choose, never fencer's.
func TestKubeModuleGraph(t *testing.T) {
	repo := repoRoot(t)
	dir := t.TempDir()
	gomod := "module example.com/controller\n\ngo 1.26.0\n\nrequire " + root + "/" + kubeModule + " v0.0.0-00010101000000-000000000000\n\n"
	for _, m := range []string{kubeModule, "token", "internal/mutant", "internal/freeport", "internal/rendezvous"} {
		gomod += "replace " + root + "/" + m + " => " + filepath.Join(repo, m) + "\n"
	}
	for name, body := range map[string]string{"go.mod": gomod, "main.go": kubeConsumer} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	env := []string{"GOFLAGS=-mod=mod"}
	run(t, dir, env, "mod", "tidy")
	run(t, dir, env, "build", "-o", filepath.Join(dir, "controller"), ".")
	for _, pkg := range strings.Fields(string(run(t, dir, env, "list", "-deps", "."))) {
		if strings.HasPrefix(pkg, "go.etcd.io/") {
			t.Errorf("a controller that uses the Kubernetes module builds etcd's %s", pkg)
		}
	}
	graph := string(run(t, dir, env, "mod", "graph"))
	var etcdServerEdges int
	for _, line := range strings.Split(graph, "\n") {
		from, to, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		for _, bad := range []string{root + "@", "github.com/anishathalye/porcupine@", "sigs.k8s.io/kustomize/"} {
			if strings.HasPrefix(to, bad) {
				t.Errorf("module graph of a controller has %s: %s", to, line)
			}
		}
		if strings.HasPrefix(to, "go.etcd.io/etcd/server/") {
			etcdServerEdges++
			if strings.HasPrefix(from, root) || !strings.HasPrefix(from, "k8s.io/") {
				t.Errorf("etcd's server enters a controller's module graph through %s, not through Kubernetes' own modules: %s", from, line)
			}
		}
	}
	if !strings.Contains(graph, root+"/"+kubeModule+"@") {
		t.Fatalf("module graph does not hold the Kubernetes module:\n%s", graph)
	}
	t.Logf("%d edges to etcd's server, all from Kubernetes' modules", etcdServerEdges)
}

// TestModulesTidy checks that go mod tidy would change nothing in any of
// fencer's modules.
func TestModulesTidy(t *testing.T) {
	repo := repoRoot(t)
	for _, m := range append([]string{"."}, modules...) {
		t.Run(m, func(t *testing.T) {
			run(t, filepath.Join(repo, m), nil, "mod", "tidy", "-diff")
		})
	}
}
