package server

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v5"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/metadata"

	"github.com/fencer-dev/fencer/etcdstore"
	"github.com/fencer-dev/fencer/internal/holderkey"
	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
)

const (
	// hubBuffer is how many recent losses the shared watch keeps, so that
	// a stream starting from an earlier revision can join it at once.
	hubBuffer = 16384
	// feedBuffer is how many messages a stream may fall behind the shared
	// watch before it is ended (its client watches again from where it
	// was).
	feedBuffer = 256
)

// leaseHub feeds WatchLease streams from etcd watches on the holder keys.
//
// The streams share one watch, which etcd sends each holder-key change to
// once, however many streams there are; the hub hands each loss to the
// streams of the session whose etcd lease the key was on. The shared watch
// starts at the store's revision when the first stream comes, so it never
// replays history. A stream that must start earlier than the shared watch
// reaches back (its buffer of recent losses) first catches up on a watch
// of its own, which hands the stream over to the shared watch once it has
// caught up, and ends.
//
// Per stream, messages are in revision order and none is skipped: a
// stream that falls behind the shared watch is ended, and no message is
// queued for it after the one it missed, so its client resumes from the
// last revision it saw.
//
// Design. One mutex (mu) guards the shared run, every feed's place (on the
// shared run, catching up, or left) and the buffer; nothing blocks while
// holding it, since a feed takes a message only if it has room (and is
// ended otherwise). Each run and each catch-up has one goroutine, the only
// one that reads its etcd watch. A feed moves one way: subscribe puts it
// on the shared run, or on a catch-up that hands it over (handOver) once
// it has seen every revision the run's buffer lacks; a failed run ends its
// feeds (failLocked) and, unless etcd compacted what it needed, a
// successor takes over its buffer from where it stopped, after a backoff.
// A shared run starts only at the store's head, so it never replays
// history that a feed might already have had.
//
// Races and the tests that pin them (server/leasehub_test.go unless said):
//   - A loss between the shared watch's start and a stream's subscribe:
//     the buffer replays it (TestLeaseHubSharesOneWatchAndReplaysItsBuffer).
//   - A stream from before the buffer: a catch-up, then a handover with no
//     loss missed or repeated at the seam
//     (TestLeaseHubCatchesUpAStreamFromBeforeItsBufferThenHandsItOver), and
//     the buffer stays bounded (TestLeaseHubBufferIsBounded).
//   - A stream slower than the losses: it is ended, nothing is queued after
//     the message it missed, and it resumes where it was
//     (TestLeaseHubEndsAFeedThatFallsBehindAndQueuesNothingAfter); more
//     losses in one revision than a feed holds still all arrive
//     (TestLeaseHubDeliversMoreLossesInOneRevisionThanAFeedHolds).
//   - One stream's start (compacted, in the future, fresh) never leaks into
//     another's (TestLeaseHubStreamsDoNotInheritEachOthersStart). A start
//     ahead of the shared watch (an acquisition's revision it has not seen
//     yet) joins it and gets its losses
//     (TestLeaseHubFeedsAStreamFromAheadOfItsSharedWatch); the hub takes
//     any start, and WatchLease refuses one beyond the store's next
//     revision (loss_test.go, TestWatchLeaseRefusesAFutureStartRevision).
//   - Unsubscribe racing handOver under the lock: the feed never joins the
//     shared run after it left (TestLeaseHubNeverJoinsAnUnsubscribedFeed).
//   - A catch-up longer than one etcd response while no shared run exists:
//     the run it starts begins at the head, not mid-history
//     (TestLeaseHubStartsNoSharedWatchInThePast).
//   - A failed shared watch: feeds end and rejoin its successor at once
//     (TestLeaseHubRestartsAFailedSharedWatchWithItsBuffer); a successor
//     meeting a compacted previous value ends for good and the next stream
//     starts afresh (TestLeaseHubRecoversFromACompactedPreviousValue);
//     successors back off, and start over once etcd answers
//     (TestLeaseHubRestartsBackOffAndStartOverOnceAnswered).
//   - Close: every feed ends, later subscriptions end at once
//     (TestLeaseHubCloseEndsFeeds).
//   - A loss between the acquiring Txn and its reply reaches the session's
//     stream, opened before or after (loss_test.go,
//     TestLossBetweenAcquisitionAndReplyIsReported); many streams share one
//     etcd watch (server_test.go, TestWatchLeaseStreamsShareOneEtcdWatch).
type leaseHub struct {
	cli    *clientv3.Client
	store  *etcdstore.Store
	m      *metrics
	buffer int // hubBuffer, but for tests
	feed   int // feedBuffer, but for tests

	// onLoss, when set, is called once for each loss the shared watch
	// sees (with the hub's mu held), whether or not a feed takes it.
	onLoss func(ev *clientv3.Event, msg *fencerv1.WatchLeaseResponse)

	mu     sync.Mutex
	shared *hubRun         // nil until a stream comes or keepShared, and after a failure
	retry  backoff.BackOff // paces restarts after failures; see restartBackOff
	closed bool
}

