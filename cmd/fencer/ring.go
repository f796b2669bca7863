package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"

	"github.com/fencer-dev/fencer/client"
	"github.com/fencer-dev/fencer/token"
)

func (a *app) ringCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "ring",
		Short: "divide a ring's shards among workers, each shard with a fencing token",
		Long: `A ring is a named, fixed set of shards that its members divide among
themselves (rendezvous hashing over the live members), each shard held as a
lease named ring:RING:SHARD with its own fencing token, so that every
guarded write (put, delete, txn, advance, check) fences on it. See
docs/ring.md.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usagef("a ring command is required: create, status or join")
			}
			return usagef("unknown ring command %q: want create, status or join", args[0])
		},
		RunE: func(*cobra.Command, []string) error { return nil },
	}
	cmd.AddCommand(a.ringCreateCmd(), a.ringStatusCmd(), a.ringJoinCmd())
	return cmd
}

// ringCreateView is what ring create prints.
type ringCreateView struct {
	Ring    string `json:"ring"`
	Shards  int    `json:"shards"`
	Created bool   `json:"created"`
}

func (a *app) ringCreateCmd() *cobra.Command {
	var count int
	var shards []string
	cmd := &cobra.Command{
		Use:   "create NAME (--shards N | --shard A --shard B ...)",
		Short: "define a ring and its shards",
		Long: `Defines ring NAME with --shards N shards named 0 to N-1, or with the
shards named by --shard (repeated). A ring's shards never change: creating
it again with the same shards changes nothing, with other shards fails
(exit code 5).`,
		Example: `  fencer ring create orders --shards 64
  fencer ring create regions --shard eu --shard us --shard ap`,
		Args: nArgs(1, "NAME"),
	}
	cmd.Flags().IntVar(&count, "shards", 0, "the number of shards, named 0 to N-1 (1 to 100000)")
	cmd.Flags().StringArrayVar(&shards, "shard", nil, "a shard's name (repeat for each shard)")
	return a.remote(cmd, func(ctx context.Context, c *client.Client, _ *grpc.ClientConn, args []string) (*view, error) {
		var created bool
		var err error
		n := count
		switch {
		case count != 0 && len(shards) != 0:
			return nil, usagef("give --shards N or --shard names, not both")
		case count == 0 && len(shards) == 0:
			return nil, usagef("give the ring's shards: --shards N, or --shard NAME for each")
		case count != 0:
			created, err = c.CreateRingCount(ctx, args[0], count)
		default:
			n = len(shards)
			created, err = c.CreateRing(ctx, args[0], shards...)
		}
		if err != nil {
			return nil, err
		}
		v := ringCreateView{Ring: args[0], Shards: n, Created: created}
		verb := "created"
		if !created {
			verb = "already have"
		}
		return &view{data: v, headers: []string{"RING", "SHARDS", "CREATED"},
			rows: [][]string{{v.Ring, strconv.Itoa(n), strconv.FormatBool(created)}},
			text: func(w io.Writer) { fmt.Fprintf(w, "%s ring %s with %d shards\n", verb, v.Ring, n) }}, nil
	})
}

// ringStatusView is what ring status prints in json and yaml.
type ringStatusView struct {
	Ring     string           `json:"ring"`
	Shards   int              `json:"shards"`
	Unowned  int              `json:"unowned"`
	Revision int64            `json:"revision"`
	Members  []ringMemberView `json:"members"`
}

type ringMemberView struct {
	Member  string `json:"member"`
	Holder  string `json:"holder"`
	Owned   int    `json:"owned"`
	Leaving bool   `json:"leaving"`
}

func (a *app) ringStatusCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "status NAME",
		Short: "show a ring's members, the shards each owns, and the shards no one owns",
		Long: `Shows ring NAME at one etcd revision: its shards, its members with the
