package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"
	"time"

	"github.com/fencer-dev/fencer/client"
)

// runAcquire runs a command while holding a lease, and stops it when the
// lease is lost.
func runAcquire(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("fencer acquire", flag.ContinueOnError)
	var conn connFlags
	conn.register(fs)
	ttl := fs.Duration("ttl", 10*time.Second, "session TTL (whole seconds): the lease vanishes this long after this process stops renewing it")
	wait := fs.Bool("wait", true, "wait while another holder holds the lease (false: fail at once)")
	grace := fs.Duration("grace", 5*time.Second, "after SIGTERM, how long CMD has before SIGKILL")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: fencer acquire [flags] NAME -- CMD [ARGS...]\n\n"+
			"Runs CMD while lease NAME is held, with the token in $FENCER_TOKEN\n"+
			"(and the lease name in $FENCER_LEASE). When the lease is lost, CMD gets\n"+
			"SIGTERM, then SIGKILL after --grace. Exits with CMD's exit code\n"+
			"(128+signal if it was killed by a signal).")
		fs.PrintDefaults()
	}
	if code := parseFlags(fs, args, stderr); code >= 0 {
		return code
	}
	rest := fs.Args()
	if len(rest) < 3 || rest[1] != "--" {
		fs.Usage()
		return 2
	}
	name, argv := rest[0], rest[2:]
	cc, err := conn.dial()
	if err != nil {
		fmt.Fprintln(stderr, "fencer acquire:", err)
		return 1
	}
	defer cc.Close()
	sess, err := client.New(cc).NewSession(client.WithTTL(*ttl))
	if err != nil {
		fmt.Fprintln(stderr, "fencer acquire:", err)
		return 2
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), conn.timeout)
		defer cancel()
		_ = sess.Close(cctx)
	}()
	var lease *client.Lease
	if *wait {
		lease, err = sess.Acquire(ctx, name)
	} else {
		lease, err = sess.TryAcquire(ctx, name)
	}
	if err != nil {
		fmt.Fprintln(stderr, "fencer acquire:", err)
		return 1
	}
	fmt.Fprintf(stderr, "fencer acquire: holding %s\n", lease.Token())
	return runHeld(ctx, lease, argv, *grace, stdout, stderr)
}

// runHeld runs argv while lease is held and returns its exit code. CMD is
// stopped (SIGTERM to its process group, SIGKILL after grace) when the lease
// ends or ctx ends.
func runHeld(ctx context.Context, lease *client.Lease, argv []string, grace time.Duration, stdout, stderr io.Writer) int {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, stdout, stderr
	cmd.Env = append(os.Environ(), "FENCER_TOKEN="+lease.Token().String(), "FENCER_LEASE="+lease.Token().Lease)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(stderr, "fencer acquire:", err)
		return 127
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	var err error
	select {
	case err = <-exited:
	case <-lease.Done():
		fmt.Fprintf(stderr, "fencer acquire: lease lost (%v); stopping %s\n", lease.Err(), argv[0])
		err = stop(cmd, exited, grace)
	case <-ctx.Done():
		err = stop(cmd, exited, grace)
	}
	return exitCode(err)
}

// stop sends SIGTERM to cmd's process group and SIGKILL after grace, and
// returns cmd's wait error.
func stop(cmd *exec.Cmd, exited <-chan error, grace time.Duration) error {
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case err := <-exited:
		return err
	case <-t.C:
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		return <-exited
	}
}

func exitCode(err error) int {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		if err != nil {
			return 1
		}
		return 0
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ee.ExitCode()
}
