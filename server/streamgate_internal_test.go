package server

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// fakeStream records the statuses a streamGate writes; done is closed at
// the first, as the transport ends the stream and wakes its held calls.
type fakeStream struct {
	written []*status.Status
	done    chan struct{}
}

func (f *fakeStream) WriteStatus(st *status.Status) error {
	if len(f.written) == 0 {
		close(f.done)
	}
	f.written = append(f.written, st)
	return nil
}

// TestStreamGate pins the races a stream's streamGate must survive: it
// writes the stream's status only while the handler is in a call of the
// stream (Recv, or a Send its client does not read), the first end wins,
// and a message that passes with an end is dropped.
func TestStreamGate(t *testing.T) {
	errRevoked := errors.New("credentials withdrawn")
	newGate := func() (*streamGate, *fakeStream) {
		f := &fakeStream{done: make(chan struct{})}
		return &streamGate{stream: f}, f
	}
	notCalled := func() error {
		t.Fatal("the stream called after end")
		return nil
	}

	t.Run("a call passes", func(t *testing.T) {
		g, f := newGate()
		require.NoError(t, g.call(func() error { return nil }))
		require.Empty(t, f.written)
	})
	t.Run("end before a call: the call is not made", func(t *testing.T) {
		g, f := newGate()
		g.end(ErrShuttingDown)
		require.ErrorIs(t, g.call(notCalled), ErrShuttingDown)
		require.Empty(t, f.written, "no status written while the handler was not in a call")
	})
	t.Run("end during Recv writes the status and drops the message", func(t *testing.T) {
		g, f := newGate()
		err := g.call(func() error {
			g.end(ErrShuttingDown) // Shutdown while the handler waits
			return nil             // and a message arrives with it
		})
		require.ErrorIs(t, err, ErrShuttingDown)
		require.Len(t, f.written, 1)
		require.Equal(t, codes.Unavailable, f.written[0].Code())
	})
	t.Run("end during a Send held by flow control writes the status", func(t *testing.T) {
		g, f := newGate()
		held := make(chan struct{})
		sent := make(chan error, 1)
		go func() {
			sent <- g.call(func() error {
				close(held)
				<-f.done // the client reads nothing: only the stream's end wakes Send
				return errors.New("stream done")
			})
		}()
		<-held
		g.end(errRevoked)
		require.ErrorIs(t, <-sent, errRevoked)
		require.Len(t, f.written, 1)
		require.Equal(t, status.Code(toStatus(errRevoked)), f.written[0].Code())
	})
	t.Run("end while the handler is elsewhere, then a call", func(t *testing.T) {
		g, f := newGate()
		require.NoError(t, g.call(func() error { return nil }))
		g.end(errRevoked) // during the handler's etcd call
		require.Empty(t, f.written)
		require.ErrorIs(t, g.call(notCalled), errRevoked)
		require.Empty(t, f.written)
	})
	t.Run("the first end wins", func(t *testing.T) {
		g, f := newGate()
		err := g.call(func() error {
			g.end(ErrShuttingDown)
			g.end(errRevoked)
			return errors.New("stream ended")
		})
		require.ErrorIs(t, err, ErrShuttingDown)
		require.Len(t, f.written, 1, "one status written")
	})
	t.Run("end after the handler returned writes nothing", func(t *testing.T) {
		g, f := newGate()
		require.Error(t, g.call(func() error { return errors.New("client closed") }))
		g.end(ErrShuttingDown)
		require.Empty(t, f.written)
	})
}