func newLeaseHub(store *etcdstore.Store, m *metrics) *leaseHub {
	return &leaseHub{cli: store.Client(), store: store, m: m, buffer: hubBuffer, feed: feedBuffer, retry: restartBackOff()}
}

// hubRun is the shared watch and the feeds it serves. Its fields are
// guarded by the hub's mu.
type hubRun struct {
	cancel context.CancelFunc
	done   chan struct{} // closed when its goroutine has returned

	since    int64                                  // buf holds every loss from here on
	next     int64                                  // every revision before next has been handed out
	reported int64                                  // next at the last progress report
	buf      []*clientv3.Event                      // losses, oldest first
	byLease  map[clientv3.LeaseID][]*clientv3.Event // buf by the session that lost
	feeds    members[*hubFeed]
	delay    time.Duration // before watching: a restart after a failure
	stopped  bool          // failed or closed: hands out nothing more
	answered bool          // etcd has answered the watch at least once
}

// hubFeed is one WatchLease stream's feed: LOST events and progress, in
// revision order, until gone is closed with err.
type hubFeed struct {
	id   clientv3.LeaseID
	q    *feedQueue
	gone chan struct{}
	err  error // why gone was closed; set before

	// Guarded by the hub's mu:
	start  int64   // the first revision the feed reports
	shared *hubRun // the shared watch serving the feed; nil while it catches up
	left   bool    // unsubscribed: never to join the shared watch

	stopCatchUp context.CancelFunc // nil if the feed never had a watch of its own
	caughtUp    chan struct{}      // closed when that watch's goroutine has returned
}

// subscribe feeds the losses of session id from revision start on. now is
// a revision the store has reached. notify, if not nil, is called after
// each message is queued and when the feed ends (see feedQueue.notify).
// Release the feed with unsubscribe.
func (h *leaseHub) subscribe(id clientv3.LeaseID, start, now int64, notify func()) *hubFeed {
	h.mu.Lock()
	defer h.mu.Unlock()
	q := newFeedQueue(h.feed)
	q.notify = notify
	f := &hubFeed{id: id, start: start, q: q, gone: make(chan struct{})}
	if h.closed {
		h.end(f, ErrShuttingDown)
		return f
	}
	if h.shared == nil {
		h.shared = h.startShared(now + 1)
	}
	if !h.join(h.shared, f, start) {
		h.catchUp(f)
	}
	return f
}

// keepShared starts the shared watch from revision now+1 if none runs
// (now is a revision the store has reached), so that the hub sees every
// loss from then on, whether or not a stream watches.
func (h *leaseHub) keepShared(now int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.closed && h.shared == nil {
		h.shared = h.startShared(now + 1)
	}
}

// join moves f onto the shared watch r from revision from, handing it the
// buffered losses from there. It reports false, changing nothing, if r's
// buffer does not reach back to from or the losses do not fit f's feed.
func (h *leaseHub) join(r *hubRun, f *hubFeed, from int64) bool {
	if from < r.since {
		return false
	}
	var replay []*clientv3.Event
	for _, ev := range r.byLease[f.id] {
		if ev.Kv.ModRevision >= from {
			replay = append(replay, ev)
		}
	}
	// Only f's own catch-up adds to f.q, and it is the caller when f has
	// one; the stream only takes from it.
	if len(replay) > f.q.room() {
		return false
	}
	for _, ev := range replay {
		f.q.put(lostEvent(ev, f.id, h.store))
	}
	f.start, f.shared = from, r
	r.feeds.add(f.id, f)
	return true
}

// leave takes f off its shared watch, if it is on one.
func (h *leaseHub) leave(f *hubFeed) {
	if r := f.shared; r != nil {
		r.feeds.remove(f.id, f)
		f.shared = nil
	}
}

// unsubscribe ends f's feed.
func (h *leaseHub) unsubscribe(f *hubFeed) {
	h.mu.Lock()
	f.left = true
	h.leave(f)
	h.mu.Unlock()
	if f.stopCatchUp != nil {
		f.stopCatchUp()
		<-f.caughtUp
	}
}

