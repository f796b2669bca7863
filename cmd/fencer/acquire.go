package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fencer-dev/fencer/client"
	"github.com/fencer-dev/fencer/etcdstore"
	"github.com/fencer-dev/fencer/token"
)

const acquireLong = `Acquires lease NAME and runs CMD while it is held, with the token in
$FENCER_TOKEN, the lease name in $FENCER_LEASE and the session id in
$FENCER_SESSION (for "fencer watch"). Without CMD, it holds the lease and
prints the token until interrupted (Ctrl-C, SIGTERM or SIGHUP), then
releases it.

While another holder has the lease, acquire says on standard error whom it
waits for, and waits (--wait-timeout bounds the wait; --wait=false fails at
once with exit code 5). A server restart while waiting is ridden out: the
wait goes on once the server answers again. A server that does not answer
for --reconnect-timeout, or that cannot be reached when --wait-timeout
ends, ends acquire with exit code 7, not 5.

CMD is stopped when the lease ends (docs/cli.md states the timing and
the gaps that remain):
  - when the lease is lost, CMD's process group gets SIGTERM, then SIGKILL
    after --grace, and acquire exits 9. When renewals fail (a partition, a
    server gone), the stop starts --grace + 200ms before the lease's local
    deadline, so CMD is gone before the server can expire the lease;
    --grace must be less than two thirds of --ttl, less 200ms (default: a
    quarter of --ttl);
  - SIGINT, SIGTERM and SIGHUP sent to fencer are passed on to CMD's
    process group (SIGKILL after --grace, said on standard error), and the
    lease is released; while acquire still waits for the lease, they end
    it with exit code 128+N;
  - a watchdog process leads CMD's process group. If fencer dies (SIGKILL,
    the OOM killer) it kills the group when fencer's end of a pipe closes
    (on Linux the kernel's parent-death signal also reaches CMD). If fencer
    is stopped (SIGSTOP, a frozen cgroup), the watchdog stops the group on
    its own clock, fed by fencer's heartbeats after each renewal, and
    acquire exits 9 once it runs again. If the watchdog dies, fencer kills
    the group, releases the lease and exits 10;
  - when CMD exits, what it left running in its process group is killed;
  - the lease is acquired with a lock-delay, --ttl + --grace + 1s unless
    --lock-delay says otherwise: if it ends other than by this acquire's
    own release (its token released by another process, its holder key
    deleted, its session expired), the store refuses it to every acquirer
    until the delay has passed, so CMD is stopped before a successor's CMD
    can start, even when fencer cannot hear of the end and stops CMD only
    at its session's deadline, a TTL after its last renewal. While a lease is in its lock-delay, acquire waits it
    out, as it waits for a holder (--wait=false: exit code 5).
When standard input is the terminal, CMD runs in the foreground, so
interactive commands and commands that read standard input work.

Otherwise acquire exits with CMD's exit status (128+N if signal N ended it).`

// acquireFlags are acquire's own flags.
type acquireFlags struct {
	ttl, waitTimeout, grace time.Duration
	lockDelay               time.Duration
	reconnectTimeout        time.Duration // how long an unreachable server is retried
	wait                    bool
}

