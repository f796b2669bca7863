package server

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// sessionRecord is how many recent session ends the shared session watch
// remembers, so that a stream whose read of its session is older than
// what the watch has seen can still learn whether its session ended in
// between.
const sessionRecord = 4096

// sessionWatch tells WatchLease streams that their session ended (its
// session key was deleted), from one etcd watch of the session keys shared
// by every stream, as the lease hub does for the holder keys.
//
// Contract. A stream reads its session key linearizably at revision rev
// and finds it; it then subscribes, and asks covers(sub, rev). When covers
// reports true, the subscription ends (gone closes) with
// ErrSessionNotFound for a deletion of the session key at any revision
// after rev, and with the watch's error if the shared watch fails first
// (the stream then ends and its client watches again). When covers
// reports false, the stream must read its session again, now that it is
// subscribed, and ask covers with that read's revision, which then reports
// true.
//
// Why it holds. A run's next is at most one past the store's revision
// (it moves only with what etcd reports), and every deletion at next or
// later reaches the subscriptions the run holds when it handles it. A
// subscription takes the run's next when it joins (from). A read after
// subscribing is at a revision at least from-1, so covers then holds at
// once. A read before it may be older than from: the run remembers the
// sessions that ended from since on (a bounded record), which answers for
// the revisions between the read and from, if it reaches back that far.
// A failed run ends every subscription it holds, so no subscription
// outlives the continuity of its run; the next subscription starts a run
// at its read's revision.
//
// Races and the tests that pin them (server/sessionwatch_test.go):
//   - A session that ends after the stream's read and before it subscribes,
//     while the shared watch has already passed that revision: the record
//     ends the subscription (TestSessionWatchRecordEndsALateSubscriber).
//   - The record no longer reaches back: covers reports false, and a read
//     after subscribing settles it
//     (TestSessionWatchAsksForAFreshReadBeyondItsRecord).
//   - Many sessions share one etcd watch, and the end of one ends only its
//     own subscriptions (TestSessionWatchEndsOnlyTheSessionThatEnded).
//   - Close ends every subscription, and later ones at once
//     (TestSessionWatchCloseEndsSubscriptions).
type sessionWatch struct {
	cli    *clientv3.Client
	prefix string // the session keys' prefix
	record int    // sessionRecord, but for tests

	mu     sync.Mutex
	run    *sessionRun // nil until a stream comes, and after a failure
	closed bool
}

func newSessionWatch(cli *clientv3.Client, prefix string) *sessionWatch {
	return &sessionWatch{cli: cli, prefix: prefix, record: sessionRecord}
}

// sessionRun is one etcd watch of the session keys and the subscriptions
// it serves. Its fields are guarded by the sessionWatch's mu.
type sessionRun struct {
	cancel context.CancelFunc
	done   chan struct{} // closed when its goroutine has returned

	next    int64 // every deletion before next has been handed out
	since   int64 // ended holds every session that ended from here on
	ended   map[clientv3.LeaseID]int64
	order   []clientv3.LeaseID // ended's sessions, oldest first
	subs    members[*sessionSub]
	stopped bool
}

// sessionSub is one stream's subscription to the end of its session.
type sessionSub struct {
	id   clientv3.LeaseID
	gone chan struct{}
	err  error // why gone was closed; set before
	// notify, if not nil, is called when gone closes, under the
	// sessionWatch's lock: it must only signal.
	notify func()

	// Guarded by the sessionWatch's mu:
	run  *sessionRun // the run that serves it; nil once it has left or ended
	from int64       // every deletion from here on reaches it
}

// subscribe subscribes to the end of session id, which existed at
// revision rev (a revision the store has reached), calling notify (if
// not nil) when the subscription ends. Ask covers next, and release the
// subscription with unsubscribe.
func (w *sessionWatch) subscribe(id clientv3.LeaseID, rev int64, notify func()) *sessionSub {
	w.mu.Lock()
	defer w.mu.Unlock()
	sub := &sessionSub{id: id, gone: make(chan struct{}), notify: notify}
	if w.closed {
		endSub(sub, ErrShuttingDown)
		return sub
	}
	if w.run == nil {
		w.run = w.start(rev + 1)
	}
	r := w.run
	sub.run, sub.from = r, r.next
	r.subs.add(id, sub)
	return sub
}

// covers reports whether sub hears of every end of its session after
// revision rev, at which the session existed; see sessionWatch. If the
// run's record shows the session ended after rev, it ends sub.
func (w *sessionWatch) covers(sub *sessionSub, rev int64) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	r := sub.run
	switch {
	case r == nil || sub.from <= rev+1:
		return true // ended, or the run hands it every deletion after rev
	case r.since > rev+1:
		return false
	}
	if d, ok := r.ended[sub.id]; ok && d > rev {
		w.leave(sub)
		endSub(sub, sessionEnded(d))
	}
	return true
}