number of shards each owns and whether it is leaving, and how many shards
no member owns (exit code 3 if the ring does not exist).`,
		Example: `  fencer ring status orders
  fencer ring status orders -o json`,
		Args: nArgs(1, "NAME"),
	}
	return a.remote(cmd, func(ctx context.Context, c *client.Client, _ *grpc.ClientConn, args []string) (*view, error) {
		st, err := c.RingStatus(ctx, args[0])
		if err != nil {
			return nil, err
		}
		v := ringStatusView{Ring: args[0], Shards: st.Shards, Unowned: st.Unowned, Revision: st.Revision, Members: []ringMemberView{}}
		var rows [][]string
		for _, m := range st.Members {
			v.Members = append(v.Members, ringMemberView{Member: m.Member, Holder: m.Holder, Owned: m.Owned, Leaving: m.Leaving})
			rows = append(rows, []string{m.Member, strconv.Itoa(m.Owned), yesNo(m.Leaving), m.Holder})
		}
		rows = append(rows, []string{"(unowned)", strconv.Itoa(st.Unowned), "-", "-"})
		return &view{data: v, headers: []string{"MEMBER", "OWNED", "LEAVING", "HOLDER"}, rows: rows}, nil
	})
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

const ringJoinLong = `Joins ring NAME as a member (--member, default derived from the session)
and runs CMD with the shards it owns:
  - $FENCER_RING and $FENCER_RING_MEMBER name the ring and the member;
  - $FENCER_RING_SHARDS_FILE is a file with one line per shard the member
    owns and may act for, "<shard> <token>", rewritten atomically (a rename)
    on every change; a shard being handed off (LOSING) is not in it;
  - $FENCER_RING_SHARDS lists the shards at CMD's start, comma-separated;
  - $FENCER_SESSION is the member's session, for "fencer watch".
Changes that come within --settle of each other are applied together; CMD
first starts once the shards have settled after the join.

On a change, by default, CMD is restarted: SIGTERM to its process group
(SIGKILL after --grace), then the shards it was losing are released to
their new owners, and CMD starts again with the new file. With
--on-change signal=HUP (or another signal), the file is rewritten and the
signal sent to CMD's process group instead, and a shard being handed off
is released --drain after it was reported, so CMD must stop acting for
the shards no longer in the file within --drain.

When the session is lost, CMD is stopped and ring join exits 9. SIGINT,
SIGTERM and SIGHUP are passed on to CMD (SIGKILL after --grace), and the
member leaves the ring, handing its shards off, before fencer exits; so
it does when CMD exits, with CMD's exit status.`

// ringJoinFlags are ring join's own flags.
type ringJoinFlags struct {
	member   string
	drain    time.Duration
	ttl      time.Duration
	grace    time.Duration
	settle   time.Duration
	onChange string
}

func (a *app) ringJoinCmd() *cobra.Command {
	var f ringJoinFlags
	cmd := &cobra.Command{
		Use:   "join NAME [--member M] [--drain D] -- CMD [ARGS...]",
		Short: "join a ring and run a command with the shards the member owns",
		Long:  ringJoinLong + "\n\n" + exitCodesHelp,
		Example: `  fencer ring join orders --member worker-1 -- ./process-orders
  fencer ring join orders --on-change signal=HUP -- ./server --shards-file-env FENCER_RING_SHARDS_FILE`,
		Args: func(cmd *cobra.Command, args []string) error {
			dash := cmd.ArgsLenAtDash()
			switch {
			case len(args) == 0 || dash == 0:
				return usagef("ring join needs a ring NAME: fencer ring join NAME -- CMD [ARGS...]")
			case dash == -1 || len(args) == 1:
				return usagef("ring join needs a command after --: fencer ring join %s -- CMD [ARGS...]", args[0])
			case dash > 1:
				return usagef("ring join takes one NAME before --, got %d", dash)
			}
			return validUTF8("NAME", args[0])
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			sig, err := parseOnChange(f.onChange)
			if err != nil {
				return err
			}
			if !cmd.Flags().Changed("grace") {
				f.grace = f.ttl / 4
			}
			if err := checkGrace(f.ttl, f.grace); err != nil {
				return err
			}
			if f.drain < 0 || f.drain > 10*time.Minute {
				return usagef("--drain %s is out of range: give 0 (the server's default, 5s) to 10m", f.drain)
			}
			if f.settle < 0 {
				return usagef("--settle %s is negative", f.settle)
			}
			return a.ringJoin(cmd.Context(), f, sig, args[0], args[1:])
		},
	}
	fs := cmd.Flags()
	a.conn.register(fs)
	fs.StringVar(&f.member, "member", "", "the member's name in the ring (default: derived from the session); a worker that joins again under its name gets its shards back")
	fs.DurationVar(&f.drain, "drain", 0, "how long a shard being handed off waits for CMD before it is released anyway (0: the server's default, 5s)")
	fs.DurationVar(&f.ttl, "ttl", 10*time.Second, "session TTL (whole seconds): the member and its shards vanish this long after fencer stops renewing it")
	fs.DurationVar(&f.grace, "grace", 0, "after SIGTERM (or the signal passed on), how long CMD has before SIGKILL; less than 2/3 of --ttl, less 200ms (default --ttl/4)")
	fs.DurationVar(&f.settle, "settle", time.Second, "apply changes that come within this long of each other together")
	fs.StringVar(&f.onChange, "on-change", "restart", "what a change does to CMD: restart, or signal=NAME (such as signal=HUP) to rewrite the file and signal CMD")
	envFlag(fs, "ttl", "FENCER_TTL")
	envFlag(fs, "grace", "FENCER_GRACE")
	return cmd
}