func (a *app) acquireCmd() *cobra.Command {
	var f acquireFlags
	var out outputFlags
	cmd := &cobra.Command{
		Use:   "acquire NAME [-- CMD [ARGS...]]",
		Short: "hold a lease while a command runs (or until interrupted, without one)",
		Long:  acquireLong + "\n\n" + exitCodesHelp,
		Example: `  fencer acquire orders -- ./process-orders
  fencer acquire --wait-timeout 30s orders -- sh -c 'fencer put orders/total 100'
  fencer acquire orders          # hold it until Ctrl-C`,
		Args: func(cmd *cobra.Command, args []string) error {
			dash := cmd.ArgsLenAtDash()
			switch {
			case len(args) == 0 || dash == 0:
				return usagef("acquire needs a lease NAME: fencer acquire NAME [-- CMD [ARGS...]]")
			case dash == -1 && len(args) > 1:
				return usagef("put -- between NAME and the command: fencer acquire %s -- %s ...", args[0], args[1])
			case dash > 1:
				return usagef("acquire takes one NAME before --, got %d", dash)
			case dash == 1 && len(args) == 1:
				return usagef("no command after --: fencer acquire %s -- CMD [ARGS...], or drop -- to hold the lease until interrupted", args[0])
			}
			return validUTF8("NAME", args[0])
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkReconnect(f.reconnectTimeout); err != nil {
				return err
			}
			if !cmd.Flags().Changed("grace") {
				f.grace = f.ttl / 4
			}
			if !cmd.Flags().Changed("lock-delay") {
				// A --ttl or --grace out of range is refused with its own message.
				clamp := func(d time.Duration) time.Duration { return min(max(d, 0), time.Hour) }
				f.lockDelay = min(clamp(f.ttl)+clamp(f.grace)+lockDelayMargin, time.Hour)
			}
			if f.lockDelay < 0 || f.lockDelay > time.Hour {
				return usagef("--lock-delay %s is out of range: give 0 (none) to 1h", f.lockDelay)
			}
			return a.acquire(cmd.Context(), f, &out, args[0], args[1:])
		},
	}
	fs := cmd.Flags()
	a.conn.register(fs)
	out.register(cmd)
	fs.DurationVar(&f.ttl, "ttl", 10*time.Second, "session TTL (whole seconds): the lease vanishes this long after fencer stops renewing it")
	fs.BoolVar(&f.wait, "wait", true, "wait while another holder holds the lease (false: fail at once, exit code 5)")
	fs.DurationVar(&f.waitTimeout, "wait-timeout", 0, "give up waiting after this long, with exit code 5 while the lease is held (0: wait for ever)")
	fs.DurationVar(&f.grace, "grace", 0, "after SIGTERM (or the signal passed on), how long CMD has before SIGKILL; less than 2/3 of --ttl, less 200ms (default --ttl/4)")
	fs.DurationVar(&f.lockDelay, "lock-delay", 0, "after the lease ends other than by this acquire's release, how long the store refuses it to every acquirer (whole seconds, rounded up; 0: none; default --ttl + --grace + 1s)")
	reconnectFlag(fs, &f.reconnectTimeout)
	envFlag(fs, "ttl", "FENCER_TTL")
	envFlag(fs, "lock-delay", "FENCER_LOCK_DELAY")
	envFlag(fs, "wait-timeout", "FENCER_WAIT_TIMEOUT")
	envFlag(fs, "grace", "FENCER_GRACE")
	return cmd
}

// lockDelayMargin is what the default --lock-delay adds to --ttl + --grace.
// A lease can end where this acquire cannot hear of it (its server
// partitioned away, frozen or restarting): it then stops CMD at its
// session's deadline at the latest, at most a TTL after the end, and CMD's
// grace follows. The margin is time for the SIGKILL to take effect.
const lockDelayMargin = time.Second

// killMargin is how long before the lease's local deadline the SIGKILL
// that ends CMD's grace goes out, after a failed renewal: time for the
// kernel to end CMD's processes, and for fencer's and the watchdog's
// timers to be late.
const killMargin = 200 * time.Millisecond

// checkGrace refuses a negative grace, and one that, with killMargin,
// does not fit before the lease's local deadline with more than a third of
// ttl left for renewals (client.WithEndEarly's bound). A ttl out of the
// session's range (whole seconds from 1s to 1h) is left to the session to
// refuse, with its own message.
func checkGrace(ttl, grace time.Duration) error {
	if grace < 0 {
		return usagef("--grace %s is negative: give how long CMD has between SIGTERM and SIGKILL, 0 or more", grace)
	}
	if ttl < time.Second || ttl > time.Hour || ttl%time.Second != 0 || 3*(grace+killMargin) < 2*ttl {
		return nil
	}
	return usagef("--grace %s does not fit in --ttl %s: SIGTERM, --grace and SIGKILL (%s) must all come before the lease's local deadline, leaving more than a third of the TTL for renewals; use a --grace below %s, or a longer --ttl",
		grace, ttl, killMargin, (2*ttl/3 - killMargin).Round(time.Millisecond))
}

