package server

import (
	"context"
	"fmt"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencer-dev/fencer/etcdstore"
	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
)

const (
	// hubBuffer is how many recent losses the shared watch keeps, so that
	// a stream starting from an earlier revision can join it.
	hubBuffer = 4096
	// subBuffer is how many messages a stream may fall behind the watch
	// before it is ended (its client watches again from where it was).
	subBuffer = 1024
)

// leaseHub feeds WatchLease streams from etcd watches on the holder keys.
// The streams share one watch, which etcd sends each holder-key change to
// once, however many streams there are; the hub hands each loss to the
// streams of the session whose etcd lease the key was on. A stream that
// must start before the shared watch's buffer reaches back gets a watch of
// its own. A watch runs only while a stream uses it.
type leaseHub struct {
	cli     *clientv3.Client
	store   *etcdstore.Store
	m       *metrics
	buffer  int // hubBuffer, but for tests
	sbuffer int // subBuffer, but for tests

	mu     sync.Mutex
	shared *hubRun // nil while no stream uses the shared watch
}

func newLeaseHub(store *etcdstore.Store, m *metrics) *leaseHub {
	return &leaseHub{cli: store.Client(), store: store, m: m, buffer: hubBuffer, sbuffer: subBuffer}
}

// hubRun is one etcd watch on the holder keys and the streams it feeds.
// Its fields are guarded by the hub's mu.
type hubRun struct {
	cancel context.CancelFunc
	done   chan struct{} // closed when the watch's goroutine has returned

	since    int64             // the buffer holds every loss from here on
	next     int64             // every revision before next has been handed out
	reported int64             // next at the last progress report
	buf      []*clientv3.Event // losses, oldest first (shared watch only)
	subs     map[clientv3.LeaseID]map[*hubSub]bool
	shared   bool
}

// hubSub is one WatchLease stream's feed: LOST events and progress, in
// revision order, until gone is closed with err.
type hubSub struct {
	run   *hubRun
	id    clientv3.LeaseID
	start int64
	ch    chan *fencerv1.WatchLeaseResponse
	gone  chan struct{}
	err   error // why gone was closed; set before
}

// subscribe feeds the losses of session id from revision start on.
// Release the feed with unsubscribe.
func (h *leaseHub) subscribe(id clientv3.LeaseID, start int64) *hubSub {
	h.mu.Lock()
	defer h.mu.Unlock()
	newSub := func() *hubSub {
		return &hubSub{id: id, start: start, ch: make(chan *fencerv1.WatchLeaseResponse, h.sbuffer), gone: make(chan struct{})}
	}
	if h.shared == nil {
		h.shared = h.startRun(start, true)
	}
	sub := newSub()
	if r := h.shared; start >= r.since && h.replay(r, sub) {
		sub.run = r
	} else {
		sub = newSub() // a watch of its own, from start
		sub.run = h.startRun(start, false)
	}
	if sub.run.subs[id] == nil {
		sub.run.subs[id] = map[*hubSub]bool{}
	}
	sub.run.subs[id][sub] = true
	return sub
}

// replay hands sub the buffered losses of its session from its start on.
// It reports false if they do not fit sub's feed.
func (h *leaseHub) replay(r *hubRun, sub *hubSub) bool {
	for _, ev := range r.buf {
		if ev.Kv.ModRevision < sub.start || clientv3.LeaseID(ev.PrevKv.Lease) != sub.id {
			continue
		}
		select {
		case sub.ch <- lostEvent(ev, sub.id, h.store):
		default:
			return false
		}
	}
	return true
}

// unsubscribe ends sub's feed, and its watch once no stream uses it.
func (h *leaseHub) unsubscribe(sub *hubSub) {
	h.mu.Lock()
	r := sub.run
	delete(r.subs[sub.id], sub)
	if len(r.subs[sub.id]) == 0 {
		delete(r.subs, sub.id)
	}
	last := len(r.subs) == 0
	if last {
		r.cancel()
		if h.shared == r {
			h.shared = nil
		}
	}
	h.mu.Unlock()
	if last {
		<-r.done
	}
}

