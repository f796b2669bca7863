package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime/debug"
	"strconv"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/fencer-dev/fencer/client"
	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
)

// lossView is one event fencer watch prints.
type lossView struct {
	Lease    string `json:"lease"`
	Token    string `json:"token"`
	Revision int64  `json:"revision"`
	Reason   string `json:"reason"`
}

func (a *app) watchCmd() *cobra.Command {
	var out outputFlags
	var session int64
	var reconnect time.Duration
	cmd := &cobra.Command{
		Use:   "watch",
		Short: "print each lease of a session that is lost, as it happens",
		Long: `Follows the leases of a session (--session, or $FENCER_SESSION, which
fencer acquire sets for its command) and prints one line per lease lost:
deleted or replaced. When the server or its etcd is unavailable it says
so once and watches again, with backoff, from the last revision it saw,
so a loss meanwhile is still printed; after --reconnect-timeout without
an answer it gives up (exit code 7). It runs until interrupted (exit code
0) or until the session ends (exit code 3). The session must be one of the caller's
principal. A script can run it in the background to learn at once that
its lease is gone.`,
		Example: `  fencer acquire orders -- sh -c 'fencer watch & exec ./worker'`,
		Args:    nArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if session == 0 {
				return usagef("no session: pass --session or run under fencer acquire (which sets $FENCER_SESSION)")
			}
			if session < 0 {
				return usagef("invalid --session %d: want a session id, a whole number above 0, as fencer acquire prints it", session)
			}
			if err := checkReconnect(reconnect); err != nil {
				return err
			}
			return a.withClient(cmd.Context(), func(ctx context.Context, cc *grpc.ClientConn) error {
				down, octx := newOutage(ctx, a, "fencer watch", reconnect)
				defer down.stop()
				synced := func(rev int64) {
					fmt.Fprintf(a.stderr, "fencer watch: watching session %d from revision %d\n", session, rev)
				}
				err := client.New(outageConn{ClientConnInterface: cc, o: down}).WatchSession(octx, session, synced, func(ev client.LossEvent) error {
					v := lossView{Lease: ev.Token.Lease, Token: ev.Token.String(), Revision: ev.Revision, Reason: ev.Reason}
					err := out.print(a.stdout, view{data: v, headers: []string{"LEASE", "TOKEN", "REVISION", "REASON"},
						rows: [][]string{{v.Lease, v.Token, strconv.FormatInt(v.Revision, 10), v.Reason}},
						text: func(w io.Writer) { fmt.Fprintf(w, "lost %s: %s at revision %d\n", v.Token, v.Reason, v.Revision) }})
					out.noHeaders = true // one header for the whole stream
					return err
				})
				if gave := gaveUp(octx); gave != nil {
					return gave
				}
				if errors.Is(err, context.Canceled) && ctx.Err() != nil {
					return nil
				}
				return err
			})
		},
	}
	a.conn.register(cmd.Flags())
	out.register(cmd)
	cmd.Flags().Int64Var(&session, "session", 0, "session id to watch, as fencer acquire prints it")
	envFlag(cmd.Flags(), "session", "FENCER_SESSION")
	reconnectFlag(cmd.Flags(), &reconnect)
	return cmd
}

// healthView is what fencer health prints.
type healthView struct {
	Server string `json:"server"`
	Status string `json:"status"`
}

func (a *app) healthCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "health",
		Short: "ask the server whether it serves (exit code 7 if not)",
		Long: `Asks the server through the gRPC health service whether fencer's service
is SERVING: the server is up and has a quorum of its etcd. Exits 0 when it
is, 7 when it is not or cannot be reached.`,
		Args: nArgs(0),
	}
	return a.remote(cmd, func(ctx context.Context, _ *client.Client, cc *grpc.ClientConn, _ []string) (*view, error) {
		resp, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{Service: fencerv1.FencerService_ServiceDesc.ServiceName})
		if err != nil {
			return nil, err
		}
		st := resp.GetStatus()
		v := healthView{Server: a.conn.server, Status: st.String()}
		if st != healthpb.HealthCheckResponse_SERVING {
			err = &exitStatus{code: exitUnavailable, msg: fmt.Sprintf("fencer at %s is %s: it cannot reach a quorum of its etcd, or is shutting down", a.conn.server, st)}
		}
		return &view{data: v, headers: []string{"SERVER", "STATUS"}, rows: [][]string{{v.Server, v.Status}},
			text: func(w io.Writer) { fmt.Fprintf(w, "%s is %s\n", v.Server, v.Status) }}, err
	})
}

// versionView is what fencer version prints.
type versionView struct {
	Version   string `json:"version"`
	Commit    string `json:"commit,omitempty"`
	Modified  bool   `json:"modified,omitempty"`
	CommitAt  string `json:"commit_time,omitempty"`
	GoVersion string `json:"go_version"`
}

// version and commit are the release version and the commit fencer was
// built from, when the build stamps them with -ldflags "-X main.version=...
// -X main.commit=..." (make build stamps the commit; scripts/release.sh and
// the Dockerfile stamp both). A build without them reports the module
// version and, with VCS stamping on, the commit from the build info.
var version, commit string

// buildVersion reads the module version and the VCS stamp that go build
// put in the binary; a version or commit stamped by -ldflags takes their
// place.
func buildVersion() versionView {
	v := versionView{Version: "unknown"}
	if info, ok := debug.ReadBuildInfo(); ok {
		v.Version, v.GoVersion = info.Main.Version, info.GoVersion
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				v.Commit = s.Value
			case "vcs.time":
				v.CommitAt = s.Value
			case "vcs.modified":
				v.Modified = s.Value == "true"
			}
		}
	}
	if version != "" {
		v.Version = version
	}
	if commit != "" {
		v.Commit = commit
	}
	return v
}

// String is the line fencer version (and fencer --version) prints.
func (v versionView) String() string {
	return fmt.Sprintf("fencer %s, commit %s, %s", v.Version, v.commit(), v.GoVersion)
}

// commit is the commit, marked if the tree was modified, or "-".
func (v versionView) commit() string {
	if v.Modified {
		return v.Commit + " (modified)"
	}
	return dash(v.Commit)
}

func (a *app) versionCmd() *cobra.Command {
	var out outputFlags
	cmd := &cobra.Command{
		Use:   "version",
		Short: "print fencer's version and the commit it was built from",
		Args:  nArgs(0),
		RunE: func(*cobra.Command, []string) error {
			v := buildVersion()
			return out.print(a.stdout, view{data: v, headers: []string{"VERSION", "COMMIT", "GO"}, rows: [][]string{{v.Version, v.commit(), v.GoVersion}},
				text: func(w io.Writer) { fmt.Fprintln(w, v) }})
		},
	}
	out.register(cmd)
	return cmd
}