// acquire acquires name, then runs argv while it is held, or holds it
// until ctx ends when argv is empty. With argv, the session ends grace +
// killMargin before its local deadline, so that CMD is stopped by then.
func (a *app) acquire(ctx context.Context, f acquireFlags, out *outputFlags, name string, argv []string) error {
	opts := []client.SessionOption{client.WithTTL(f.ttl)}
	end := &sessionEnd{}
	if len(argv) > 0 {
		if err := checkGrace(f.ttl, f.grace); err != nil {
			return err
		}
		opts = append(opts, client.WithEndEarly(f.grace+killMargin), client.WithDeadlineFunc(end.set))
	}
	cc, err := a.conn.dial()
	if err != nil {
		return err
	}
	defer cc.Close()
	sess, err := client.New(cc).NewSession(opts...)
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), a.conn.timeout)
		defer cancel()
		_ = sess.Close(cctx)
	}()
	lease, err := a.acquireWaiting(ctx, sess, f, name)
	if err != nil {
		return err
	}
	tok := lease.Token()
	fmt.Fprintf(a.stderr, "fencer acquire: holding %s\n", tok)
	if len(argv) == 0 {
		return a.hold(ctx, lease, sess.ID(), out)
	}
	env := append(os.Environ(), a.conn.childEnv()...)
	env = append(env, "FENCER_TOKEN="+tok.String(), "FENCER_LEASE="+tok.Lease, "FENCER_SESSION="+strconv.FormatInt(sess.ID(), 10),
		"FENCER_RECONNECT_TIMEOUT="+f.reconnectTimeout.String())
	return a.runHeld(ctx, lease, end, argv, env, f.grace)
}

// sessionEnd is when acquire's session ends unless renewed, as the
// session reports it (client.WithDeadlineFunc), passed on to the watchdog
// as a heartbeat once there is one.
type sessionEnd struct {
	mu  sync.Mutex
	end time.Time
	wd  *watchdog
}

func (e *sessionEnd) set(end time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.end = end
	if e.wd != nil {
		e.wd.heartbeat(end)
	}
}

// feed sends the session's end to wd now and after each renewal.
func (e *sessionEnd) feed(wd *watchdog) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.wd = wd
	if !e.end.IsZero() {
		wd.heartbeat(e.end)
	}
}

// passed reports whether the session's end has passed: the watchdog may
// have stopped CMD then, and the lease is as good as lost.
func (e *sessionEnd) passed() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return !e.end.IsZero() && !time.Now().Before(e.end)
}

