package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The docs test: a shell block that a newcomer would paste, in the README,
// docs/cli.md or docs/ring.md, is marked runnable by docMarker on the line before its
// ```console fence. Each line of the block that starts with "$ " is a
// command (a line ending in a backslash continues it, and a here-document
// runs to its terminator); the lines after it, up to the next command,
// are its combined standard output and error, exactly. TestDocs runs each
// marked block against its own fencer serve, started on a fresh data
// directory so that revisions and tokens are the same on every run.

// docMarker marks the ```console block on the next line as runnable. An
// HTML comment, so GitHub renders nothing for it.
const docMarker = "<!-- fencer:run -->"

// docsRun are the documents whose marked blocks TestDocs runs, from this
// package's directory.
var docsRun = []string{"../../README.md", "../../docs/cli.md", "../../docs/ring.md"}

// docCommandBound bounds each command of a block; `make build` is the
// slowest, a link on a loaded machine.
const docCommandBound = 3 * time.Minute

// docCommand is one command of a marked block and the output it shows.
type docCommand struct {
	line int    // of the "$ " line, in the document
	text string // the command, without "$ ", with its continuation lines
	want []string
}

// docBlock is a marked block of a document.
type docBlock struct {
	line     int // of the marker
	commands []docCommand
}

// heredoc matches a here-document's operator and terminator word.
var heredoc = regexp.MustCompile(`<<-?\s*['"]?([A-Za-z_][A-Za-z0-9_]*)['"]?`)

