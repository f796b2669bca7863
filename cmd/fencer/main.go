package main

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"
)

func main() {
	runWatchdogIfAsked()
	ctx, stop := notifyContext(context.Background())
	code := dispatch(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// app is one run of fencer: where it writes, and the connection flags of
// the command that runs (every client command registers the same ones).
type app struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	conn           connFlags
}

// dispatch runs fencer with args and returns its exit code, having said
// on stderr what went wrong, if anything.
func dispatch(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	a := &app{stdin: os.Stdin, stdout: stdout, stderr: stderr}
	root := a.rootCmd()
	root.SetArgs(args)
	cmd, err := root.ExecuteContextC(ctx)
	f := describe(err, a.conn.server, a.conn.secure())
	if sig, ok := interruptedBy(ctx, err); ok {
		f = failure{128 + int(sig), "interrupted by " + unix.SignalName(sig)}
	}
	if f.msg != "" {
		fmt.Fprintf(stderr, "%s: %s\n", cmd.CommandPath(), f.msg)
		if f.code == exitUsage {
			fmt.Fprintf(stderr, "Run '%s --help' for usage.\n", cmd.CommandPath())
		}
	}
	return f.code
}

func (a *app) rootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "fencer",
		Short: "fencer: fencing tokens over etcd, and a lock wrapper that fences what it runs",
		Long: `fencer serves fencing tokens over etcd (fencer serve) and is their
command-line client: every acquisition of a lease yields a greater token,
and every write carrying a token is conditional in etcd, so a superseded
holder's late write fails.

Client commands reach the server at --server (default ` + defaultListen + `,
or $FENCER_SERVER); every connection flag has an environment variable,
shown in the command's help. See docs/cli.md.

` + exitCodesHelp,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usagef("a command is required")
			}
			msg := fmt.Sprintf("unknown command %q", args[0])
			if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
				msg += fmt.Sprintf("; did you mean %q?", s[0])
			}
			return usagef("%s", msg)
		},
		RunE:              func(*cobra.Command, []string) error { return nil },
		SilenceErrors:     true,
		SilenceUsage:      true,
		CompletionOptions: cobra.CompletionOptions{HiddenDefaultCmd: false},
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error { return applyEnv(cmd.Flags()) },
	}
	// --version, as etcdctl has it, prints what fencer version prints.
	root.Version = buildVersion().String()
	root.SetVersionTemplate("{{.Version}}\n")
	root.SetOut(a.stdout)
	root.SetErr(a.stderr)
	root.SetIn(a.stdin)
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		if bad := flagValueError(err); bad != nil {
			return bad
		}
		msg := err.Error()
		if cmd.Name() == "join" && cmd.ArgsLenAtDash() == -1 {
			msg += " (the command to run goes after --: fencer ring join NAME -- CMD [ARGS...])"
		}
		if cmd.Name() == "acquire" && cmd.ArgsLenAtDash() == -1 {
			msg += " (the command to run goes after --: fencer acquire NAME -- CMD [ARGS...])"
		}
		return usagef("%s", msg)
	})
	root.AddGroup(&cobra.Group{ID: "lease", Title: "Leases:"}, &cobra.Group{ID: "data", Title: "Guarded data:"}, &cobra.Group{ID: "ring", Title: "Rings:"}, &cobra.Group{ID: "server", Title: "Server:"})
	for _, c := range []*cobra.Command{a.acquireCmd(), a.releaseCmd(), a.checkCmd(), a.statusCmd(), a.watchCmd(), a.advanceCmd()} {
		c.GroupID = "lease"
		root.AddCommand(c)
	}
	for _, c := range []*cobra.Command{a.putCmd(), a.getCmd(), a.deleteCmd(), a.txnCmd()} {
		c.GroupID = "data"
		root.AddCommand(c)
	}
	ring := a.ringCmd()
	ring.GroupID = "ring"
	root.AddCommand(ring)
	for _, c := range []*cobra.Command{a.serveCmd(), a.healthCmd(), a.benchCmd(), a.demoCmd()} {
		c.GroupID = "server"
		root.AddCommand(c)
	}
	root.AddCommand(a.versionCmd())
	return root
}