// acquireWaiting acquires name through sess, saying once on standard
// error whom it waits for, and retrying with backoff while the server
// cannot be reached (saying so once per outage), until f.waitTimeout (if
// set) or ctx ends, or an outage outlasts f.reconnectTimeout (if set).
// The wait ends with exit code 5 only when the server last said that the
// lease is held; if the server could not be reached at the end, it ends
// with exit code 7.
func (a *app) acquireWaiting(ctx context.Context, sess *client.Session, f acquireFlags, name string) (*client.Lease, error) {
	wctx, cancel := ctx, context.CancelFunc(func() {})
	if f.waitTimeout > 0 {
		wctx, cancel = context.WithTimeout(ctx, f.waitTimeout)
	}
	defer cancel()
	down, octx := newOutage(wctx, a, "fencer acquire", f.reconnectTimeout)
	defer down.stop()
	retry := &backoff.ExponentialBackOff{InitialInterval: 100 * time.Millisecond, RandomizationFactor: 0.5, Multiplier: 2, MaxInterval: 2 * time.Second}
	var holder string
	delayed := false // the server last said the lease is in its lock-delay
	reached := false // the server answered once
	var last error   // the last call's error, while the server cannot be reached
	for {
		tctx, tcancel := context.WithTimeout(octx, a.conn.timeout)
		lease, err := sess.TryAcquire(tctx, name, client.WithLockDelay(f.lockDelay))
		tcancel()
		var held *token.HeldError
		var delay *token.LockDelayError
		waited := false // the waiting Acquire's only deadline is wctx's: the server answered, so octx's bound is off
		if (errors.As(err, &held) || errors.As(err, &delay)) && f.wait {
			waited, reached = true, true
			down.answered()
			last = nil
			retry.Reset()
			switch {
			case held != nil && held.Holder != holder:
				holder, delayed = held.Holder, false
				fmt.Fprintf(a.stderr, "fencer acquire: waiting for %s, held by %s\n", name, holder)
			case delay != nil && !delayed:
				holder, delayed = "", true
				fmt.Fprintf(a.stderr, "fencer acquire: waiting for %s: %s\n", name, delay.Explain())
			}
			lease, err = sess.Acquire(octx, name, client.WithLockDelay(f.lockDelay))
		}
		switch {
		case err == nil:
			return lease, nil
		case ctx.Err() != nil:
			return nil, err // interrupted
		case gaveUp(octx) != nil:
			return nil, gaveUp(octx)
		case f.wait && unavailable(err):
			last = err
			down.failed(err)
			select {
			case <-octx.Done():
			case <-time.After(retry.NextBackOff()):
			}
			if octx.Err() == nil {
				continue
			}
		case waited && (wctx.Err() != nil || status.Code(err) == codes.DeadlineExceeded):
			// The server may see the deadline pass a moment before wctx does.
			msg := fmt.Sprintf("gave up waiting for %s after --wait-timeout %s", name, f.waitTimeout)
			if holder != "" {
				msg += ", held by " + holder
			} else if delayed {
				msg += ", in its lock-delay"
			}
			return nil, &exitStatus{code: exitHeld, msg: msg}
		case wctx.Err() == nil:
			return nil, err
		}
		if ctx.Err() != nil {
			return nil, ctx.Err() // interrupted while it waited to retry
		}
		if err := gaveUp(octx); err != nil {
			return nil, err
		}
		return nil, a.waitEndedUnreachable(name, f.waitTimeout, reached, holder, time.Since(down.began()), last)
	}
}

// waitEndedUnreachable is the exit-7 error of an acquire whose
// --wait-timeout ended while the server could not be reached (for the
// last unreachable of the wait, with last the last call's error), or did
// not answer its last call (last nil): whether the lease is held is not
// known. reached says whether the server ever answered, holder whom it
// last named.
func (a *app) waitEndedUnreachable(name string, timeout time.Duration, reached bool, holder string, unreachable time.Duration, last error) error {
	if last == nil {
		return &exitStatus{code: exitUnavailable, msg: fmt.Sprintf("gave up waiting for %s after --wait-timeout %s: fencer at %s did not answer in time, so whether the lease is held is not known", name, timeout, a.conn.server)}
	}
	part := "the whole wait"
	if reached {
		part = fmt.Sprintf("the last %s of it", unreachable.Round(100*time.Millisecond))
		if holder != "" {
			part += fmt.Sprintf(" (held by %s before)", holder)
		}
	}
	return &exitStatus{code: exitUnavailable, msg: fmt.Sprintf("gave up waiting for %s after --wait-timeout %s, having failed to reach the server for %s: %s", name, timeout, part, describe(last, a.conn.server, a.conn.secure()).msg)}
}

// holdView is what acquire without CMD prints: the lease it holds. The
// session is a string in json and yaml: an etcd lease ID is often above
// 2^53, which jq and JavaScript round as a number.
type holdView struct {
	Lease   string `json:"lease"`
	Token   string `json:"token"`
	Session int64  `json:"session,string"`
}

