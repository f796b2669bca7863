package client

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
)

// Limits of the PutMany calls a Client sends.
const (
	// maxPutMany is the most puts of one PutMany: half the server's
	// limit (server.MaxPutMany, 128), and the etcd store's default batch.
	maxPutMany = 64
	// maxPutManyBytes bounds the keys and values of one PutMany, half
	// the server's request limit (server.MaxRequestBytes, 2 MiB), so
	// that the encoding's overhead always fits.
	maxPutManyBytes = 1 << 20
	// maxPutsInFlight is how many Put or PutMany calls a Client has in
	// flight at once before further puts wait to leave together: one, as
	// the etcd store keeps one shared Txn in flight. The server commits a
	// PutMany's puts in one shared Txn, so each call costs one Txn; two
	// in flight halved the calls' size, and cost the server a fifth more
	// CPU time per put with 16 writers.
	maxPutsInFlight = 1
)

// putBatcher coalesces a Client's concurrent Puts: a put that finds fewer
// than maxPutsInFlight calls in flight is sent at once as a Put of its own,
// so that a lone writer waits for nothing (and a server without PutMany
// serves it); puts that arrive while maxPutsInFlight calls are in flight
// queue, and leave together as one PutMany when a call ends.
//
// Invariants, under mu: inFlight counts the calls sent and not yet
// answered, including the one the sender goroutine is about to send; a
// put is in queue only while inFlight == maxPutsInFlight, or while a
// sender that ended a call takes the queue; every put in queue is
// answered exactly once (done closed), by the sender that took it, or by
// its own caller's context ending first (then it is removed from queue
// and never sent).
type putBatcher struct {
	rpc fencerv1.FencerServiceClient

	// alone is set when the server answered a PutMany with UNIMPLEMENTED
	// (a server older than PutMany): every put is then sent on its own.
	alone atomic.Bool

	mu       sync.Mutex
	inFlight int
	queue    []*putCall // puts waiting to leave together, oldest first
}

// putCall is one queued put and, once done is closed, its outcome.
type putCall struct {
	ctx  context.Context
	req  *fencerv1.PutRequest
	size int

	done chan struct{}
	rev  int64
	err  error // the library's error (fromStatus)
}

// put runs req: at once if fewer than maxPutsInFlight calls are in flight,
// else in the next PutMany. A put whose context carries outgoing gRPC
// metadata (headers the caller set for this call) is always sent on its
// own, since a PutMany carries one call's metadata. A put whose context
// ends while it is queued is never sent and returns the context's error
// as a Put would; one whose context ends while its PutMany is in flight
// returns the same error at once, and may or may not commit, as with a
// Put that the caller gave up on. The errors are Put's.
func (b *putBatcher) put(ctx context.Context, req *fencerv1.PutRequest) (int64, error) {
	if _, ok := metadata.FromOutgoingContext(ctx); ok || b.alone.Load() {
		return b.send(ctx, req)
	}
	b.mu.Lock()
	if b.inFlight < maxPutsInFlight {
		b.inFlight++
		b.mu.Unlock()
		rev, err := b.send(ctx, req)
		b.ended()
		return rev, err
	}
	c := &putCall{ctx: ctx, req: req, size: len(req.GetKey()) + len(req.GetValue()), done: make(chan struct{})}
	b.queue = append(b.queue, c)
	b.mu.Unlock()
	select {
	case <-c.done:
		return c.rev, c.err
	case <-ctx.Done():
		b.mu.Lock()
		if i := slices.Index(b.queue, c); i >= 0 {
			b.queue = slices.Delete(b.queue, i, i+1)
		}
		b.mu.Unlock()
		select {
		case <-c.done: // taken and answered before it could leave
			return c.rev, c.err
		default:
			return 0, contextError(ctx)
		}
	}
}

// send runs req as a Put of its own.
func (b *putBatcher) send(ctx context.Context, req *fencerv1.PutRequest) (int64, error) {
	resp, err := b.rpc.Put(ctx, req)
	if err != nil {
		return 0, fromStatus(err)
	}
	return resp.GetRevision(), nil
}

// ended records that a call ended, and sends the queued puts as PutMany
// calls, one after another, in a goroutine that keeps the call's place in
// flight; with none queued, the place is free.
func (b *putBatcher) ended() {
	batch := b.take()
	if batch == nil {
		return
	}
	go func() {
		for ; batch != nil; batch = b.take() {
			b.many(batch)
		}
	}()
}

