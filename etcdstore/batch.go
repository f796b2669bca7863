package etcdstore

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencer-dev/fencer/internal/mutant"
)

// Limits of one shared Txn, within etcd's defaults: --max-txn-ops 128
// counts the nested Txns and their largest branch, and --max-request-bytes
// is 1.5 MiB.
const (
	// MaxBatch is the largest batch WithBatching accepts.
	MaxBatch = 120
	// DefaultBatch is the batch size of a Store made without
	// WithBatching.
	DefaultBatch = 64
	// maxBatchBytes bounds the keys and values of one shared Txn.
	maxBatchBytes = 1 << 20
)

// WithBatching lets up to max concurrent writes of the store share one
// etcd Txn: guarded Put and Delete, acquisitions, Release and Advance. Each
// write stays its own nested Txn with its own compares, so each commits or
// fails on its own guard exactly as it would alone, and writes whose keys
// overlap (one reads or writes a key another writes) never share a Txn. A
// write that finds no other in flight is sent at once, on its own, so a
// lone writer waits for nothing; writes that arrive while one is in flight
// leave together as the next Txn.
//
// Writes that share a Txn commit at the same etcd revision. If etcd
// rejects a shared Txn before applying it (too many operations, too large,
// a lease it does not know, a write the etcd user may not make), each
// write is retried on its own, so batching never turns a write that would
// succeed alone into a failure. A write whose context ends while it is
// queued is never sent; one whose context ends while its Txn is in flight
// returns the context's error, and may or may not have committed, as with
// any etcd call. The shared Txn runs on a context of its own, ended when
// every write's context has ended; it does not carry the writes' context
// values (gRPC metadata such as clientv3.WithRequireLeader). An etcd
// cluster whose --max-txn-ops is lower than the batch size plus the
// largest write's compares or ops refuses full batches, which are then
// retried write by write: correct, but slower than a smaller batch.
//
// Batching is on by default, with DefaultBatch. max is clamped to
// MaxBatch; max < 2 turns batching off, so that every write is a Txn of its
// own. Batching starts goroutines only while writes are queued, and none
// outlive them.
func WithBatching(max int) Option {
	return func(s *Store) {
		s.batch = nil
		if max >= 2 {
			s.batch = &batcher{cli: s.cli, max: min(max, MaxBatch)}
		}
	}
}

// commit runs the Txn If(cmps).Then(then).Else(els), sharing an etcd Txn
// with concurrent writes when the store batches and the Txn can be shared.
func (s *Store) commit(ctx context.Context, cmps []clientv3.Cmp, then, els []clientv3.Op) (*clientv3.TxnResponse, error) {
	if s.batch == nil {
		return txnAlone(ctx, s.cli, cmps, then, els)
	}
	return s.batch.do(ctx, cmps, then, els)
}

// batcher queues writes while one shared Txn is in flight and sends them
// together as the next.
type batcher struct {
	cli *clientv3.Client
	max int

	mu    sync.Mutex
	busy  bool    // a Txn is in flight
	queue []*call // writes waiting for the next Txn, oldest first
}

// call is one write: its Txn, the keys it reads and writes, and, once
// done is closed, its outcome.
type call struct {
	ctx       context.Context
	cmps      []clientv3.Cmp
	then, els []clientv3.Op

	reads, writes []string
	size          int

	done  chan struct{}
	resp  *clientv3.TxnResponse
	reply pb.TxnResponse // resp of a write that shared a Txn
	err   error
}

// keys fills in the keys c reads and writes and its size. It reports
// false for a Txn that cannot be shared: one that writes nothing (etcd
// serves it without consensus), or that uses key ranges, whose overlap
// with other writes is not worth working out. The compares and ops of
// nested Txns count as c's own, in both of their branches: an owner key
// that a guarded write compares is read, and one it may claim is written.
func (c *call) keys() bool {
	return c.add(c.cmps, c.then) && c.add(nil, c.els) && len(c.writes) > 0
}