// hold holds lease until ctx ends (a signal), then releases it, or until
// the lease is lost.
func (a *app) hold(ctx context.Context, lease *client.Lease, session int64, out *outputFlags) error {
	tok := lease.Token()
	v := holdView{Lease: tok.Lease, Token: tok.String(), Session: session}
	err := out.print(a.stdout, view{
		data: v, headers: []string{"LEASE", "TOKEN", "SESSION"},
		rows: [][]string{{v.Lease, v.Token, strconv.FormatInt(v.Session, 10)}},
		text: func(w io.Writer) { fmt.Fprintln(w, v.Token) },
	})
	if err != nil {
		return err
	}
	select {
	case <-lease.Done():
		return &exitStatus{code: exitLeaseLost, msg: fmt.Sprintf("lease lost: %s", lossReason(lease))}
	case <-ctx.Done():
	}
	rctx, cancel := context.WithTimeout(context.Background(), a.conn.timeout)
	defer cancel()
	if err := lease.Release(rctx); err != nil {
		return err
	}
	fmt.Fprintf(a.stderr, "fencer acquire: released %s\n", tok)
	return nil
}

// lossReason says why lease ended, without the library's prefixes.
func lossReason(lease *client.Lease) string {
	var stale *token.StaleError
	switch err := lease.Err(); {
	case errors.As(err, &stale) && !stale.Newer.IsZero():
		return fmt.Sprintf("%s was superseded by %s", lease.Token(), stale.Newer)
	case errors.Is(err, etcdstore.ErrLeaseLost):
		return fmt.Sprintf("%s: its holder key was deleted or replaced", lease.Token())
	case errors.Is(err, client.ErrSessionNotFound):
		return fmt.Sprintf("%s: the server ended its session (it expired there, or was revoked)", lease.Token())
	case errors.Is(err, etcdstore.ErrSessionExpired):
		return fmt.Sprintf("%s: no renewal succeeded within the TTL", lease.Token())
	case errors.Is(err, etcdstore.ErrSessionClosed), errors.Is(err, etcdstore.ErrReleased):
		return fmt.Sprintf("%s was released", lease.Token())
	default:
		return fmt.Sprintf("%s is no longer current", lease.Token())
	}
}

