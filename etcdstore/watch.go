package etcdstore

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v5"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencer-dev/fencer/internal/holderkey"
)

// Watch recovery is paced by an exponential backoff with jitter: after the
// session's watch breaks, it waits watchRetryInitial before reading the
// holder keys again, twice as long after each attempt that fails, up to
// watchRetryMax, each wait drawn at random from ±50% of its nominal value
// (so at most 1.5 × watchRetryMax). The backoff starts over once etcd has
// accepted a new watch, and a wait ends early when a keepalive succeeds
// after failing (etcd is back), so that recovery does not wait out the
// backoff. Sessions that lose their watch together (etcd lost its leader,
// say) thus spread their reads over time instead of re-reading the holder
// keys in lockstep, and a long outage costs each session a handful of
// reads instead of one every 50 ms.
const (
	watchRetryInitial = 50 * time.Millisecond
	watchRetryMax     = 5 * time.Second
)

func newWatchBackOff() backoff.BackOff {
	return &backoff.ExponentialBackOff{
		InitialInterval:     watchRetryInitial,
		RandomizationFactor: 0.5,
		Multiplier:          2,
		MaxInterval:         watchRetryMax,
	}
}

// observation is the state of a holder key at revision at: kv, or absent
// when kv is nil.
type observation struct {
	at int64
	kv *mvccpb.KeyValue
}

// watch follows every holder key under the store's prefix from rev on and
// ends a held Lease as soon as its key is deleted or replaced. It is the
// session's one watch, whatever the number of leases. When the watch
// breaks (compaction, leader loss, a member restart) it re-reads the
// holder keys before watching again from the revision it read them at, so
// no loss is missed; it retries that read with backoff (newWatchBackOff).
func (s *Session) watch(rev int64) {
	defer s.wg.Done()
	prefix := s.store.holderKey("")
	retry := s.retry()
	for {
		s.follow(prefix, rev, retry)
		for {
			if !s.pause(retry.NextBackOff()) {
				return
			}
			if h := s.hooks.resync; h != nil {
				h()
			}
			next, err := s.resync(prefix)
			if err == nil {
				rev = next
				break
			}
		}
	}
}

// follow applies every change to a holder key from rev on until the watch
// breaks or the session ends. Once etcd has accepted the watch, retry
// starts over.
func (s *Session) follow(prefix string, rev int64, retry backoff.BackOff) {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(s.ctx))
	defer cancel()
	if h := s.hooks.watching; h != nil {
		h(cancel)
	}
	for resp := range s.store.cli.Watch(wctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(rev), clientv3.WithCreatedNotify()) {
		if resp.CompactRevision != 0 || resp.Err() != nil {
			return
		}
		if resp.Created {
			retry.Reset()
			select {
			case <-s.renewed: // news of a recovery that this watch has seen
			default:
			}
			continue
		}
		for _, ev := range resp.Events {
			o := observation{at: ev.Kv.ModRevision, kv: ev.Kv}
			if ev.Type == mvccpb.DELETE {
				o.kv = nil
			}
			s.observe(strings.TrimPrefix(string(ev.Kv.Key), prefix), o)
		}
		if h := s.hooks.observed; h != nil {
			seen := resp.Header.Revision
			if n := len(resp.Events); n > 0 {
				seen = resp.Events[n-1].Kv.ModRevision
			}
			h(seen)
		}
	}
}

// pause waits for d, or until a keepalive succeeds after failing, and
// reports false if the session ended first.
func (s *Session) pause(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-s.ctx.Done():
		return false
	case <-t.C:
	case <-s.renewed:
	}
	return true
}

// resync reads every holder key and applies what it read, at the revision
// it read at, to the held leases and to the names being acquired. It
// returns the revision to watch from next.
func (s *Session) resync(prefix string) (int64, error) {
	ctx, cancel := context.WithTimeout(s.ctx, s.ttl)
	defer cancel()
	resp, err := s.store.cli.Get(ctx, prefix, clientv3.WithPrefix())
	if err != nil {
		return 0, err
	}
	rev := resp.Header.Revision
	if h := s.hooks.reread; h != nil {
		h(rev)
	}
	present := map[string]*mvccpb.KeyValue{}
	for _, kv := range resp.Kvs {
		present[strings.TrimPrefix(string(kv.Key), prefix)] = kv
	}
	s.mu.Lock()
	names := make([]string, 0, len(s.held))
	for name := range s.held {
		names = append(names, name)
	}
	for name, p := range s.pending {
		p.see(observation{at: rev, kv: present[name]})
	}
	s.mu.Unlock()
	for _, name := range names {
		s.observe(name, observation{at: rev, kv: present[name]})
	}
	if h := s.hooks.observed; h != nil {
		h(rev)
	}
	return rev + 1, nil
}

// observe applies o, an observed state of holder key name, to the Lease
// held under name, or keeps it for an acquisition of name in flight.
func (s *Session) observe(name string, o observation) {
	s.mu.Lock()
	l := s.held[name]
	if p := s.pending[name]; l == nil && p != nil {
		p.see(o)
	}
	s.mu.Unlock()
	if l != nil {
		s.apply(l, o)
	}
}

// see keeps o if it is the latest state seen. Once an acquisition's key is
// deleted or replaced, every later state shows it gone, so the latest
// state is all that register needs. s.mu must be held.
func (p *pendingName) see(o observation) {
	if p.seen == nil || o.at >= p.seen.at {
		p.seen = &o
	}
}

// apply ends l if o shows l's holder key, after l's acquisition, deleted,
// replaced (another create revision) or naming another holder. A state
// from before the acquisition says nothing about it.
func (s *Session) apply(l *Lease, o observation) {
	name := l.tok.Lease
	var reason error
	switch {
	case o.at < l.tok.Revision:
		return
	case o.kv == nil:
		reason = fmt.Errorf("%w: holder key of %q deleted", ErrLeaseLost, name)
	case o.kv.CreateRevision != l.tok.Revision:
		reason = fmt.Errorf("%w: holder key of %q replaced at revision %d", ErrLeaseLost, name, o.kv.CreateRevision)
	default:
		holder := holderkey.Decode(o.kv.Value).Holder
		if holder == s.holder {
			return
		}
		reason = fmt.Errorf("%w: holder key of %q now names %q", ErrLeaseLost, name, holder)
	}
	s.forget(l)
	l.end(reason)
}