// startRun starts an etcd watch on the holder keys from revision start.
func (h *leaseHub) startRun(start int64, shared bool) *hubRun {
	ctx, cancel := context.WithCancel(clientv3.WithRequireLeader(context.Background()))
	r := &hubRun{cancel: cancel, done: make(chan struct{}), since: start, next: start, reported: start,
		subs: map[clientv3.LeaseID]map[*hubSub]bool{}, shared: shared}
	wch := h.cli.Watch(ctx, h.store.HolderKey(""), clientv3.WithPrefix(), clientv3.WithRev(start), clientv3.WithPrevKV(), clientv3.WithProgressNotify())
	h.m.leaseWatches.Inc()
	go h.follow(ctx, r, wch)
	return r
}

// follow hands out what the watch of r reports until ctx ends or the
// watch fails, which ends every feed of r. Every progressEvery it reports
// progress to the feeds, if the watch moved.
func (h *leaseHub) follow(ctx context.Context, r *hubRun, wch clientv3.WatchChan) {
	defer close(r.done)
	defer h.m.leaseWatches.Dec()
	tick := time.NewTicker(progressEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case wr, ok := <-wch:
			if ctx.Err() != nil {
				return
			}
			if err := watchErr(wr, ok); err != nil {
				h.fail(r, err)
				return
			}
			h.apply(r, wr)
		case <-tick.C:
			h.progress(r)
		}
	}
}

// apply hands the losses in wr to the feeds of their sessions and keeps
// them in r's buffer.
func (h *leaseHub) apply(r *hubRun, wr clientv3.WatchResponse) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, ev := range wr.Events {
		if ev.PrevKv == nil {
			continue
		}
		id := clientv3.LeaseID(ev.PrevKv.Lease)
		if lostEvent(ev, id, h.store) == nil {
			continue
		}
		if r.shared {
			r.buf = append(r.buf, ev)
		}
		for sub := range r.subs[id] {
			if ev.Kv.ModRevision >= sub.start {
				h.send(sub, lostEvent(ev, id, h.store))
			}
		}
	}
	r.next = max(r.next, progressRevision(wr)+1)
	for len(r.buf) > h.buffer {
		oldest := r.buf[0].Kv.ModRevision
		for len(r.buf) > 0 && r.buf[0].Kv.ModRevision == oldest {
			r.buf[0] = nil
			r.buf = r.buf[1:]
		}
		r.since = oldest + 1
	}
}

// progress tells r's feeds how far the watch has seen, if it moved since
// the last report. A feed that is full skips a report.
func (h *leaseHub) progress(r *hubRun) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if r.next == r.reported {
		return
	}
	r.reported = r.next
	seen := r.next - 1
	for _, subs := range r.subs {
		for sub := range subs {
			if seen < sub.start {
				continue
			}
			select {
			case sub.ch <- &fencerv1.WatchLeaseResponse{Type: fencerv1.WatchLeaseResponse_TYPE_PROGRESS, Revision: seen}:
			default:
			}
		}
	}
}

// send hands msg to sub, or ends sub if it has fallen too far behind.
func (h *leaseHub) send(sub *hubSub, msg *fencerv1.WatchLeaseResponse) {
	select {
	case sub.ch <- msg:
	default:
		h.end(sub, errFellBehind)
	}
}

// fail ends every feed of r with err.
func (h *leaseHub) fail(r *hubRun, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, subs := range r.subs {
		for sub := range subs {
			h.end(sub, err)
		}
	}
	if h.shared == r {
		h.shared = nil // the next stream starts a new watch
	}
}

// end closes sub's feed with err, once. The stream then unsubscribes.
func (h *leaseHub) end(sub *hubSub, err error) {
	select {
	case <-sub.gone:
	default:
		sub.err = err
		close(sub.gone)
	}
}

// errFellBehind ends a lease watch that could not keep up; its client
// watches again from the last revision it saw.
var errFellBehind = fmt.Errorf("server: lease watch fell behind: %w", errStoreUnavailable)
