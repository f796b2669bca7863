package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/spf13/pflag"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// defaultReconnectTimeout is how long acquire and watch retry a server
// they cannot reach, unless --reconnect-timeout says otherwise.
const defaultReconnectTimeout = time.Minute

// reconnectFlag adds --reconnect-timeout, read from
// $FENCER_RECONNECT_TIMEOUT, to fs.
func reconnectFlag(fs *pflag.FlagSet, d *time.Duration) {
	fs.DurationVar(d, "reconnect-timeout", defaultReconnectTimeout, "give up, with exit code 7, once the server has been unreachable for this long in a row (0: retry for ever)")
	envFlag(fs, "reconnect-timeout", "FENCER_RECONNECT_TIMEOUT")
}

// checkReconnect refuses a negative --reconnect-timeout.
func checkReconnect(d time.Duration) error {
	if d < 0 {
		return usagef("--reconnect-timeout %s is negative: give how long to retry an unreachable server, or 0 to retry for ever", d)
	}
	return nil
}

// outage follows the server's reachability for a command that retries it
// (acquire's wait, watch). The first failure of an outage is said once on
// standard error; when an outage has lasted bound (if not 0), the context
// that newOutage returned ends, with the exit-7 error as its cause. Any
// answer from the server ends the outage. Its methods are safe for
// concurrent use.
type outage struct {
	stderr   io.Writer
	prefix   string             // "fencer watch", before its message
	bound    time.Duration      // 0: retry for ever
	describe func(error) string // what fencer says about an error
	cancel   context.CancelCauseFunc

	mu    sync.Mutex
	since time.Time   // when the outage began; zero while the server answers
	timer *time.Timer // ends the context at since+bound
}

// newOutage returns an outage and a context derived from ctx that ends
// when an outage outlasts bound.
func newOutage(ctx context.Context, a *app, prefix string, bound time.Duration) (*outage, context.Context) {
	octx, cancel := context.WithCancelCause(ctx)
	return &outage{stderr: a.stderr, prefix: prefix, bound: bound, cancel: cancel,
		describe: func(err error) string { return describe(err, a.conn.server, a.conn.secure()).msg }}, octx
}

// failed records that a call failed with err, which the command retries:
// the first failure of an outage is said on standard error and starts
// the outage's clock.
func (o *outage) failed(err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.since.IsZero() {
		return
	}
	o.since = time.Now()
	msg := o.describe(err)
	fmt.Fprintf(o.stderr, "%s: %s; retrying\n", o.prefix, msg)
	if o.bound > 0 {
		gaveUp := &exitStatus{code: exitUnavailable, msg: fmt.Sprintf("%s; gave up after --reconnect-timeout %s", msg, o.bound)}
		o.timer = time.AfterFunc(o.bound, func() { o.cancel(gaveUp) })
	}
}

// answered records that the server answered: the outage, if any, is over.
func (o *outage) answered() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.timer != nil {
		o.timer.Stop()
		o.timer = nil
	}
	o.since = time.Time{}
}

// began returns when the current outage began, or the zero time while the
// server answers.
func (o *outage) began() time.Time {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.since
}

// stop releases the outage's timer and its context.
func (o *outage) stop() {
	o.answered()
	o.cancel(nil)
}

// gaveUp returns the exit-7 error that ended ctx (as newOutage returned
// it) when an outage outlasted its bound, or nil.
func gaveUp(ctx context.Context) error {
	var exit *exitStatus
	if errors.As(context.Cause(ctx), &exit) {
		return exit
	}
	return nil
}

// unavailable reports whether err is one a retrying command retries: the
// server, or its etcd, could not be reached.
func unavailable(err error) bool { return status.Code(err) == codes.Unavailable }

// outageConn is a connection whose streams report to an outage: a stream
// that fails unavailable starts or continues one, a message received ends
// it. watch uses it to see the reconnects that the client's WatchSession
// makes on its own.
type outageConn struct {
	grpc.ClientConnInterface
	o *outage
}

// NewStream opens a stream through the connection, reporting a failure.
func (c outageConn) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	s, err := c.ClientConnInterface.NewStream(ctx, desc, method, opts...)
	if err != nil {
		if unavailable(err) {
			c.o.failed(err)
		}
		return nil, err
	}
	return outageStream{ClientStream: s, o: c.o}, nil
}

// outageStream is a stream of an outageConn.
type outageStream struct {
	grpc.ClientStream
	o *outage
}

// RecvMsg receives a message, reporting the outcome to the outage.
func (s outageStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	switch {
	case err == nil:
		s.o.answered()
	case unavailable(err):
		s.o.failed(err)
	}
	return err
}
