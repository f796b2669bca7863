package layout_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// checkoutSection is the README section that says how to require the
// modules from a checkout; its go.mod block is what TestCheckoutConsumer
// uses.
const checkoutSection = "### Requiring the modules from a checkout"

// readmeGoMod returns the first go.mod block of the README's section
// named heading.
func readmeGoMod(t *testing.T, heading string) string {
	t.Helper()
	text, err := os.ReadFile(filepath.Join(repoRoot(t), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(text), "\n"+heading+"\n")
	if !ok {
		t.Fatalf("README.md has no section %q", heading)
	}
	section, _, _ = strings.Cut(section, "\n#")
	_, block, ok := strings.Cut(section, "\n```go.mod\n")
	if !ok {
		t.Fatalf("README.md's section %q has no go.mod block", heading)
	}
	block, _, ok = strings.Cut(block, "\n```\n")
	if !ok {
		t.Fatalf("README.md's section %q has an unterminated go.mod block", heading)
	}
	return block + "\n"
}

// etcdUser is a program on the root module's etcd store.
const etcdUser = `package main

import (
	"fmt"

	"github.com/fencer-dev/fencer/etcdstore"
)

func main() {
	fmt.Println(etcdstore.ErrAlreadyHeld)
}
`

// kubeUser is a controller's program on the Kubernetes module.
const kubeUser = `package main

import (
	"fmt"

	"github.com/fencer-dev/fencer/kubeadapter"
	"github.com/fencer-dev/fencer/kubeadapter/fenced"
)

func main() {
	fmt.Println(kubeadapter.ErrAlreadyHeld, fenced.ErrDeleted)
}
`

// writeConsumer writes, in a fresh directory, a link "fencer" to this
// checkout and beside it a module "consumer" whose go.mod is the README's
// block and that holds a program on the client (grpcuser), one on
// etcdstore (etcduser) and one on the Kubernetes module (kubeuser). It
// returns the consumer's directory.
func writeConsumer(t *testing.T, block string) string {
	t.Helper()
	work := t.TempDir()
	if err := os.Symlink(repoRoot(t), filepath.Join(work, "fencer")); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(work, "consumer")
	for name, body := range map[string]string{
		"go.mod":           "module example.com/consumer\n\ngo 1.26.0\n\n" + block,
		"grpcuser/main.go": consumer,
		"etcduser/main.go": etcdUser,
		"kubeuser/main.go": kubeUser,
	} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestCheckoutConsumer does what the README's section on requiring the
// modules from a checkout says: a fresh module, beside the checkout,
// whose go.mod has the README's require and replace lines as written,
// passes go mod tidy, go build and go vet of a program on the client, one
// on etcdstore and one on the Kubernetes module. Modules come from GOPROXY as the environment sets it.
// It also checks that the lines are all needed: with the root's replace
// line alone, go mod tidy fails on the placeholder versions the root
// module requires the light modules at.
func TestCheckoutConsumer(t *testing.T) {
	block := readmeGoMod(t, checkoutSection)
	env := []string{"GOFLAGS=-mod=mod"}
	t.Run("as written", func(t *testing.T) {
		dir := writeConsumer(t, block)
		run(t, dir, env, "mod", "tidy")
		run(t, dir, env, "build", "-o", t.TempDir(), "./...")
		run(t, dir, env, "vet", "./...")
	})
	t.Run("the root's replace alone", func(t *testing.T) {
		var lines []string
		for _, l := range strings.Split(block, "\n") {
			if f := strings.Fields(l); len(f) > 1 && strings.HasPrefix(f[0], root+"/") && f[1] == "=>" {
				continue
			}
			lines = append(lines, l)
		}
		dir := writeConsumer(t, strings.Join(lines, "\n"))
		// GOPROXY=off: no proxy serves the placeholder versions, and
		// asking none keeps the failure quick.
		_, stderr, err := tryCommand(t, dir, append(env, "GOPROXY=off"), goTool(), "mod", "tidy")
		if err == nil {
			t.Fatalf("go mod tidy passed with only the root's replace line:\n%s", strings.Join(lines, "\n"))
		}
		if !strings.Contains(string(stderr), "v0.0.0-00010101000000-000000000000") {
			t.Errorf("go mod tidy failed, but not on the placeholder versions:\n%s", stderr)
		}
	})
}