// close stops the shared watch and ends the feeds on it; later
// subscriptions end at once with ErrShuttingDown. Feeds still catching up
// end when their streams unsubscribe.
func (h *leaseHub) close() {
	h.mu.Lock()
	h.closed = true
	r := h.shared
	if r != nil {
		h.failLocked(r, ErrShuttingDown, false)
	}
	h.mu.Unlock()
	if r != nil {
		r.cancel()
		<-r.done
	}
}

// watch starts an etcd watch on the holder keys from revision start. Each
// caller's watches go on a gRPC stream of their own (tag), so that a
// progress request (on progressCtx) reaches only them.
func (h *leaseHub) watch(ctx context.Context, start int64, tag string) (wch clientv3.WatchChan, progressCtx context.Context) {
	ctx = metadata.AppendToOutgoingContext(clientv3.WithRequireLeader(ctx), "fencer-watch", tag)
	return h.cli.Watch(ctx, holderkey.Key(h.store.Prefix(), ""), clientv3.WithPrefix(), clientv3.WithRev(start), clientv3.WithPrevKV(), clientv3.WithProgressNotify()), ctx
}

// startShared starts the shared watch from revision start.
func (h *leaseHub) startShared(start int64) *hubRun {
	return h.runShared(&hubRun{since: start, next: start, reported: start, byLease: map[clientv3.LeaseID][]*clientv3.Event{}})
}

// runShared starts r's watch from r.next, after r.delay.
func (h *leaseHub) runShared(r *hubRun) *hubRun {
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel, r.done = cancel, make(chan struct{})
	r.feeds = members[*hubFeed]{}
	h.m.leaseWatches.Inc()
	go h.follow(ctx, r)
	return r
}

// follow hands out what the shared watch reports until ctx ends or the
// watch fails. Every progressEvery it asks etcd how far the watch has
// seen, and reports progress to the feeds if the watch moved.
func (h *leaseHub) follow(ctx context.Context, r *hubRun) {
	defer close(r.done)
	defer h.m.leaseWatches.Dec()
	defer r.cancel()
	select {
	case <-ctx.Done():
		return
	case <-time.After(r.delay):
	}
	wch, progressCtx := h.watch(ctx, r.next, "shared")
	tick := time.NewTicker(progressEvery)
	defer tick.Stop()
	for {
		wr, ok, err := awaitResponse(ctx, wch, tick.C, func() {
			_ = h.cli.RequestProgress(progressCtx)
			h.progress(r)
		})
		if err != nil {
			return
		}
		if err := watchErr(wr, ok); err != nil {
			h.mu.Lock()
			h.failLocked(r, err, !errors.Is(err, ErrWatchCompacted))
			h.mu.Unlock()
			return
		}
		if !h.apply(r, wr) {
			return
		}
	}
}

// awaitResponse returns wch's next response, running onTick at every tick
// while it waits, or ctx's error once ctx ends. A tick never runs onTick
// while a response is waiting or after ctx ended: onTick asks etcd for
// progress, and asking on a watch stream that has gone opens a new one
// that nothing closes.
func awaitResponse(ctx context.Context, wch clientv3.WatchChan, tick <-chan time.Time, onTick func()) (clientv3.WatchResponse, bool, error) {
	for {
		select {
		case <-ctx.Done():
			return clientv3.WatchResponse{}, false, ctx.Err()
		case wr, ok := <-wch:
			return wr, ok, ctx.Err()
		case <-tick:
			select {
			case wr, ok := <-wch:
				return wr, ok, ctx.Err()
			default:
			}
			if ctx.Err() == nil {
				onTick()
			}
		}
	}
}

// apply hands the losses in wr to the feeds of their sessions and keeps
// them in r's buffer. It reports false if it had to end r.
func (h *leaseHub) apply(r *hubRun, wr clientv3.WatchResponse) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if r.stopped {
		return false // its buffer may be another run's now
	}
	if !r.answered {
		r.answered = true
		h.retry.Reset() // the watch works: the next failure restarts it soon
	}
	for _, ev := range wr.Events {
		if ev.PrevKv == nil {
			if ev.Type == mvccpb.DELETE {
				// Whose key it was is compacted away: every feed resyncs,
				// and the next stream starts a shared watch at the head (a
				// successor from here would meet the same event again).
				h.failLocked(r, fmt.Errorf("%w: the previous value of %s", ErrWatchCompacted, ev.Kv.Key), false)
				return false
			}
			continue
		}
		id := clientv3.LeaseID(ev.PrevKv.Lease)
		msg := lostEvent(ev, id, h.store) // read-only once built: shared by the session's feeds
		if msg == nil {
			continue
		}
		r.buf = append(r.buf, ev)
		r.byLease[id] = append(r.byLease[id], ev)
		if h.onLoss != nil {
			h.onLoss(ev, msg)
		}
		for _, f := range slices.Clone(r.feeds[id]) { // a full feed leaves
			if ev.Kv.ModRevision < f.start {
				continue
			}
			if !f.q.put(msg) {
				h.leave(f) // nothing more is queued for f after what it missed
				h.end(f, errFellBehind)
			}
		}
	}
	r.next = max(r.next, progressRevision(wr)+1)
	for len(r.buf) > h.buffer {
		oldest := r.buf[0].Kv.ModRevision
		for len(r.buf) > 0 && r.buf[0].Kv.ModRevision == oldest {
			id := clientv3.LeaseID(r.buf[0].PrevKv.Lease)
			if r.byLease[id] = r.byLease[id][1:]; len(r.byLease[id]) == 0 {
				delete(r.byLease, id)
			}
			r.buf[0] = nil
			r.buf = r.buf[1:]
		}
		r.since = oldest + 1
	}
	return true
}

