// Command fencer is fencer's command-line tool.
//
// Usage:
//
//	fencer <command> [flags] [args]
//
// Run "fencer help" for the list of commands.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"syscall"
)

// command is one subcommand of the fencer binary.
type command struct {
	summary string
	// run executes the command with its arguments (the command name
	// excluded). It returns the process exit code.
	run func(ctx context.Context, args []string, stdout, stderr io.Writer) int
}

var commands = map[string]command{
	"demo":    {summary: "show a stale write being fenced, live on an embedded etcd", run: runDemo},
	"serve":   {summary: "serve the gRPC API (embedded etcd unless --etcd-endpoints)", run: runServe},
	"acquire": {summary: "run a command while holding a lease: acquire NAME -- CMD", run: runAcquire},
	"put":     {summary: "write a data key with a guarded put (token from $FENCER_TOKEN)", run: runPut},
	"get":     {summary: "read a data key", run: runGet},
	"check":   {summary: "report whether a token is current", run: runCheck},
	"status":  {summary: "list leases with their holders and tokens", run: runStatus},
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := dispatch(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func dispatch(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		usage(stderr)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	cmd, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "fencer: unknown command %q\n\n", args[0])
		usage(stderr)
		return 2
	}
	return cmd.run(ctx, args[1:], stdout, stderr)
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: fencer <command> [flags] [args]\n\ncommands:")
	names := make([]string, 0, len(commands))
	for name := range commands {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		fmt.Fprintf(w, "  %-10s %s\n", name, commands[name].summary)
	}
	fmt.Fprintln(w, "\nRun \"fencer <command> -h\" for a command's flags.")
}

// parseFlags parses args with fs, writing errors and help to stderr. It
// returns the exit code to stop with, or -1 to go on.
func parseFlags(fs *flag.FlagSet, args []string, stderr io.Writer) int {
	fs.SetOutput(stderr)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	return -1
}
