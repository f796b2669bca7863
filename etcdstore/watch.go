package etcdstore

import (
	"context"
	"fmt"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// watch follows every holder key under the store's prefix from rev on and
// ends a held Lease as soon as its key is deleted or replaced. It is the
// session's one watch, whatever the number of leases. When the watch
// breaks (compaction, leader loss, a member restart) it re-reads the
// holder keys before watching again, so no loss is missed.
func (s *Session) watch(rev int64) {
	defer s.wg.Done()
	prefix := s.store.prefix + "leases/"
	for {
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(s.ctx))
		for resp := range s.store.cli.Watch(wctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(rev)) {
			if resp.CompactRevision != 0 || resp.Err() != nil {
				break
			}
			for _, ev := range resp.Events {
				s.observe(strings.TrimPrefix(string(ev.Kv.Key), prefix), ev.Type == mvccpb.DELETE, ev.Kv)
			}
			rev = resp.Header.Revision + 1
		}
		cancel()
		for {
			select {
			case <-s.ctx.Done():
				return
			case <-time.After(50 * time.Millisecond):
			}
			next, err := s.resync(prefix)
			if err == nil {
				rev = next
				break
			}
		}
	}
}

// resync reads every holder key and ends the held leases whose key is gone
// or replaced. It returns the revision to watch from next.
func (s *Session) resync(prefix string) (int64, error) {
	ctx, cancel := context.WithTimeout(s.ctx, s.ttl)
	defer cancel()
	resp, err := s.store.cli.Get(ctx, prefix, clientv3.WithPrefix())
	if err != nil {
		return 0, err
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
	s.mu.Unlock()
	for _, name := range names {
		kv, ok := present[name]
		s.observe(name, !ok, kv)
	}
	return resp.Header.Revision + 1, nil
}

// observe applies one observed state of holder key name: deleted, or kv.
func (s *Session) observe(name string, deleted bool, kv *mvccpb.KeyValue) {
	s.mu.Lock()
	l := s.held[name]
	s.mu.Unlock()
	if l == nil {
		return
	}
	var reason error
	switch {
	case deleted && (kv == nil || kv.ModRevision > l.tok.Revision):
		reason = fmt.Errorf("%w: holder key of %q deleted", ErrLeaseLost, name)
	case deleted:
		return // an event from before this acquisition
	case kv.CreateRevision != l.tok.Revision:
		if kv.ModRevision <= l.tok.Revision {
			return
		}
		reason = fmt.Errorf("%w: holder key of %q replaced at revision %d", ErrLeaseLost, name, kv.CreateRevision)
	default:
		holder := decodeRecord(kv.Value).Holder
		if holder == s.holder {
			return
		}
		reason = fmt.Errorf("%w: holder key of %q now names %q", ErrLeaseLost, name, holder)
	}
	s.forget(l)
	l.end(reason)
}