// progress tells r's feeds how far the watch has seen, if it moved since
// the last report. A feed that is full skips a report.
func (h *leaseHub) progress(r *hubRun) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if r.stopped || r.next == r.reported {
		return
	}
	r.reported = r.next
	for _, feeds := range r.feeds {
		for _, f := range feeds {
			report(f, r.next-1)
		}
	}
}

// report queues a progress report of revision seen for f, if f reports
// that far and has room.
func report(f *hubFeed, seen int64) {
	if seen < f.start {
		return
	}
	f.q.putProgress(&fencerv1.WatchLeaseResponse{Type: fencerv1.WatchLeaseResponse_TYPE_PROGRESS, Revision: seen})
}

// failLocked stops r and ends every feed of r with err. With restart, a new shared
// watch takes over from where r got to, with r's buffer, so that the
// feeds' streams can join it again at once; without, the next stream
// starts one.
func (h *leaseHub) failLocked(r *hubRun, err error, restart bool) {
	r.cancel()
	r.stopped = true
	for _, feeds := range r.feeds {
		for _, f := range slices.Clone(feeds) {
			h.leave(f)
			h.end(f, err)
		}
	}
	if h.shared != r {
		return
	}
	h.shared = nil
	if restart && !h.closed {
		h.shared = h.runShared(&hubRun{since: r.since, next: r.next, reported: r.next, buf: r.buf, byLease: r.byLease, delay: h.retry.NextBackOff()})
	}
}

// restartBackOff spaces out the restarts of a shared watch that keeps
// failing, as it does while etcd has no leader: the first comes after
// 200 ms, each next one after twice as long, up to 5 s, each drawn at
// random from ±50% of its nominal value (at most 7.5 s). It starts over
// once etcd has answered a restarted watch. Each server has one shared
// watch, so the jitter spreads the restarts of the servers in front of one
// etcd cluster; their streams' clients back off on their own.
func restartBackOff() backoff.BackOff {
	return &backoff.ExponentialBackOff{
		InitialInterval:     200 * time.Millisecond,
		RandomizationFactor: 0.5,
		Multiplier:          2,
		MaxInterval:         5 * time.Second,
	}
}

// end closes f's feed with err, once. The stream then unsubscribes.
func (h *leaseHub) end(f *hubFeed, err error) {
	select {
	case <-f.gone:
	default:
		f.err = err
		close(f.gone)
		if f.q.notify != nil {
			f.q.notify()
		}
	}
}

// catchUp starts a watch of f's own from f.start. It hands f its losses,
// waiting for the stream to take them, and hands f over to the shared
// watch as soon as it has seen every revision the shared watch's buffer
// does not hold. It asks etcd for progress every progressEvery, so that
// it finds out it has caught up even when nothing changes.
func (h *leaseHub) catchUp(f *hubFeed) {
	ctx, cancel := context.WithCancel(context.Background())
	f.stopCatchUp, f.caughtUp = cancel, make(chan struct{})
	start := f.start
	h.m.leaseWatches.Inc()
	go func() {
		defer close(f.caughtUp)
		defer h.m.leaseWatches.Dec()
		defer cancel()
		wch, progressCtx := h.watch(ctx, start, fmt.Sprintf("catch-up-%d", catchUpSeq.Add(1)))
		tick := time.NewTicker(progressEvery)
		defer tick.Stop()
		next := start
		for {
			wr, ok, err := awaitResponse(ctx, wch, tick.C, func() { _ = h.cli.RequestProgress(progressCtx) })
			if err != nil {
				return
			}
			if err := watchErr(wr, ok); err != nil {
				h.mu.Lock()
				h.end(f, err)
				h.mu.Unlock()
				return
			}
			for _, ev := range wr.Events {
				if ev.PrevKv == nil && ev.Type == mvccpb.DELETE {
					h.mu.Lock()
					h.end(f, fmt.Errorf("%w: the previous value of %s", ErrWatchCompacted, ev.Kv.Key))
					h.mu.Unlock()
					return
				}
				msg := lostEvent(ev, f.id, h.store)
				if msg == nil || ev.Kv.ModRevision < start {
					continue
				}
				if !f.q.putWait(ctx, msg) {
					return
				}
			}
			next = max(next, progressRevision(wr)+1)
			// A progress notification comes only once the watch has caught
			// up: next is then the store's revision.
			if h.handOver(f, next, len(wr.Events) == 0 && wr.IsProgressNotify()) {
				return
			}
		}
	}()
}

