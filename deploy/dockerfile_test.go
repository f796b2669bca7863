package deploy_test

import (
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/mod/modfile"
)

// stage is one FROM stage of a Dockerfile: its base image, its name, and
// its instructions with line continuations joined.
type stage struct {
	from, name string
	lines      []string
}

// stages splits the Dockerfile text into its stages. It knows only what
// fencer's Dockerfile uses: comments, continuations, FROM ... [AS name].
func stages(t *testing.T, text string) []stage {
	t.Helper()
	var out []stage
	joined := strings.ReplaceAll(text, "\\\n", " ")
	for _, line := range strings.Split(joined, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		if strings.EqualFold(fields[0], "FROM") {
			s := stage{from: fields[1]}
			if len(fields) == 4 && strings.EqualFold(fields[2], "AS") {
				s.name = fields[3]
			}
			out = append(out, s)
			continue
		}
		require.NotEmpty(t, out, "an instruction before the first FROM: %s", line)
		out[len(out)-1].lines = append(out[len(out)-1].lines, line)
	}
	return out
}

// TestDockerfile checks the Dockerfile without docker: it is multi-stage;
// the builder's Go is go.mod's; the build stage's go build, run here as
// written, yields a static binary that runs; and the final stage is a
// distroless or scratch image that copies that binary and runs it as a
// non-root user.
func TestDockerfile(t *testing.T) {
	text, err := os.ReadFile("../Dockerfile")
	require.NoError(t, err)
	st := stages(t, string(text))
	require.GreaterOrEqual(t, len(st), 2, "not multi-stage")
	build, final := st[0], st[len(st)-1]

	mod, err := os.ReadFile("../go.mod")
	require.NoError(t, err)
	mf, err := modfile.Parse("go.mod", mod, nil)
	require.NoError(t, err)
	minor := regexp.MustCompile(`^\d+\.\d+`).FindString(mf.Go.Version)
	require.Regexp(t, `^golang:`+regexp.QuoteMeta(minor)+`(\.|-|$)`, build.from, "the builder's Go is not go.mod's %s", minor)

	// go mod download, before COPY . ., needs the go.mod of every module
	// that go.mod replaces with a directory.
	for _, r := range mf.Replace {
		if !modfile.IsDirectoryPath(r.New.Path) {
			continue
		}
		dir := strings.TrimPrefix(r.New.Path, "./")
		require.True(t, slices.ContainsFunc(build.lines, func(l string) bool {
			return strings.HasPrefix(l, "COPY ") && strings.Contains(l, " "+dir+"/go.mod")
		}), "the build stage copies no %s/go.mod before go mod download (go.mod replaces %s with it)", dir, r.Old.Path)
	}

	var goBuild string
	for _, l := range build.lines {
		if strings.HasPrefix(l, "RUN ") && strings.Contains(l, "go build") {
			goBuild = strings.TrimPrefix(l, "RUN ")
		}
	}
	require.NotEmpty(t, goBuild, "the build stage runs no go build")
	require.Contains(t, goBuild, "CGO_ENABLED=0")
	out := regexp.MustCompile(`-o (\S+)`).FindStringSubmatch(goBuild)
	require.NotNil(t, out, "go build names no output")

	require.Regexp(t, `^(gcr\.io/distroless/static[^ ]*|scratch)$`, final.from)
	var copied, user, entry string
	for _, l := range final.lines {
		f := strings.Fields(l)
		switch strings.ToUpper(f[0]) {
		case "COPY":
			if len(f) == 4 && f[1] == "--from="+build.name && f[2] == out[1] {
				copied = f[3]
			}
		case "USER":
			user = f[1]
		case "ENTRYPOINT":
			entry = l
		}
	}
	require.NotEmpty(t, copied, "the final stage does not copy %s from the build stage", out[1])
	require.NotEmpty(t, user, "the final stage sets no USER")
	require.NotRegexp(t, `^(0|root)(:|$)`, user, "the image runs as root")
	require.Contains(t, entry, `"`+copied+`"`)

	// Run the build stage's command as written, into a directory of ours,
	// with the build arguments a release passes (docs/releasing.md).
	args := map[string]string{}
	for _, l := range build.lines {
		if f := strings.Fields(l); strings.EqualFold(f[0], "ARG") {
			args[strings.SplitN(f[1], "=", 2)[0]] = ""
		}
	}
	for _, a := range []string{"VERSION", "COMMIT"} {
		_, ok := args[a]
		require.True(t, ok, "the build stage declares no ARG %s", a)
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "fencer")
	cmd := exec.Command("sh", "-c", strings.Replace(goBuild, out[0], "-o "+bin, 1))
	cmd.Env = append(os.Environ(), "VERSION=v0.0.0-docker", "COMMIT=0123abcd")
	cmd.Dir = ".."
	b, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s: %s", goBuild, b)
	f, err := elf.Open(bin)
	require.NoError(t, err)
	defer f.Close()
	for _, p := range f.Progs {
		require.NotEqual(t, elf.PT_INTERP, p.Type, "the binary needs a dynamic loader")
	}
	libs, err := f.ImportedLibraries()
	require.NoError(t, err)
	require.Empty(t, libs, "the binary links shared libraries")
	help, _ := exec.Command(bin, "help").CombinedOutput()
	require.Contains(t, string(help), "serve")
	version, err := exec.Command(bin, "version").Output()
	require.NoError(t, err)
	require.Contains(t, string(version), "fencer v0.0.0-docker, commit 0123abcd,")
}
