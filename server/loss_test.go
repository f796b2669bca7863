package server_test

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fencer-dev/fencer/etcdstore"
	"github.com/fencer-dev/fencer/fencertest"
	"github.com/fencer-dev/fencer/internal/holderkey"
	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
	"github.com/fencer-dev/fencer/server"
	"github.com/fencer-dev/fencer/token"
)

// acquireGate stops the Acquire calls of one lease name after their
// acquiring Txn until opened.
type acquireGate struct {
	name    string
	tok     token.Token
	reached chan struct{}
	open    chan struct{}
	once    sync.Once
}

func (g *acquireGate) hook(tok token.Token) {
	if tok.Lease != g.name {
		return
	}
	g.once.Do(func() {
		g.tok = tok
		close(g.reached)
	})
	<-g.open
}

// nextLost reads stream until a LOST event and returns it.
func nextLost(t *testing.T, stream fencerv1.FencerService_WatchLeaseClient) *fencerv1.WatchLeaseResponse {
	t.Helper()
	for {
		ev, err := stream.Recv()
		require.NoError(t, err)
		if ev.GetType() == fencerv1.WatchLeaseResponse_TYPE_LOST {
			return ev
		}
	}
}

func deleteHolder(t *testing.T, st *etcdstore.Store, name string) {
	t.Helper()
	resp, err := st.Client().Delete(fencertest.Context(t), holderkey.Key(st.Prefix(), name))
	require.NoError(t, err)
	require.EqualValues(t, 1, resp.Deleted)
}

// TestLossBetweenAcquisitionAndReplyIsReported deletes a holder key after
// the server's acquiring Txn and before its reply: the session's WatchLease
// stream reports the token lost, whether the stream was open before the
// Acquire call or is opened after its reply, from the token's revision.
func TestLossBetweenAcquisitionAndReplyIsReported(t *testing.T) {
	ctx := fencertest.Context(t)
	st := fencertest.SharedStore(t)
	gates := map[string]*acquireGate{}
	for _, name := range []string{"b", "c"} {
		gates[name] = &acquireGate{name: name, reached: make(chan struct{}), open: make(chan struct{})}
	}
	server.SetAcquiredHook(t, func(tok token.Token) {
		if g := gates[tok.Lease]; g != nil {
			g.hook(tok)
		}
	})
	addr, _ := startServer(t, st)
	rpc := fencerv1.NewFencerServiceClient(dial(t, alice, addr))
	acquire := func(req *fencerv1.AcquireRequest) <-chan *fencerv1.AcquireResponse {
		ch := make(chan *fencerv1.AcquireResponse, 1)
		go func() {
			resp, err := rpc.Acquire(ctx, req)
			if err != nil {
				t.Errorf("acquire %q: %v", req.GetName(), err)
			}
			ch <- resp
		}()
		return ch
	}

	t.Run("stream open before the call", func(t *testing.T) {
		a, err := rpc.Acquire(ctx, &fencerv1.AcquireRequest{Name: "a"})
		require.NoError(t, err)
		tokA, err := token.Parse(a.GetToken())
		require.NoError(t, err)
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		stream, err := rpc.WatchLease(wctx, &fencerv1.WatchLeaseRequest{SessionId: a.GetSessionId(), StartRevision: tokA.Revision})
		require.NoError(t, err)
		synced, err := stream.Recv()
		require.NoError(t, err)
		require.Equal(t, fencerv1.WatchLeaseResponse_TYPE_SYNCED, synced.GetType())

		g := gates["b"]
		reply := acquire(&fencerv1.AcquireRequest{Name: "b", SessionId: a.GetSessionId()})
		<-g.reached
		deleteHolder(t, st, "b")
		close(g.open)
		b := <-reply
		require.NotNil(t, b)
		require.Equal(t, g.tok.String(), b.GetToken())
		lost := nextLost(t, stream)
		require.Equal(t, b.GetToken(), lost.GetToken())
		require.Equal(t, "deleted", lost.GetReason())
	})

	t.Run("stream opened after the reply", func(t *testing.T) {
		g := gates["c"]
		reply := acquire(&fencerv1.AcquireRequest{Name: "c"}) // opens a session
		<-g.reached
		deleteHolder(t, st, "c")
		close(g.open)
		c := <-reply
		require.NotNil(t, c)
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		stream, err := rpc.WatchLease(wctx, &fencerv1.WatchLeaseRequest{SessionId: c.GetSessionId(), StartRevision: g.tok.Revision})
		require.NoError(t, err)
		lost := nextLost(t, stream)
		require.Equal(t, c.GetToken(), lost.GetToken())
	})
}