// catchUpSeq tells the catch-up watches' gRPC streams apart.
var catchUpSeq atomic.Int64

// handOver moves f, whose own watch has handed out every revision before
// next, onto the shared watch. If none runs, it starts one from next, but
// only when next is the store's revision (atHead), so that a shared watch
// never replays history. It reports whether it moved f.
func (h *leaseHub) handOver(f *hubFeed, next int64, atHead bool) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	select {
	case <-f.gone:
		return false
	default:
	}
	if h.closed || f.left {
		return false
	}
	if h.shared == nil {
		if !atHead {
			return false
		}
		h.shared = h.startShared(next)
	}
	return h.join(h.shared, f, next)
}

// errFellBehind ends a lease watch that could not keep up; its client
// watches again from the last revision it saw.
var errFellBehind = fmt.Errorf("server: lease watch fell behind: %w", errStoreUnavailable)

// feedQueue holds a feed's messages until its stream takes them: at most
// limit, in order. Its slice exists only while messages wait, so a stream
// that has nothing to read costs no buffer. Any goroutine may put; one
// stream takes.
type feedQueue struct {
	mu    sync.Mutex
	msgs  []*fencerv1.WatchLeaseResponse
	limit int
	ready chan struct{} // signalled when a message waits: the stream then takes
	// notify, if not nil, is called with ready's signal, and when the
	// queue's feed ends: a stream that serves many feeds learns from it
	// which to look at. It runs under the queue's or the hub's lock, so it
	// must only signal.
	notify func()
	taken  chan struct{} // signalled when the stream took one, for putWait
}

func newFeedQueue(limit int) *feedQueue {
	return &feedQueue{limit: limit, ready: make(chan struct{}, 1), taken: make(chan struct{}, 1)}
}

// signal leaves a signal on c, unless one waits there already.
func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// put queues msg and reports true, or reports false if the queue is full.
func (q *feedQueue) put(msg *fencerv1.WatchLeaseResponse) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.msgs) >= q.limit {
		return false
	}
	q.msgs = append(q.msgs, msg)
	signal(q.ready)
	if q.notify != nil {
		q.notify()
	}
	return true
}

// putProgress queues msg, a PROGRESS report, in place of a PROGRESS
// report the stream has not taken yet if one is last in the queue (the
// later report says all the earlier one did), so that a stream that reads
// slowly holds one report, not one per second.
func (q *feedQueue) putProgress(msg *fencerv1.WatchLeaseResponse) bool {
	q.mu.Lock()
	if n := len(q.msgs); n > 0 && q.msgs[n-1].GetType() == fencerv1.WatchLeaseResponse_TYPE_PROGRESS {
		q.msgs[n-1] = msg
		q.mu.Unlock()
		return true
	}
	q.mu.Unlock()
	return q.put(msg)
}

// putWait queues msg, waiting while the queue is full. It reports false,
// queuing nothing, if ctx ends first.
func (q *feedQueue) putWait(ctx context.Context, msg *fencerv1.WatchLeaseResponse) bool {
	for !q.put(msg) {
		select {
		case <-q.taken:
		case <-ctx.Done():
			return false
		}
	}
	return true
}

// room is how many more messages the queue takes now.
func (q *feedQueue) room() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.limit - len(q.msgs)
}

// take returns the oldest message, or false if none waits. Call it when
// ready is signalled; it signals ready again while more wait.
func (q *feedQueue) take() (*fencerv1.WatchLeaseResponse, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.msgs) == 0 {
		return nil, false
	}
	msg := q.msgs[0]
	q.msgs[0] = nil
	if q.msgs = q.msgs[1:]; len(q.msgs) == 0 {
		q.msgs = nil // an idle stream keeps no buffer
	} else {
		signal(q.ready)
	}
	signal(q.taken)
	return msg, true
}