// runHeld runs argv while lease is held and returns its exit status as an
// *exitStatus. CMD is stopped (SIGTERM to its process group, SIGKILL after
// grace) when the lease ends; a signal that ended ctx is passed on to it
// instead of SIGTERM. If the watchdog dies, CMD's group is killed at once.
func (a *app) runHeld(ctx context.Context, lease *client.Lease, end *sessionEnd, argv, env []string, grace time.Duration) error {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, a.stdout, a.stderr
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// The watchdog leads CMD's process group and is ready before CMD
	// starts, so that CMD cannot signal it away first.
	wd, err := startWatchdog(grace)
	var dogGone <-chan struct{} // nil without a watchdog
	if err == nil {
		cmd.SysProcAttr.Pgid = wd.pgid()
		end.feed(wd)
		dogGone = wd.Done()
		defer wd.fire() // after CMD: what it left in its group goes too
	} else {
		fmt.Fprintf(a.stderr, "fencer acquire: cannot start the watchdog (%v): processes %s starts may outlive fencer if it is killed\n", err, argv[0])
	}
	setParentDeathSignal(cmd.SysProcAttr)
	foreground := terminalForeground(cmd.SysProcAttr)
	exited, err := start(cmd)
	if err != nil {
		code := exitCannotExec
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			code = exitNoCommand
		}
		return &exitStatus{code: code, msg: fmt.Sprintf("cannot run %s: %v", argv[0], err)}
	}
	if foreground {
		defer reclaimTerminal()
	}
	group := cmd.Process.Pid
	if wd != nil {
		group = wd.pgid()
	}
	var waitErr error
	lost := false
	select {
	case waitErr = <-exited:
		// The watchdog may have stopped CMD while fencer was stopped.
		// It says so before it signals: a CMD dead of a signal waits for
		// the word a moment, one that exited by itself does not.
		wait := time.Duration(0)
		if childStatus(waitErr) > 128 {
			wait = time.Second
		}
		lost = lease.Err() != nil || end.passed() || wd.stoppedCMD(wait)
	case <-lease.Done():
		lost = true
		fmt.Fprintf(a.stderr, "fencer acquire: lease lost (%s); stopping %s\n", lossReason(lease), argv[0])
		wd.stopping()
		waitErr = a.stop(argv[0], group, exited, syscall.SIGTERM, grace)
	case <-dogGone:
		_ = syscall.Kill(-group, syscall.SIGKILL)
		waitErr = <-exited
		if wd.Fired() { // it stopped CMD at the session's end, while fencer was stopped
			lost = true
			break
		}
		rctx, cancel := context.WithTimeout(context.Background(), a.conn.timeout)
		defer cancel()
		_ = lease.Release(rctx)
		return &exitStatus{code: exitWatchdogLost, msg: fmt.Sprintf("the watchdog of %s died, so %s and its process group were killed and the lease released", argv[0], argv[0])}
	case <-ctx.Done():
		sig := syscall.SIGTERM
		var se *signalError
		if errors.As(context.Cause(ctx), &se) {
			sig = se.sig
		}
		wd.stopping()
		waitErr = a.stop(argv[0], group, exited, sig, grace)
	}
	if lost {
		return &exitStatus{code: exitLeaseLost, msg: fmt.Sprintf("%s was stopped: the lease was lost while it ran", argv[0])}
	}
	rctx, cancel := context.WithTimeout(context.Background(), a.conn.timeout)
	defer cancel()
	_ = lease.Release(rctx) // the session's Close ends it anyway
	return &exitStatus{code: childStatus(waitErr)}
}

// start starts cmd from a goroutine locked to its OS thread, which waits
// for cmd there, and returns the channel of cmd's Wait error. The
// parent-death signal fires when the thread that forked the child ends,
// not the process: the Go runtime may end an idle thread, so the thread
// that forks CMD stays alive until CMD has exited.
func start(cmd *exec.Cmd) (<-chan error, error) {
	started := make(chan error)
	exited := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		exited <- cmd.Wait()
	}()
	return exited, <-started
}

// stop sends sig to the process group of CMD (named name) and SIGKILL
// after grace, saying so on standard error, and returns CMD's wait error.
func (a *app) stop(name string, group int, exited <-chan error, sig syscall.Signal, grace time.Duration) error {
	_ = syscall.Kill(-group, sig)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case err := <-exited:
		return err
	case <-t.C:
		_ = syscall.Kill(-group, syscall.SIGKILL)
		fmt.Fprintf(a.stderr, "fencer acquire: %s did not exit within --grace %s of %s; sent SIGKILL to its process group\n", name, grace, unix.SignalName(sig))
		return <-exited
	}
}

// childStatus is the exit code that reports CMD's wait error: its own
// exit code, or 128+N if signal N ended it.
func childStatus(err error) int {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		if err != nil {
			return exitError
		}
		return exitOK
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ee.ExitCode()
}

// signalError is the cause of the command context when a signal ended it.
type signalError struct{ sig syscall.Signal }

func (e *signalError) Error() string { return "fencer: " + e.sig.String() }

// notifyContext returns a context that a SIGINT, SIGTERM or SIGHUP ends,
// with a *signalError cause naming the signal, and a function that stops
// listening.
func notifyContext(parent context.Context) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(parent)
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	done := make(chan struct{})
	go func() {
		select {
		case s := <-ch:
			cancel(&signalError{sig: s.(syscall.Signal)})
		case <-done:
		}
	}()
	return ctx, func() {
		signal.Stop(ch)
		close(done)
		cancel(nil)
	}
}