// add adds the keys that cmps and ops read and write to c's, and their
// size; false if any is a key range.
func (c *call) add(cmps []clientv3.Cmp, ops []clientv3.Op) bool {
	for _, cmp := range cmps {
		if len(cmp.GetCompare().GetRangeEnd()) > 0 {
			return false
		}
		c.reads = append(c.reads, string(cmp.KeyBytes()))
		c.size += len(cmp.KeyBytes()) + len(cmp.ValueBytes())
	}
	for _, op := range ops {
		if op.IsTxn() {
			cmps, then, els := op.Txn()
			if !c.add(cmps, then) || !c.add(nil, els) {
				return false
			}
			continue
		}
		if len(op.RangeBytes()) > 0 {
			return false
		}
		key := string(op.KeyBytes())
		c.size += len(key) + len(op.ValueBytes())
		if op.IsGet() {
			c.reads = append(c.reads, key)
		} else {
			c.writes = append(c.writes, key)
		}
	}
	return true
}

// alone runs c as a Txn of its own.
func (c *call) alone(ctx context.Context, cli *clientv3.Client) (*clientv3.TxnResponse, error) {
	return txnAlone(ctx, cli, c.cmps, c.then, c.els)
}

// txnAlone runs If(cmps).Then(then).Else(els) as a Txn of its own.
func txnAlone(ctx context.Context, cli *clientv3.Client, cmps []clientv3.Cmp, then, els []clientv3.Op) (*clientv3.TxnResponse, error) {
	return cli.Txn(ctx).If(cmps...).Then(then...).Else(els...).Commit()
}

// do runs the write If(cmps).Then(then).Else(els): at once if no Txn is in
// flight, else in the next shared one. Only a write that waits becomes a
// call and has its keys worked out; one that cannot share a Txn goes alone
// even then.
func (b *batcher) do(ctx context.Context, cmps []clientv3.Cmp, then, els []clientv3.Op) (*clientv3.TxnResponse, error) {
	b.mu.Lock()
	if !b.busy {
		b.busy = true
		b.mu.Unlock()
		resp, err := txnAlone(ctx, b.cli, cmps, then, els)
		b.next()
		return resp, err
	}
	c := &call{ctx: ctx, cmps: cmps, then: then, els: els}
	if !c.keys() {
		b.mu.Unlock()
		return c.alone(c.ctx, b.cli)
	}
	c.done = make(chan struct{})
	b.queue = append(b.queue, c)
	b.mu.Unlock()
	return b.wait(c)
}

// wait returns the outcome of c, a queued write: when its Txn has
// answered, or at once when its context ends first, taking it out of the
// queue if it is still there.
func (b *batcher) wait(c *call) (*clientv3.TxnResponse, error) {
	select {
	case <-c.done:
		return c.resp, c.err
	case <-c.ctx.Done():
		b.mu.Lock()
		if i := slices.Index(b.queue, c); i >= 0 {
			b.queue = slices.Delete(b.queue, i, i+1)
		}
		b.mu.Unlock()
		select {
		case <-c.done: // taken before it could leave: take or run answered
			return c.resp, c.err
		default:
			return nil, c.ctx.Err() // in flight: it may yet commit
		}
	}
}

// txnArgs are the parts of one write's Txn: If(cmps).Then(then).
type txnArgs struct {
	cmps []clientv3.Cmp
	then []clientv3.Op
}

// doAll runs the writes txns, all with ctx, as do runs each, but enters
// them into the queue together: when no Txn is in flight they leave
// together as the next one (up to max), instead of the first alone and
// the others after it. A write that cannot share a Txn goes alone, as
// with do.
func (b *batcher) doAll(ctx context.Context, txns []txnArgs) ([]*clientv3.TxnResponse, []error) {
	resps, errs := make([]*clientv3.TxnResponse, len(txns)), make([]error, len(txns))
	calls := make([]*call, len(txns))
	var alone sync.WaitGroup
	b.mu.Lock()
	queued := false
	for i, t := range txns {
		c := &call{ctx: ctx, cmps: t.cmps, then: t.then}
		if !c.keys() {
			alone.Go(func() { resps[i], errs[i] = c.alone(ctx, b.cli) })
			continue
		}
		c.done = make(chan struct{})
		calls[i] = c
		b.queue = append(b.queue, c)
		queued = true
	}
	lead := queued && !b.busy
	if lead {
		b.busy = true
	}
	b.mu.Unlock()
	if lead {
		b.next()
	}
	for i, c := range calls {
		if c != nil {
			resps[i], errs[i] = b.wait(c)
		}
	}
	alone.Wait()
	return resps, errs
}

