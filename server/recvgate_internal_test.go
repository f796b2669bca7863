package server

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
)

// fakeStream records the statuses a recvGate writes.
type fakeStream struct{ written []*status.Status }

func (f *fakeStream) WriteStatus(st *status.Status) error {
	f.written = append(f.written, st)
	return nil
}

// TestRecvGate pins the races a KeepAlive stream's recvGate must survive:
// it writes the stream's status only while the handler waits in Recv, the
// first end wins, and a message that arrives with an end is dropped.
func TestRecvGate(t *testing.T) {
	msg := &fencerv1.KeepAliveRequest{SessionId: 7}
	errRevoked := errors.New("credentials withdrawn")
	newGate := func() (*recvGate, *fakeStream) {
		f := &fakeStream{}
		return &recvGate{stream: f}, f
	}

	t.Run("a message passes", func(t *testing.T) {
		g, f := newGate()
		got, err := g.recv(func() (*fencerv1.KeepAliveRequest, error) { return msg, nil })
		require.NoError(t, err)
		require.Same(t, msg, got)
		require.Empty(t, f.written)
	})
	t.Run("end before recv: Recv is not called", func(t *testing.T) {
		g, f := newGate()
		g.end(ErrShuttingDown)
		_, err := g.recv(func() (*fencerv1.KeepAliveRequest, error) {
			t.Fatal("Recv called after end")
			return nil, nil
		})
		require.ErrorIs(t, err, ErrShuttingDown)
		require.Empty(t, f.written, "no status written while the handler was not in Recv")
	})
	t.Run("end during Recv writes the status and drops the message", func(t *testing.T) {
		g, f := newGate()
		_, err := g.recv(func() (*fencerv1.KeepAliveRequest, error) {
			g.end(ErrShuttingDown) // Shutdown while the handler waits
			return msg, nil        // and a message arrives with it
		})
		require.ErrorIs(t, err, ErrShuttingDown)
		require.Len(t, f.written, 1)
		require.Equal(t, codes.Unavailable, f.written[0].Code())
	})
	t.Run("end while the handler is elsewhere, then recv", func(t *testing.T) {
		g, f := newGate()
		_, err := g.recv(func() (*fencerv1.KeepAliveRequest, error) { return msg, nil })
		require.NoError(t, err)
		g.end(errRevoked) // during the handler's etcd call
		require.Empty(t, f.written)
		_, err = g.recv(func() (*fencerv1.KeepAliveRequest, error) {
			t.Fatal("Recv called after end")
			return nil, nil
		})
		require.ErrorIs(t, err, errRevoked)
		require.Empty(t, f.written)
	})
	t.Run("the first end wins", func(t *testing.T) {
		g, f := newGate()
		_, err := g.recv(func() (*fencerv1.KeepAliveRequest, error) {
			g.end(ErrShuttingDown)
			g.end(errRevoked)
			return nil, errors.New("stream ended")
		})
		require.ErrorIs(t, err, ErrShuttingDown)
		require.Len(t, f.written, 1, "one status written")
	})
	t.Run("end after the handler returned writes nothing", func(t *testing.T) {
		g, f := newGate()
		_, err := g.recv(func() (*fencerv1.KeepAliveRequest, error) { return nil, errors.New("client closed") })
		require.Error(t, err)
		g.end(ErrShuttingDown)
		require.Empty(t, f.written)
	})
}
