package server

import (
	"context"
	"errors"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
)

// recvGate lets a KeepAlive handler wait in its stream's Recv on its own
// goroutine, with no goroutine reading the stream beside it, and still end
// the stream with the status it chooses: SHUTTING_DOWN on Shutdown,
// UNAUTHENTICATED when its credentials are withdrawn.
//
// gRPC's Recv returns only on a message, the client's end of the stream,
// or the end of the stream's context, which the handler cannot cancel; and
// a Recv that fails on that context writes CANCELLED as the stream's
// status itself, before the handler can answer. So while the handler is
// in Recv, end writes the stream's status first, through the transport
// stream, as gRPC does when a handler returns: that ends the stream and
// wakes Recv, whose own status then goes nowhere, and the handler returns
// the same error, which the server's interceptor translates to the same
// status for its log and metrics. While the handler is elsewhere (an etcd
// call, a Send), end only records its error, and the handler returns it at
// its next recv, once that call has run to its end.
type recvGate struct {
	stream statusWriter // the transport stream

	mu      sync.Mutex
	waiting bool  // the handler is in Recv
	err     error // why the stream is to end; nil until then
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
var errNoStatusWriter = errors.New("server: the KeepAlive stream's transport stream cannot write its status")

// newRecvGate returns the recvGate of the stream whose context is ctx.
func newRecvGate(ctx context.Context) (*recvGate, error) {
	w, ok := grpc.ServerTransportStreamFromContext(ctx).(statusWriter)
	if !ok {
		return nil, errNoStatusWriter
	}
	return &recvGate{stream: w}, nil
}

// recv returns recv's result, or the error end was given, if it was given
// before recv or while it ran (a message received meanwhile is dropped:
// the stream ends).
func (g *recvGate) recv(recv func() (*fencerv1.KeepAliveRequest, error)) (*fencerv1.KeepAliveRequest, error) {
	g.mu.Lock()
	if g.err != nil {
		defer g.mu.Unlock()
		return nil, g.err
	}
	g.waiting = true
	g.mu.Unlock()
	req, err := recv()
	g.mu.Lock()
	defer g.mu.Unlock()
	g.waiting = false
	if g.err != nil {
		return nil, g.err
	}
	return req, err
}

// end tells the stream to end with err: at once, with err's status, if
// the handler is in Recv, else at its next recv. The first err wins.
func (g *recvGate) end(err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.err != nil {
		return
	}
	g.err = err
	if g.waiting {
		// The transport stream is gone if this fails; Recv wakes
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