// TestWatchLeaseRefusesAFutureStartRevision asks for a stream from a
// revision the store has not reached, while the lease hub's shared watch
// runs: it is refused with INVALID_ARGUMENT (cause future_revision, field
// start_revision). Streams from the revision an Acquire returned, and from
// the revision right after it (the store's next, which the shared watch
// may not have reached yet), are accepted and report the lease's loss.
func TestWatchLeaseRefusesAFutureStartRevision(t *testing.T) {
	ctx := fencertest.Context(t)
	st := fencertest.SharedStore(t)
	addr, _ := startServer(t, st)
	rpc := fencerv1.NewFencerServiceClient(dial(t, alice, addr))
	a, err := rpc.Acquire(ctx, &fencerv1.AcquireRequest{Name: "a"})
	require.NoError(t, err)
	tok, err := token.Parse(a.GetToken())
	require.NoError(t, err)

	watch := func(start int64) (fencerv1.FencerService_WatchLeaseClient, *fencerv1.WatchLeaseResponse, error) {
		wctx, cancel := context.WithCancel(ctx)
		t.Cleanup(cancel)
		stream, err := rpc.WatchLease(wctx, &fencerv1.WatchLeaseRequest{SessionId: a.GetSessionId(), StartRevision: start})
		require.NoError(t, err)
		first, err := stream.Recv()
		return stream, first, err
	}
	head, err := st.Client().Get(ctx, "any")
	require.NoError(t, err)
	// The shared etcd may move on meanwhile (other tests' leases expire),
	// so the near future is a hundred revisions ahead, not one.
	for _, start := range []int64{1e12, head.Header.Revision + 100} {
		_, first, err := watch(start)
		require.Error(t, err, "a stream from revision %d (the store is at %d) answered %v", start, head.Header.Revision, first)
		requireEtcdError(t, err, codes.InvalidArgument, fencerv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT.Reason(), "future_revision")
		require.Equal(t, "start_revision", errorInfo(t, err).GetMetadata()["field"])
	}

	var streams []fencerv1.FencerService_WatchLeaseClient
	for _, start := range []int64{tok.Revision, tok.Revision + 1} {
		stream, first, err := watch(start)
		require.NoError(t, err, "from revision %d", start)
		require.Equal(t, fencerv1.WatchLeaseResponse_TYPE_SYNCED, first.GetType())
		require.Equal(t, start, first.GetRevision())
		streams = append(streams, stream)
	}
	_, err = rpc.Release(ctx, &fencerv1.ReleaseRequest{Target: &fencerv1.ReleaseRequest_Token{Token: a.GetToken()}})
	require.NoError(t, err)
	for _, stream := range streams {
		lost := nextLost(t, stream)
		require.Equal(t, a.GetToken(), lost.GetToken())
		require.Equal(t, "deleted", lost.GetReason())
	}
}

// TestSessionEndIsNotReportedAsALoss ends a session holding a lease, by
// the Release RPC and by an operator's etcd lease revoke, many times: the
// session's WatchLease stream ends with SESSION_NOT_FOUND every time, and
// never first reports the lease LOST as if its holder key alone had been
// deleted (the holder key and the session key go in the same revision, and
// the stream must not say which of its two watches saw it first).
func TestSessionEndIsNotReportedAsALoss(t *testing.T) {
	ctx := fencertest.Context(t)
	st := fencertest.SharedStore(t)
	addr, _ := startServer(t, st)
	rpc := fencerv1.NewFencerServiceClient(dial(t, alice, addr))
	for i := range 40 {
		a, err := rpc.Acquire(ctx, &fencerv1.AcquireRequest{Name: "ends"})
		require.NoError(t, err)
		wctx, cancel := context.WithCancel(ctx)
		stream, err := rpc.WatchLease(wctx, &fencerv1.WatchLeaseRequest{SessionId: a.GetSessionId()})
		require.NoError(t, err)
		synced, err := stream.Recv()
		require.NoError(t, err)
		require.Equal(t, fencerv1.WatchLeaseResponse_TYPE_SYNCED, synced.GetType())
		if i%2 == 0 {
			_, err = rpc.Release(ctx, &fencerv1.ReleaseRequest{Target: &fencerv1.ReleaseRequest_SessionId{SessionId: a.GetSessionId()}})
		} else {
			_, err = st.Client().Revoke(ctx, clientv3.LeaseID(a.GetSessionId()))
		}
		require.NoError(t, err)
		for {
			ev, err := stream.Recv()
			if err != nil {
				require.Equal(t, codes.NotFound, status.Code(err), "round %d: %v", i, err)
				break
			}
			require.NotEqual(t, fencerv1.WatchLeaseResponse_TYPE_LOST, ev.GetType(), "round %d: the session's end reported as a loss: %v", i, ev)
		}
		cancel()
	}
}