// parseOnChange parses --on-change: 0 for restart, or the signal to send.
func parseOnChange(s string) (syscall.Signal, error) {
	if s == "restart" {
		return 0, nil
	}
	name, ok := strings.CutPrefix(s, "signal=")
	if ok {
		name = strings.ToUpper(strings.TrimPrefix(strings.ToUpper(name), "SIG"))
		if sig := unix.SignalNum("SIG" + name); sig != 0 {
			return sig, nil
		}
	}
	return 0, usagef("invalid --on-change %q: want restart, or signal=NAME such as signal=HUP", s)
}

// ringJoin joins ring name and runs argv with the member's shards until
// argv exits, ctx ends (a signal) or the session is lost; then it leaves
// the ring (unless the session is lost) and returns CMD's status.
func (a *app) ringJoin(ctx context.Context, f ringJoinFlags, sig syscall.Signal, name string, argv []string) error {
	cc, err := a.conn.dial()
	if err != nil {
		return err
	}
	defer cc.Close()
	sess, err := client.New(cc).NewSession(client.WithTTL(f.ttl), client.WithEndEarly(f.grace+killMargin))
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), a.conn.timeout)
		defer cancel()
		_ = sess.Close(cctx)
	}()
	opts := []client.RingOption{client.WithDrain(f.drain)}
	if f.member != "" {
		opts = append(opts, client.WithMember(f.member))
	}
	jctx, cancel := context.WithTimeout(ctx, a.conn.timeout)
	r, err := sess.JoinRing(jctx, name, opts...)
	cancel()
	if err != nil {
		return err
	}
	defer r.Close()
	dir, err := os.MkdirTemp("", "fencer-ring-")
	if err != nil {
		return fmt.Errorf("shards file: %w", err)
	}
	defer os.RemoveAll(dir)
	w := &ringWorker{a: a, f: f, sig: sig, ring: r, sess: sess, name: name, argv: argv,
		file: filepath.Join(dir, "shards"), losing: map[string]time.Time{}, released: map[string]bool{}}
	return w.run(ctx)
}

// ringWorker is one run of ring join: CMD and the shards it acts for.
type ringWorker struct {
	a    *app
	f    ringJoinFlags
	sig  syscall.Signal // --on-change's signal; 0 restarts CMD
	ring *client.Ring
	sess *client.Session
	name string
	argv []string
	file string

	losing   map[string]time.Time // shards reported LOSING and not yet released, by when they were
	released map[string]bool      // shards released and not yet reported LOST
	child    *ringChild           // nil while CMD does not run
	written  []string             // the shards file's lines, as last written
}

// ringChild is one run of CMD.
type ringChild struct {
	group  int
	exited <-chan error
}

// run waits for the shards to settle, starts CMD, and follows the ring
// until CMD exits, ctx ends or the Ring ends.
func (w *ringWorker) run(ctx context.Context) error {
	changes := w.ring.Changes()
	if err := w.settle(ctx, changes); err != nil {
		return err
	}
	switch {
	case w.ring.Err() != nil:
		return w.lost()
	case ctx.Err() != nil: // interrupted before CMD started: hand the shards back
		if err := w.leave(nil); err != nil {
			return err
		}
		return ctx.Err()
	}
	if err := w.writeFile(); err != nil {
		return err
	}
	fmt.Fprintf(w.a.stderr, "fencer ring join: joined %s as %s, owning %d shards\n", w.name, w.ring.Name(), len(w.written))
	if err := w.start(); err != nil {
		return err
	}
	var drainTimer <-chan time.Time
	for {
		if next, ok := w.nextDrain(); ok && w.sig != 0 {
			drainTimer = time.After(time.Until(next))
		} else {
			drainTimer = nil
		}
		select {
		case err := <-w.child.exited:
			w.child = nil
			return w.leave(&exitStatus{code: childStatus(err)})
		case <-ctx.Done():
			sig := syscall.SIGTERM
			var se *signalError
			if errors.As(context.Cause(ctx), &se) {
				sig = se.sig
			}
			err := w.stopChild(sig)
			return w.leave(&exitStatus{code: childStatus(err)})
		case <-w.ring.Done():
			return w.lost()
		case <-drainTimer:
			w.releaseDrained(time.Now())
		case c, ok := <-changes:
			if !ok {
				return w.lost()
			}
			w.note(c)
			if err := w.settle(ctx, changes); err != nil {
				return err
			}
			if err := w.apply(); err != nil {
				return err
			}
		}
	}
}

