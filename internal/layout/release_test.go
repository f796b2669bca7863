package layout_test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/zip"
)

// modulePath returns the path of the module in dir of the repository
// ("" for the root).
func modulePath(dir string) string {
	if dir == "" {
		return root
	}
	return root + "/" + dir
}

// releasedModules are the directories of the modules a release tags, the
// root ("") first.
var releasedModules = []string{"", "token", "proto", "client", "internal/mutant", "internal/freeport", "internal/rendezvous", kubeModule, "mcr"}

// rootRequires are the modules the root's go.mod requires, by directory:
// those its packages import (internal/rendezvous reaches it only through
// kubeadapter, so go mod tidy leaves it out).
var rootRequires = []string{"token", "proto", "client", "internal/mutant", "internal/freeport", kubeModule}

// TestRelease checks that scripts/release.sh refuses a bad version or a
// tree with changes and tags nothing; then it cuts release v0.1.0 with
// make release, as docs/releasing.md says, in a clone of this checkout's
// HEAD and checks it: the tags of every module name one commit, whose go.mod
// files require fencer's other modules at v0.1.0; the binary it built prints the version and
// that commit. Then it serves the tags as a GOPROXY directory and builds,
// in a fresh module with no replace directive, a program that requires
// the client module and the root module at v0.1.0. The consumer has a
// module cache of its own, filled from the shared one's download
// directory, so no released version of fencer's lands in the shared
// cache.
func TestRelease(t *testing.T) {
	const version = "v0.1.0"
	repo := repoRoot(t)
	work := t.TempDir()
	clone := filepath.Join(work, "fencer")
	command(t, work, nil, "git", "clone", "-q", repo, clone)
	command(t, clone, nil, "git", "config", "user.name", "fencer release test")
	command(t, clone, nil, "git", "config", "user.email", "release-test@fencer.invalid")

	for _, bad := range []struct {
		why, version, dirt string
	}{
		{why: "not a semantic version", version: "0.1"},
		{why: "build metadata", version: "v0.1.0+build.1"},
		{why: "a major version above 1", version: "v2.0.0"},
		{why: "a working tree with changes", version: version, dirt: "README.md"},
	} {
		if bad.dirt != "" {
			if err := os.WriteFile(filepath.Join(clone, bad.dirt), []byte("changed\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if _, _, err := tryCommand(t, clone, nil, "scripts/release.sh", bad.version); err == nil {
			t.Errorf("release.sh %s passed with %s", bad.version, bad.why)
		}
		if bad.dirt != "" {
			command(t, clone, nil, "git", "checkout", "--", bad.dirt)
		}
		if tags := command(t, clone, nil, "git", "tag"); len(tags) > 0 {
			t.Fatalf("release.sh %s (%s) tagged:\n%s", bad.version, bad.why, tags)
		}
	}

	platform := runtime.GOOS + "/" + runtime.GOARCH
	out := command(t, clone, []string{"PLATFORMS=" + platform}, "make", "release", "VERSION="+version)
	t.Logf("make release:\n%s", out)

	head := strings.TrimSpace(string(command(t, clone, nil, "git", "rev-parse", "HEAD")))
	for _, dir := range releasedModules {
		tag := version
		if dir != "" {
			tag = dir + "/" + version
		}
		if got := strings.TrimSpace(string(command(t, clone, nil, "git", "rev-parse", tag+"^{commit}"))); got != head {
			t.Errorf("tag %s is on %s, not on the release commit %s", tag, got, head)
		}
	}
	for dir, needs := range map[string][]string{"": rootRequires, "client": {"token", "proto"}, "kubeadapter": {"token", "internal/mutant", "internal/freeport", "internal/rendezvous"}, "mcr": {kubeModule, "token"}} {
		gomod := filepath.Join(dir, "go.mod")
		mf, err := modfile.Parse(gomod, command(t, clone, nil, "git", "show", version+":"+gomod), nil)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		for _, r := range mf.Require {
			got[r.Mod.Path] = r.Mod.Version
		}
		for _, n := range needs {
			if v := got[modulePath(n)]; v != version {
				t.Errorf("%s at %s requires %s at %q, not %s", gomod, version, modulePath(n), v, version)
			}
		}
	}
	bin := filepath.Join(clone, "dist", "fencer-"+version+"-"+runtime.GOOS+"-"+runtime.GOARCH)
	printed := string(command(t, clone, nil, bin, "version"))
	if want := "fencer " + version + ", commit " + head + ","; !strings.HasPrefix(printed, want) {
		t.Errorf("the release binary prints %q, want it to start with %q", printed, want)
	}

	proxy := filepath.Join(work, "proxy")
	for _, dir := range releasedModules {
		writeProxyModule(t, proxy, clone, head, dir, version)
	}
	consumeRelease(t, work, proxy, version)
}

// writeProxyModule writes the module in dir of the repository at commit,
// as version, into the GOPROXY directory proxy.
func writeProxyModule(t *testing.T, proxy, repo, commit, dir, version string) {
	t.Helper()
	mv := module.Version{Path: modulePath(dir), Version: version}
	escaped, err := module.EscapePath(mv.Path)
	if err != nil {
		t.Fatal(err)
	}
	at := filepath.Join(proxy, escaped, "@v")
	if err := os.MkdirAll(at, 0o755); err != nil {
		t.Fatal(err)
	}
	var zipped bytes.Buffer
	if err := zip.CreateFromVCS(&zipped, mv, repo, commit, dir); err != nil {
		t.Fatalf("zip of %s: %v", mv, err)
	}
	info, err := json.Marshal(map[string]any{"Version": version, "Time": time.Now().UTC()})
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{
		"list":            []byte(version + "\n"),
		version + ".info": info,
		version + ".mod":  command(t, repo, nil, "git", "show", commit+":"+filepath.Join(dir, "go.mod")),
		version + ".zip":  zipped.Bytes(),
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(at, name), body, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// released is a program of a user of a release: the gRPC client beside
// the etcd store of the root module.
const released = `package main

import (
	"fmt"

	"github.com/fencer-dev/fencer/client"
	"github.com/fencer-dev/fencer/etcdstore"
)

func main() {
	fmt.Println(client.Reason(nil), etcdstore.ErrAlreadyHeld)
}
`

// consumeRelease builds released in a fresh module that requires the
// client and root modules at version, with go get as a user would, from
// the GOPROXY directory proxy before the machine's own proxy.
func consumeRelease(t *testing.T, work, proxy, version string) {
	t.Helper()
	dir := filepath.Join(work, "consumer")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	gomod := "module example.com/consumer\n\ngo 1.26.0\n"
	for name, body := range map[string]string{"go.mod": gomod, "main.go": released} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	goenv := func(name string) string {
		return strings.TrimSpace(string(command(t, dir, nil, goTool(), "env", name)))
	}
	shared := filepath.Join(goenv("GOMODCACHE"), "cache", "download")
	env := []string{
		"GOPROXY=file://" + proxy + ",file://" + shared + "," + goenv("GOPROXY"),
		"GOMODCACHE=" + filepath.Join(work, "modcache"),
		"GONOSUMDB=" + root,
		"GOFLAGS=-mod=mod -modcacherw",
	}
	command(t, dir, env, goTool(), "get", root+"/client@"+version, root+"@"+version)
	command(t, dir, env, goTool(), "mod", "tidy")
	text, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	mf, err := modfile.Parse("go.mod", text, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(mf.Replace) > 0 {
		t.Fatalf("the consumer's go.mod has replace directives: %v", mf.Replace)
	}
	command(t, dir, env, goTool(), "build", "-trimpath", "-o", filepath.Join(dir, "consumer"), ".")
	graph := string(command(t, dir, env, goTool(), "mod", "graph"))
	nodes := map[string]bool{}
	for _, n := range strings.Fields(graph) {
		nodes[n] = true
	}
	for _, m := range append([]string{""}, rootRequires...) {
		if !nodes[modulePath(m)+"@"+version] {
			t.Errorf("the consumer's module graph has no %s@%s:\n%s", modulePath(m), version, graph)
		}
	}
}