// unsubscribe releases sub.
func (w *sessionWatch) unsubscribe(sub *sessionSub) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.leave(sub)
}

// leave takes sub off its run, if it is on one.
func (w *sessionWatch) leave(sub *sessionSub) {
	r := sub.run
	if r == nil {
		return
	}
	r.subs.remove(sub.id, sub)
	sub.run = nil
}

// close stops the shared watch and ends its subscriptions with
// ErrShuttingDown, as it does later ones at once.
func (w *sessionWatch) close() {
	w.mu.Lock()
	w.closed = true
	r := w.run
	if r != nil {
		w.failLocked(r, ErrShuttingDown)
	}
	w.mu.Unlock()
	if r != nil {
		<-r.done
	}
}

// start starts a run from revision next.
func (w *sessionWatch) start(next int64) *sessionRun {
	ctx, cancel := context.WithCancel(context.Background())
	r := &sessionRun{cancel: cancel, done: make(chan struct{}), next: next, since: next,
		ended: map[clientv3.LeaseID]int64{}, subs: members[*sessionSub]{}}
	go w.follow(ctx, r)
	return r
}

// follow hands out what r's watch reports until ctx ends or the watch
// fails.
func (w *sessionWatch) follow(ctx context.Context, r *sessionRun) {
	defer close(r.done)
	defer r.cancel()
	wch := w.cli.Watch(clientv3.WithRequireLeader(ctx), w.prefix, clientv3.WithPrefix(), clientv3.WithRev(r.next), clientv3.WithFilterPut())
	for {
		var wr clientv3.WatchResponse
		var ok bool
		select {
		case <-ctx.Done():
			return
		case wr, ok = <-wch:
		}
		if ctx.Err() != nil {
			return
		}
		if err := watchErr(wr, ok); err != nil {
			w.mu.Lock()
			w.failLocked(r, err)
			w.mu.Unlock()
			return
		}
		if !w.apply(r, wr) {
			return
		}
	}
}

// apply ends the subscriptions of the sessions whose keys wr deletes and
// records those ends. It reports false if r has stopped.
func (w *sessionWatch) apply(r *sessionRun, wr clientv3.WatchResponse) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if r.stopped {
		return false
	}
	for _, ev := range wr.Events {
		id, ok := w.sessionOf(string(ev.Kv.Key))
		if !ok {
			continue // the secret key beside it
		}
		rev := ev.Kv.ModRevision
		r.ended[id] = rev
		r.order = append(r.order, id)
		for _, sub := range r.subs[id] {
			sub.run = nil
			endSub(sub, sessionEnded(rev))
		}
		delete(r.subs, id)
	}
	r.next = max(r.next, progressRevision(wr)+1)
	if len(r.order) > w.record {
		drop := r.order[:len(r.order)-w.record/2]
		for _, id := range drop {
			r.since = max(r.since, r.ended[id]+1)
			delete(r.ended, id)
		}
		r.order = append([]clientv3.LeaseID(nil), r.order[len(drop):]...)
	}
	return true
}

// sessionOf returns the session whose session key is key.
func (w *sessionWatch) sessionOf(key string) (clientv3.LeaseID, bool) {
	hex, ok := strings.CutPrefix(key, w.prefix)
	if !ok || len(hex) != 16 {
		return 0, false
	}
	id, err := strconv.ParseInt(hex, 16, 64) // as sessionKey formats it
	if err != nil {
		return 0, false
	}
	return clientv3.LeaseID(id), true
}

// failLocked stops r and ends every subscription it holds with err.
func (w *sessionWatch) failLocked(r *sessionRun, err error) {
	r.cancel()
	r.stopped = true
	for _, subs := range r.subs {
		for _, sub := range subs {
			sub.run = nil
			endSub(sub, err)
		}
	}
	clear(r.subs)
	if w.run == r {
		w.run = nil
	}
}

// endSub closes sub with err, once.
func endSub(sub *sessionSub, err error) {
	select {
	case <-sub.gone:
	default:
		sub.err = err
		close(sub.gone)
		if sub.notify != nil {
			sub.notify()
		}
	}
}

// sessionEnded is the error that ends the stream of a session whose key
// was deleted at revision rev.
func sessionEnded(rev int64) error {
	return fmt.Errorf("%w: session ended at revision %d", ErrSessionNotFound, rev)
}