// settle takes changes until none has come for --settle.
func (w *ringWorker) settle(ctx context.Context, changes <-chan client.RingChange) error {
	t := time.NewTimer(w.f.settle)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			return nil
		case <-ctx.Done():
			return nil // run sees ctx
		case c, ok := <-changes:
			if !ok {
				return nil // run sees the Ring's end
			}
			w.note(c)
			t.Reset(w.f.settle)
		}
	}
}

// note records one change.
func (w *ringWorker) note(c client.RingChange) {
	switch c.Kind {
	case client.Losing:
		w.losing[c.Shard] = time.Now()
	case client.Gained, client.Lost:
		delete(w.losing, c.Shard)
		delete(w.released, c.Shard)
	}
}

// shards returns the shards CMD may act for: owned and not being handed
// off (losing, or released until the Ring reports them lost), sorted,
// with their tokens.
func (w *ringWorker) shards() []string {
	var out []string
	for shard, tok := range w.ring.Owned() {
		if _, losing := w.losing[shard]; !losing && !w.released[shard] {
			out = append(out, shard+" "+tok.String())
		}
	}
	slices.Sort(out)
	return out
}

// writeFile rewrites the shards file atomically.
func (w *ringWorker) writeFile() error {
	lines := w.shards()
	w.written = lines
	text := strings.Join(lines, "\n")
	if text != "" {
		text += "\n"
	}
	tmp := w.file + ".new"
	if err := os.WriteFile(tmp, []byte(text), 0o600); err != nil {
		return fmt.Errorf("shards file: %w", err)
	}
	if err := os.Rename(tmp, w.file); err != nil {
		return fmt.Errorf("shards file: %w", err)
	}
	return nil
}

// start starts CMD with the shards of the file as last written.
func (w *ringWorker) start() error {
	var names []string
	for _, l := range w.written {
		shard, _, _ := strings.Cut(l, " ")
		names = append(names, shard)
	}
	cmd := exec.Command(w.argv[0], w.argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, w.a.stdout, w.a.stderr
	cmd.Env = append(os.Environ(), w.a.conn.childEnv()...)
	cmd.Env = append(cmd.Env, "FENCER_RING="+w.name, "FENCER_RING_MEMBER="+w.ring.Name(), "FENCER_RING_SHARDS_FILE="+w.file,
		"FENCER_RING_SHARDS="+strings.Join(names, ","), "FENCER_SESSION="+strconv.FormatInt(w.sess.ID(), 10))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	setParentDeathSignal(cmd.SysProcAttr)
	exited, err := start(cmd)
	if err != nil {
		code := exitCannotExec
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			code = exitNoCommand
		}
		return w.leave(&exitStatus{code: code, msg: fmt.Sprintf("cannot run %s: %v", w.argv[0], err)})
	}
	w.child = &ringChild{group: cmd.Process.Pid, exited: exited}
	return nil
}

// stopChild stops CMD with sig (SIGKILL after --grace) and returns its
// wait error.
func (w *ringWorker) stopChild(sig syscall.Signal) error {
	if w.child == nil {
		return nil
	}
	err := w.a.stop(w.argv[0], w.child.group, w.child.exited, sig, w.f.grace)
	w.child = nil
	return err
}

// apply applies the settled changes: rewrite the file, then restart CMD
// (releasing what it was losing once it has stopped) or signal it.
// Changes that leave CMD's shards as they were (a shard lost after it
// was released) change nothing.
func (w *ringWorker) apply() error {
	if slices.Equal(w.shards(), w.written) {
		return nil
	}
	if w.sig != 0 {
		if err := w.writeFile(); err != nil {
			return err
		}
		_ = syscall.Kill(-w.child.group, w.sig)
		w.releaseDrained(time.Now())
		return nil
	}
	if err := w.stopChild(syscall.SIGTERM); err != nil && w.ring.Err() == nil {
		// CMD's exit status on a restart is not fencer's: it goes on.
		fmt.Fprintf(w.a.stderr, "fencer ring join: %s exited %d when stopped for a change\n", w.argv[0], childStatus(err))
	}
	// The file no longer lists the losing shards before they are
	// released: no two members' files ever list one shard.
	if err := w.writeFile(); err != nil {
		return err
	}
	w.releaseLosing()
	fmt.Fprintf(w.a.stderr, "fencer ring join: restarting %s with %d shards\n", w.argv[0], len(w.written))
	return w.start()
}