// take removes the next batch from the queue: the oldest puts, up to
// maxPutMany of them and maxPutManyBytes. Puts whose context has ended
// leave the queue unsent, with the context's error. It returns nil, and
// frees a place in flight, when the queue is empty.
func (b *putBatcher) take() []*putCall {
	b.mu.Lock()
	defer b.mu.Unlock()
	var batch []*putCall
	rest, size := b.queue[:0], 0
	for _, c := range b.queue {
		switch {
		case c.ctx.Err() != nil:
			c.err = contextError(c.ctx) // never sent: it writes nothing
			close(c.done)
		case len(batch) < maxPutMany && (batch == nil || size+c.size <= maxPutManyBytes):
			batch, size = append(batch, c), size+c.size
		default:
			rest = append(rest, c)
		}
	}
	clear(b.queue[len(rest):])
	b.queue = rest
	if batch == nil {
		b.inFlight--
	}
	return batch
}

// many sends batch as one PutMany and hands each put its own result. The
// call is cancelled once every put's context has ended, and carries the
// latest of their deadlines when each has one. A server without PutMany
// gets each put as a Put of its own, and no PutMany again.
func (b *putBatcher) many(batch []*putCall) {
	ctx, cancel := batchContext(batch)
	defer cancel()
	req := &fencerv1.PutManyRequest{Puts: make([]*fencerv1.PutRequest, len(batch))}
	for i, c := range batch {
		req.Puts[i] = c.req
	}
	resp, err := b.rpc.PutMany(ctx, req)
	if status.Code(err) == codes.Unimplemented {
		b.alone.Store(true)
		var wg sync.WaitGroup
		for _, c := range batch {
			wg.Go(func() {
				c.rev, c.err = b.send(c.ctx, c.req)
				close(c.done)
			})
		}
		wg.Wait()
		return
	}
	if err == nil && len(resp.GetResults()) != len(batch) {
		err = status.Errorf(codes.Internal, "client: put many: server sent %d results for %d puts", len(resp.GetResults()), len(batch))
	}
	for i, c := range batch {
		switch {
		case err != nil:
			c.err = fromStatus(err)
		default:
			c.rev, c.err = putResult(resp.GetResults()[i])
		}
		close(c.done)
	}
}

// putResult is the revision, or the library's error, of one put of a
// PutMany.
func putResult(r *fencerv1.PutResult) (int64, error) {
	b, failed := r.GetResult().(*fencerv1.PutResult_Error)
	if !failed {
		return r.GetRevision(), nil
	}
	var st spb.Status
	if err := proto.Unmarshal(b.Error, &st); err != nil {
		return 0, fromStatus(status.Errorf(codes.Internal, "client: put many: server sent an error that does not decode: %v", err))
	}
	if st.GetCode() == int32(codes.OK) {
		return 0, fromStatus(status.Error(codes.Internal, "client: put many: server sent an error with code OK"))
	}
	return 0, fromStatus(status.FromProto(&st).Err())
}

// batchContext returns the context of a PutMany of batch: cancelled once
// every put's context has ended, with the latest of their deadlines if
// each has one. It carries none of their values.
func batchContext(batch []*putCall) (context.Context, context.CancelFunc) {
	base, cancelBase := context.WithCancel(context.Background())
	ctx, cancelDeadline := base, context.CancelFunc(func() {})
	latest, all := batch[0].ctx.Deadline()
	for _, c := range batch[1:] {
		d, ok := c.ctx.Deadline()
		all = all && ok
		if d.After(latest) {
			latest = d
		}
	}
	if all {
		ctx, cancelDeadline = context.WithDeadline(base, latest)
	}
	var live atomic.Int32
	live.Store(int32(len(batch)))
	stops := make([]func() bool, len(batch))
	for i, c := range batch {
		stops[i] = context.AfterFunc(c.ctx, func() {
			if live.Add(-1) == 0 {
				cancelBase()
			}
		})
	}
	return ctx, func() {
		for _, stop := range stops {
			stop()
		}
		cancelDeadline()
		cancelBase()
	}
}

// contextError is the error of a Put whose context ended: what grpc
// returns for it, in the library's form.
func contextError(ctx context.Context) error {
	return fromStatus(status.FromContextError(ctx.Err()).Err())
}