// next sends the queued writes, batch after batch, in a goroutine of its
// own, or marks the batcher idle when none are queued.
func (b *batcher) next() {
	batch := b.take()
	if batch == nil {
		return
	}
	go func() {
		for ; batch != nil; batch = b.take() {
			b.run(batch)
		}
	}()
}

// take removes the next batch from the queue: the oldest writes, up to
// max of them and maxBatchBytes, skipping any that overlap a write before
// them, so that writes to one key keep their order. Writes whose context
// has ended leave the queue unsent, with the context's error. It returns
// nil, and marks the batcher idle, when the queue is empty.
func (b *batcher) take() []*call {
	b.mu.Lock()
	defer b.mu.Unlock()
	var batch []*call
	written := map[string]bool{} // key → written by a write before, or only read
	rest, size := b.queue[:0], 0
	for _, c := range b.queue {
		if err := c.ctx.Err(); err != nil {
			c.err = err // never sent: it writes nothing
			close(c.done)
			continue
		}
		fits := len(batch) < b.max && (batch == nil || size+c.size <= maxBatchBytes)
		if fits && !overlaps(written, c) {
			batch, size = append(batch, c), size+c.size
		} else {
			rest = append(rest, c)
		}
		for _, k := range c.reads {
			if _, ok := written[k]; !ok {
				written[k] = false
			}
		}
		for _, k := range c.writes {
			written[k] = true
		}
	}
	clear(b.queue[len(rest):])
	b.queue = rest
	if batch == nil && len(rest) == 0 {
		b.busy = false
	}
	return batch
}

// overlaps reports whether c writes a key that an earlier write reads or
// writes, or reads a key that one writes.
func overlaps(written map[string]bool, c *call) bool {
	for _, k := range c.writes {
		if _, ok := written[k]; ok {
			return true
		}
	}
	for _, k := range c.reads {
		if written[k] {
			return true
		}
	}
	return false
}

// run sends batch as one Txn of nested Txns and hands each write its own
// result. The Txn is cancelled once every write's context has ended.
func (b *batcher) run(batch []*call) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var live atomic.Int32
	live.Store(int32(len(batch)))
	for _, c := range batch {
		stop := context.AfterFunc(c.ctx, func() {
			if live.Add(-1) == 0 {
				cancel()
			}
		})
		defer stop()
	}
	if len(batch) == 1 {
		c := batch[0]
		c.resp, c.err = c.alone(ctx, b.cli)
		close(c.done)
		return
	}
	ops := make([]clientv3.Op, len(batch))
	for i, c := range batch {
		cmps := c.cmps
		if mutant.On(mutant.BatchSharedGuard) {
			cmps = batch[0].cmps
		}
		ops[i] = clientv3.OpTxn(cmps, c.then, c.els)
	}
	resp, err := b.cli.Txn(ctx).Then(ops...).Commit()
	if err != nil && rejectedWhole(err) {
		var wg sync.WaitGroup
		for _, c := range batch {
			wg.Go(func() {
				c.resp, c.err = c.alone(c.ctx, b.cli)
				close(c.done)
			})
		}
		wg.Wait()
		return
	}
	for i, c := range batch {
		if c.err = err; err == nil {
			sub := resp.Responses[i].GetResponseTxn()
			c.reply = pb.TxnResponse{Header: resp.Header, Succeeded: sub.GetSucceeded(), Responses: sub.GetResponses()}
			c.resp = (*clientv3.TxnResponse)(&c.reply)
		}
		close(c.done)
	}
}

// rejectedWhole reports whether etcd refused a shared Txn as a whole,
// before applying any of it, for a reason that a write on its own may not
// meet: a write the etcd user may not make (with etcd auth, every op of
// every nested Txn is checked first) fails the whole shared Txn, and so do
// limits that only the sum of the writes exceeds.
func rejectedWhole(err error) bool {
	for _, e := range []error{rpctypes.ErrTooManyOps, rpctypes.ErrRequestTooLarge, rpctypes.ErrLeaseNotFound, rpctypes.ErrDuplicateKey, rpctypes.ErrPermissionDenied} {
		if errors.Is(err, e) {
			return true
		}
	}
	// A message over the client's own size limit; etcd's ResourceExhausted
	// errors (too many requests, no space) are not retried one by one.
	return OverSendLimit(err)
}