// parseDocBlocks returns the marked blocks of doc. A marker that is not on
// the line before a ```console fence, a block without a command, output
// before the first command, and a block or here-document that does not
// end are errors, so that a marker cannot be left where nothing runs.
func parseDocBlocks(doc string) ([]docBlock, error) {
	lines := strings.Split(doc, "\n")
	var blocks []docBlock
	for i := 0; i < len(lines); i++ {
		if strings.TrimSpace(lines[i]) != docMarker {
			continue
		}
		b := docBlock{line: i + 1}
		if i+1 >= len(lines) || lines[i+1] != "```console" {
			return nil, fmt.Errorf("line %d: %s is not on the line before a ```console block", b.line, docMarker)
		}
		i += 2
		for ; i < len(lines) && lines[i] != "```"; i++ {
			line := lines[i]
			text, isCommand := strings.CutPrefix(line, "$ ")
			if !isCommand {
				if len(b.commands) == 0 {
					return nil, fmt.Errorf("line %d: output before the block's first command", i+1)
				}
				c := &b.commands[len(b.commands)-1]
				c.want = append(c.want, line)
				continue
			}
			c := docCommand{line: i + 1, text: text}
			for strings.HasSuffix(line, `\`) && i+1 < len(lines) {
				i++
				line = lines[i]
				c.text += "\n" + line
			}
			if m := heredoc.FindStringSubmatch(c.text); m != nil {
				for {
					i++
					if i >= len(lines) {
						return nil, fmt.Errorf("line %d: here-document %s does not end", c.line, m[1])
					}
					c.text += "\n" + lines[i]
					if strings.TrimLeft(lines[i], "\t") == m[1] {
						break
					}
				}
			}
			b.commands = append(b.commands, c)
		}
		if i >= len(lines) {
			return nil, fmt.Errorf("line %d: the marked block does not end", b.line)
		}
		if len(b.commands) == 0 {
			return nil, fmt.Errorf("line %d: the marked block has no command (lines starting with \"$ \")", b.line)
		}
		blocks = append(blocks, b)
	}
	return blocks, nil
}

// docTime is the time column of fencer demo's timeline, the only output
// of a marked block that differs between runs.
var docTime = regexp.MustCompile(`^ *[0-9]+\.[0-9]{3}s  `)

// normalizeDocOutput replaces what differs between runs of a command in
// lines with a fixed text: the time column of fencer demo's timeline.
func normalizeDocOutput(lines []string) []string {
	out := make([]string, len(lines))
	for i, l := range lines {
		out[i] = docTime.ReplaceAllLiteralString(l, "  T.TTTs  ")
	}
	return out
}

func TestDocsParse(t *testing.T) {
	for _, tc := range []struct {
		name, doc string
		want      []docBlock
		err       string
	}{
		{name: "commands and output", doc: "text\n" + docMarker + "\n```console\n$ fencer get k   # a comment\nv\n\n$ true\n```\n",
			want: []docBlock{{line: 2, commands: []docCommand{{line: 4, text: "fencer get k   # a comment", want: []string{"v", ""}}, {line: 7, text: "true"}}}}},
		{name: "here-document and continuation", doc: docMarker + "\n```console\n$ fencer txn \\\n  -o json <<'EOF'\nput k v\n$ not a command\nEOF\nSUCCESS\n```",
			want: []docBlock{{line: 1, commands: []docCommand{{line: 3, text: "fencer txn \\\n  -o json <<'EOF'\nput k v\n$ not a command\nEOF", want: []string{"SUCCESS"}}}}}},
		{name: "unmarked blocks are left alone", doc: "```console\n$ fencer serve\n```\n```sh\nmake run\n```\n"},
		{name: "an empty marked block", doc: docMarker + "\n```console\n```\n", err: "no command"},
		{name: "a block of output alone", doc: docMarker + "\n```console\nrevision 4\n```\n", err: "output before"},
		{name: "a marker before another kind of block", doc: docMarker + "\n```sh\nfencer get k\n```\n", err: "not on the line before"},
		{name: "a marker before text", doc: docMarker + "\n\n```console\n$ true\n```\n", err: "not on the line before"},
		{name: "a block that does not end", doc: docMarker + "\n```console\n$ true\n", err: "does not end"},
		{name: "a here-document that does not end", doc: docMarker + "\n```console\n$ cat <<EOF\nx\n```\n", err: "here-document EOF does not end"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseDocBlocks(tc.doc)
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
	require.Equal(t, []string{"  T.TTTs  A  acquired", "  T.TTTs  B", "final 2.5s"},
		normalizeDocOutput([]string{"  0.012s  A  acquired", " 12.345s  B", "final 2.5s"}))
}

// TestDocs runs every marked block of the README, docs/cli.md and docs/ring.md (see
// docMarker) against a fencer serve of its own, on a fresh embedded etcd:
// each command by sh -c exactly as written, in the repository's root,
// with the built fencer first on PATH and FENCER_SERVER naming that
// server. Each command's combined output must be the lines the block
// shows, the time column of fencer demo aside (normalizeDocOutput).
func TestDocs(t *testing.T) {
	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	env := docEnv(filepath.Dir(fencerBinary(t)))
	for _, doc := range docsRun {
		text, err := os.ReadFile(doc)
		require.NoError(t, err)
		name := strings.TrimPrefix(doc, "../../")
		blocks, err := parseDocBlocks(string(text))
		require.NoError(t, err, name)
		require.NotEmpty(t, blocks, "%s has no block marked %s", name, docMarker)
		for _, b := range blocks {
			t.Run(fmt.Sprintf("%s:%d", name, b.line), func(t *testing.T) {
				s := startServeProc(t)
				for _, c := range b.commands {
					got := runDocCommand(t, root, append(slices.Clip(env), "FENCER_SERVER="+s.addr), c.text)
					require.Equal(t, normalizeDocOutput(c.want), normalizeDocOutput(got),
						"%s:%d: $ %s\nprinted:\n%s", name, c.line, c.text, strings.Join(got, "\n"))
				}
			})
		}
	}
}

// docEnv is the environment of a documented command: the test's, without
// FENCER_ variables or those of a make that runs the test (a nested make
// would name its directory), with bin first on PATH.
func docEnv(bin string) []string {
	var env []string
	for _, kv := range cleanEnv() {
		name, value, _ := strings.Cut(kv, "=")
		switch {
		case name == "PATH":
			env = append(env, "PATH="+bin+string(os.PathListSeparator)+value)
		case name != "MAKEFLAGS" && name != "MAKELEVEL" && name != "MFLAGS" && name != "MAKEOVERRIDES":
			env = append(env, kv)
		}
	}
	return env
}

// runDocCommand runs command with sh -c in dir, within docCommandBound,
// and returns the lines it printed on standard output and error together.
// On the bound, its process group is killed and the test fails.
func runDocCommand(t *testing.T, dir string, env []string, command string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), docCommandBound)
	defer cancel()
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, "sh", "-c", command)
	cmd.Dir, cmd.Env = dir, env
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	err := cmd.Run()
	var exit *exec.ExitError
	require.False(t, ctx.Err() != nil, "$ %s still ran after %s; it printed:\n%s", command, docCommandBound, out.String())
	if err != nil && !errors.As(err, &exit) {
		require.NoError(t, err, "$ %s", command)
	}
	if out.Len() == 0 {
		return nil
	}
	return strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
}
