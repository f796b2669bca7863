package server

import (
	"context"
	"errors"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
)

// streamGate lets a stream handler block in its stream's Recv or Send on
// its own goroutine, with no goroutine beside it, and still end the stream
// at once with the status it chooses: SHUTTING_DOWN on Shutdown,
// UNAUTHENTICATED when its credentials are withdrawn.
//
// gRPC's Recv returns only on a message, the client's end of the stream,
// or the end of the stream's context, which the handler cannot cancel; a
// Send to a client that reads nothing waits for gRPC's flow control as
// long as the connection lives; and a Recv that fails on the stream's
// context writes CANCELLED as the stream's status itself, before the
// handler can answer. So while the handler is in Recv or Send, end writes
// the stream's status first, through the transport stream, as gRPC does
// when a handler returns: that ends the stream and wakes the call, whose
// own status then goes nowhere, and the handler returns the same error,
// which the server's interceptor translates to the same status for its
// log and metrics. While the handler is elsewhere (an etcd call), end
// only records its error, and the handler returns it at its next call of
// the stream, once that etcd call has run to its end.
//
// Invariants: end writes a status at most once, and only while the
// handler is in a call of the stream; the first end's error wins; a
// message received or sent as end runs is dropped from the handler's
// view (it returns end's error).
type streamGate struct {
	stream statusWriter // the transport stream

	mu     sync.Mutex
	inCall bool  // the handler is in Recv or Send
	err    error // why the stream is to end; nil until then
}

// statusWriter is gRPC's transport stream, as the handler's context holds
// it (grpc.ServerTransportStreamFromContext): WriteStatus sends the
// stream's status and ends it. It is what gRPC calls when a handler
// returns.
type statusWriter interface {
	WriteStatus(*status.Status) error
}

// errNoStatusWriter means the stream's context holds no transport stream
// that can write its status: the handler runs outside grpc-go's own
// server, or under a grpc-go whose transport stream no longer has
// WriteStatus.
var errNoStatusWriter = errors.New("server: the stream's transport stream cannot write its status")

// gate returns the streamGate of the stream whose context is ctx, ended
// by Shutdown and by the end of ctx (which ends before the stream's own
// context when the credentials are withdrawn, see revocable), and a
// function that stops that.
func (s *Server) gate(ctx context.Context) (*streamGate, func(), error) {
	w, ok := grpc.ServerTransportStreamFromContext(ctx).(statusWriter)
	if !ok {
		return nil, nil, errNoStatusWriter
	}
	g := &streamGate{stream: w}
	stopped := context.AfterFunc(s.stopped, func() { g.end(ErrShuttingDown) })
	ended := context.AfterFunc(ctx, func() { g.end(context.Cause(ctx)) })
	return g, func() { stopped(); ended() }, nil
}

// call runs f, a Recv or a Send of the stream, and returns its error, or
// the error end was given, if it was given before f or while it ran (f
// is not run then, or its result is dropped).
func (g *streamGate) call(f func() error) error {
	g.mu.Lock()
	if g.err != nil {
		defer g.mu.Unlock()
		return g.err
	}
	g.inCall = true
	g.mu.Unlock()
	err := f()
	g.mu.Lock()
	defer g.mu.Unlock()
	g.inCall = false
	if g.err != nil {
		return g.err
	}
	return err
}

// end tells the stream to end with err: at once, with err's status, if
// the handler is in a call of the stream, else at its next call. The
// first err wins.
func (g *streamGate) end(err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.err != nil {
		return
	}
	g.err = err
	if g.inCall {
		// The transport stream is gone if this fails; the call wakes
		// either way.
		_ = g.stream.WriteStatus(status.Convert(toStatus(err)))
	}
}

// apart runs f on a goroutine of its own and waits for it to return. A
// stream handler makes its etcd calls through it, so that the depth of
// etcd's client code (and, with an embedded etcd, of etcd's server code)
// grows that short-lived goroutine's stack rather than its own: Go
// shrinks a waiting goroutine's stack only while it uses less than a
// quarter of it, and a handler waiting in gRPC's Recv uses more than a
// quarter of 16 KiB, so a handler that once grew past 8 KiB would keep
// twice that for as long as its stream lasts.
func apart(f func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	<-done
}
