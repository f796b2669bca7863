package client

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
	"github.com/fencer-dev/fencer/token"
)

// putServer is a hand-written FencerServiceClient for the exact timing of
// putBatcher's tests: each Put and PutMany is handed to the test on calls
// and waits for the test's answer.
type putServer struct {
	fencerv1.FencerServiceClient // nil: any other method panics

	calls chan *putRPC
}

// putRPC is one Put (many nil) or PutMany call the fake received.
type putRPC struct {
	ctx    context.Context
	one    *fencerv1.PutRequest
	many   *fencerv1.PutManyRequest
	answer chan putAnswer
}

type putAnswer struct {
	one  *fencerv1.PutResponse
	many *fencerv1.PutManyResponse
	err  error
}

func newPutServer() *putServer { return &putServer{calls: make(chan *putRPC, 16)} }

func (s *putServer) Put(ctx context.Context, req *fencerv1.PutRequest, _ ...grpc.CallOption) (*fencerv1.PutResponse, error) {
	c := &putRPC{ctx: ctx, one: req, answer: make(chan putAnswer, 1)}
	s.calls <- c
	select {
	case a := <-c.answer:
		return a.one, a.err
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
}

func (s *putServer) PutMany(ctx context.Context, req *fencerv1.PutManyRequest, _ ...grpc.CallOption) (*fencerv1.PutManyResponse, error) {
	c := &putRPC{ctx: ctx, many: req, answer: make(chan putAnswer, 1)}
	s.calls <- c
	select {
	case a := <-c.answer:
		return a.many, a.err
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
}

// next returns the next call the fake received.
func (s *putServer) next(t *testing.T) *putRPC {
	t.Helper()
	select {
	case c := <-s.calls:
		return c
	case <-time.After(5 * time.Second):
		t.Fatal("no call reached the server")
		return nil
	}
}

// none fails if a call reaches the fake within a short while.
func (s *putServer) none(t *testing.T) {
	t.Helper()
	select {
	case c := <-s.calls:
		t.Fatalf("unexpected call: %v %v", c.one, c.many)
	case <-time.After(50 * time.Millisecond):
	}
}

// putOutcome is what one Client.Put returned.
type putOutcome struct {
	rev int64
	err error
}

// goPut starts c.Put of key with tok and returns where its outcome comes.
func goPut(ctx context.Context, c *Client, tok token.Token, key string) <-chan putOutcome {
	out := make(chan putOutcome, 1)
	go func() {
		rev, err := c.Put(ctx, tok, key, []byte("v"))
		out <- putOutcome{rev, err}
	}()
	return out
}

func outcome(t *testing.T, ch <-chan putOutcome) putOutcome {
	t.Helper()
	select {
	case o := <-ch:
		return o
	case <-time.After(5 * time.Second):
		t.Fatal("Put did not return")
		return putOutcome{}
	}
}

// waitQueued waits until n puts are queued in c.
func waitQueued(t *testing.T, c *Client, n int) {
	t.Helper()
	require.Eventually(t, func() bool {
		c.puts.mu.Lock()
		defer c.puts.mu.Unlock()
		return len(c.puts.queue) == n
	}, 5*time.Second, time.Millisecond)
}

// waitIdle waits until c has no call in flight.
func waitIdle(t *testing.T, c *Client) {
	t.Helper()
	require.Eventually(t, func() bool {
		c.puts.mu.Lock()
		defer c.puts.mu.Unlock()
		return c.puts.inFlight == 0
	}, 5*time.Second, time.Millisecond)
}

// errorResult is the PutResult of a put that failed with err.
func errorResult(t *testing.T, err error) *fencerv1.PutResult {
	t.Helper()
	b, merr := proto.Marshal(status.Convert(err).Proto())
	require.NoError(t, merr)
	return &fencerv1.PutResult{Result: &fencerv1.PutResult_Error{Error: b}}
}

func revisionResult(rev int64) *fencerv1.PutResult {
	return &fencerv1.PutResult{Result: &fencerv1.PutResult_Revision{Revision: rev}}
}

// TestPutsCoalesce: while a call is in flight, further Puts queue and
// leave together as one PutMany once it ends; each gets its own result,
// a stale one its own *token.StaleError while the others succeed; a lone
// Put is sent at once as a Put.
func TestPutsCoalesce(t *testing.T) {
	srv := newPutServer()
	c := &Client{rpc: srv, clock: realClock{}, puts: &putBatcher{rpc: srv}}
	ctx := context.Background()
	tok := token.Token{Lease: "jobs", Epoch: 2, Revision: 9}
	old := token.Token{Lease: "jobs", Epoch: 1, Revision: 5}

	first := goPut(ctx, c, tok, "a")
	call := srv.next(t)
	require.NotNil(t, call.one, "the first put is sent at once, as a Put")
	third := goPut(ctx, c, tok, "c")
	waitQueued(t, c, 1)
	stale := goPut(ctx, c, old, "d")
	waitQueued(t, c, 2)
	fourth := goPut(ctx, c, tok, "e")
	waitQueued(t, c, 3)
	srv.none(t)

	call.answer <- putAnswer{one: &fencerv1.PutResponse{Revision: 10}}
	require.Equal(t, putOutcome{rev: 10}, outcome(t, first))
	many := srv.next(t)
	require.NotNil(t, many.many, "the queued puts leave as one PutMany")
	keys := []string{}
	for _, p := range many.many.GetPuts() {
		keys = append(keys, p.GetKey())
	}
	require.Equal(t, []string{"c", "d", "e"}, keys, "in the order they came")
	staleErr := &token.StaleError{Token: old, Newer: tok}
	st, err := status.New(codes.FailedPrecondition, "stale").WithDetails(&errdetails.ErrorInfo{Reason: fencerv1.ErrorReason_ERROR_REASON_STALE_TOKEN.Reason(), Domain: fencerv1.ErrorDomain, Metadata: map[string]string{"token": old.String(), "newer_token": tok.String()}})
	require.NoError(t, err)
	many.answer <- putAnswer{many: &fencerv1.PutManyResponse{Results: []*fencerv1.PutResult{revisionResult(11), errorResult(t, st.Err()), revisionResult(11)}}}
	require.Equal(t, putOutcome{rev: 11}, outcome(t, third))
	require.Equal(t, putOutcome{rev: 11}, outcome(t, fourth))
	o := outcome(t, stale)
	require.ErrorIs(t, o.err, token.ErrStale)
	var got *token.StaleError
	require.ErrorAs(t, o.err, &got)
	require.Equal(t, staleErr, got, "the put's own error, typed as a Put's")

	// Nothing in flight: a lone Put goes at once, as a Put.
	waitIdle(t, c)
	lone := goPut(ctx, c, tok, "f")
	call = srv.next(t)
	require.NotNil(t, call.one)
	call.answer <- putAnswer{one: &fencerv1.PutResponse{Revision: 13}}
	require.Equal(t, putOutcome{rev: 13}, outcome(t, lone))
	waitIdle(t, c)
}

// TestPutCancelledAlone: a queued Put whose context ends returns at once
// with the context's error and is never sent; one whose context ends
// while its PutMany is in flight returns at once, and the others of that
// PutMany still get their results.
func TestPutCancelledAlone(t *testing.T) {
	srv := newPutServer()
	c := &Client{rpc: srv, clock: realClock{}, puts: &putBatcher{rpc: srv}}
	ctx := context.Background()
	tok := token.Token{Lease: "jobs", Epoch: 2, Revision: 9}

	first := goPut(ctx, c, tok, "a")
	call := srv.next(t)
	qctx, qcancel := context.WithCancel(ctx)
	gone := goPut(qctx, c, tok, "gone")
	waitQueued(t, c, 1)
	kept := goPut(ctx, c, tok, "kept")
	waitQueued(t, c, 2)
	qcancel()
	o := outcome(t, gone)
	require.Equal(t, codes.Canceled, status.Code(o.err), "%v", o.err)
	waitQueued(t, c, 1)

	call.answer <- putAnswer{one: &fencerv1.PutResponse{Revision: 10}}
	outcome(t, first)
	many := srv.next(t)
	require.Len(t, many.many.GetPuts(), 1, "the cancelled put was never sent")
	require.Equal(t, "kept", many.many.GetPuts()[0].GetKey())
	many.answer <- putAnswer{many: &fencerv1.PutManyResponse{Results: []*fencerv1.PutResult{revisionResult(11)}}}
	require.Equal(t, putOutcome{rev: 11}, outcome(t, kept))

	// Cancelled in flight: two puts share a PutMany, one gives up.
	waitIdle(t, c)
	third := goPut(ctx, c, tok, "third")
	call = srv.next(t)
	require.NotNil(t, call.one)
	fctx, fcancel := context.WithCancel(ctx)
	quitter := goPut(fctx, c, tok, "quitter")
	waitQueued(t, c, 1)
	stayer := goPut(ctx, c, tok, "stayer")
	waitQueued(t, c, 2)
	call.answer <- putAnswer{one: &fencerv1.PutResponse{Revision: 12}}
	outcome(t, third)
	many = srv.next(t)
	require.Len(t, many.many.GetPuts(), 2)
	fcancel()
	o = outcome(t, quitter)
	require.Equal(t, codes.Canceled, status.Code(o.err), "returns at once, its PutMany still in flight: %v", o.err)
	require.NoError(t, many.ctx.Err(), "the PutMany goes on for the put that stays")
	many.answer <- putAnswer{many: &fencerv1.PutManyResponse{Results: []*fencerv1.PutResult{revisionResult(13), revisionResult(13)}}}
	require.Equal(t, putOutcome{rev: 13}, outcome(t, stayer))
	waitIdle(t, c)
}

// TestPutManyCallError: a PutMany that fails as a whole fails each of its
// puts with the call's error, mapped as a Put's; a server without PutMany
// (UNIMPLEMENTED) gets each put as a Put of its own, and no PutMany again.
func TestPutManyCallError(t *testing.T) {
	srv := newPutServer()
	c := &Client{rpc: srv, clock: realClock{}, puts: &putBatcher{rpc: srv}}
	ctx := context.Background()
	tok := token.Token{Lease: "jobs", Epoch: 2, Revision: 9}

	// One in flight, two queued, for each round.
	round := func(answer putAnswer) []<-chan putOutcome {
		waitIdle(t, c)
		a := goPut(ctx, c, tok, "a")
		call := srv.next(t)
		queued := []<-chan putOutcome{goPut(ctx, c, tok, "c"), goPut(ctx, c, tok, "d")}
		waitQueued(t, c, 2)
		call.answer <- putAnswer{one: &fencerv1.PutResponse{Revision: 1}}
		outcome(t, a)
		many := srv.next(t)
		require.NotNil(t, many.many)
		many.answer <- answer
		return queued
	}

	for _, q := range round(putAnswer{err: status.Error(codes.Unavailable, "etcd unreachable")}) {
		o := outcome(t, q)
		require.Equal(t, codes.Unavailable, status.Code(o.err), "%v", o.err)
	}

	queued := round(putAnswer{err: status.Error(codes.Unimplemented, "unknown method PutMany")})
	for range queued {
		call := srv.next(t)
		require.NotNil(t, call.one, "each put again, alone")
		call.answer <- putAnswer{one: &fencerv1.PutResponse{Revision: 7}}
	}
	for _, q := range queued {
		require.Equal(t, putOutcome{rev: 7}, outcome(t, q))
	}
	require.True(t, c.puts.alone.Load())
	var wg sync.WaitGroup
	for range 3 {
		out := goPut(ctx, c, tok, "x")
		wg.Go(func() { outcome(t, out) })
	}
	for range 3 {
		call := srv.next(t)
		require.NotNil(t, call.one, "no PutMany once the server lacks it")
		call.answer <- putAnswer{one: &fencerv1.PutResponse{Revision: 8}}
	}
	wg.Wait()
}

// TestPutWithMetadataGoesAlone: a Put whose context carries outgoing
// metadata is sent as a Put of its own even while a call is in flight.
func TestPutWithMetadataGoesAlone(t *testing.T) {
	srv := newPutServer()
	c := &Client{rpc: srv, clock: realClock{}, puts: &putBatcher{rpc: srv}}
	ctx := context.Background()
	tok := token.Token{Lease: "jobs", Epoch: 2, Revision: 9}
	first := goPut(ctx, c, tok, "a")
	inFlight := srv.next(t)
	own := goPut(metadata.AppendToOutgoingContext(ctx, "x-trace", "1"), c, tok, "traced")
	call := srv.next(t)
	require.NotNil(t, call.one)
	require.Equal(t, "traced", call.one.GetKey())
	call.answer <- putAnswer{one: &fencerv1.PutResponse{Revision: 3}}
	require.Equal(t, putOutcome{rev: 3}, outcome(t, own))
	inFlight.answer <- putAnswer{one: &fencerv1.PutResponse{Revision: 4}}
	outcome(t, first)
}