// nextDrain returns when the earliest losing shard's drain ends.
func (w *ringWorker) nextDrain() (time.Time, bool) {
	var next time.Time
	for _, at := range w.losing {
		if end := at.Add(w.drain()); next.IsZero() || end.Before(next) {
			next = end
		}
	}
	return next, !next.IsZero()
}

// drain is the member's drain time.
func (w *ringWorker) drain() time.Duration {
	if w.f.drain == 0 {
		return 5 * time.Second
	}
	return w.f.drain
}

// releaseDrained releases the losing shards whose drain has passed.
func (w *ringWorker) releaseDrained(now time.Time) {
	var due []string
	for shard, at := range w.losing {
		if !now.Before(at.Add(w.drain())) {
			due = append(due, shard)
		}
	}
	w.release(due)
}

// releaseLosing releases every losing shard: CMD has stopped.
func (w *ringWorker) releaseLosing() {
	var all []string
	for shard := range w.losing {
		all = append(all, shard)
	}
	w.release(all)
}

// release hands shards off, a thousand at a time; a shard that was not
// released (no longer owned) is released by the server anyway.
func (w *ringWorker) release(shards []string) {
	for len(shards) > 0 {
		n := min(len(shards), 1000)
		ctx, cancel := context.WithTimeout(context.Background(), w.a.conn.timeout)
		_, err := w.ring.Release(ctx, shards[:n]...)
		cancel()
		if err != nil && !errors.Is(err, client.ErrNotLosing) {
			fmt.Fprintf(w.a.stderr, "fencer ring join: release: %s (the server releases them after --drain)\n", describe(err, w.a.conn.server, w.a.conn.secure()).msg)
		}
		for _, s := range shards[:n] {
			delete(w.losing, s)
			w.released[s] = true
		}
		shards = shards[n:]
	}
}

// leave hands every shard off (CMD has stopped) and returns status once
// the Ring has ended (nil for a nil status).
func (w *ringWorker) leave(status *exitStatus) error {
	if w.ring.Err() != nil {
		return w.lost()
	}
	result := func() error {
		if status == nil {
			return nil // not a nil *exitStatus in an error
		}
		return status
	}
	ctx, cancel := context.WithTimeout(context.Background(), w.a.conn.timeout)
	err := w.ring.Leave(ctx)
	cancel()
	if err != nil {
		fmt.Fprintf(w.a.stderr, "fencer ring join: leave %s: %s (its shards are free when the session ends)\n", w.name, describe(err, w.a.conn.server, w.a.conn.secure()).msg)
		return result()
	}
	// CMD has stopped: release each shard as it is reported losing, until
	// the server has handed everything off (the Ring ends), or for at
	// most the drain time and a margin: the server releases them anyway.
	bound := time.NewTimer(w.drain() + w.a.conn.timeout)
	defer bound.Stop()
	for {
		select {
		case c, ok := <-w.ring.Changes():
			if !ok {
				if errors.Is(w.ring.Err(), client.ErrRingLeft) {
					fmt.Fprintf(w.a.stderr, "fencer ring join: left %s\n", w.name)
				}
				return result()
			}
			if c.Kind == client.Losing {
				w.release([]string{c.Shard})
			}
		case <-bound.C:
			fmt.Fprintf(w.a.stderr, "fencer ring join: the hand-off of %s's shards did not end within %s; the server goes on with it\n", w.ring.Name(), w.drain()+w.a.conn.timeout)
			return result()
		}
	}
}

// lost stops CMD after the Ring ended other than by leaving: its session
// was lost, or the server ended its stream for good.
func (w *ringWorker) lost() error {
	err := w.ring.Err()
	if w.child != nil {
		fmt.Fprintf(w.a.stderr, "fencer ring join: membership of %s lost; stopping %s\n", w.name, w.argv[0])
		_ = w.stopChild(syscall.SIGTERM)
	}
	msg := fmt.Sprintf("membership of ring %s lost: %s", w.name, describe(err, w.a.conn.server, w.a.conn.secure()).msg)
	if errors.Is(err, token.ErrSessionExpired) {
		msg = fmt.Sprintf("membership of ring %s lost: the session ended (it expired, or the server could not be reached within --ttl); its shards go to the other members", w.name)
	}
	return &exitStatus{code: exitLeaseLost, msg: msg}
}
