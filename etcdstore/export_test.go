package etcdstore

import (
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// PauseBatching waits until s's batcher is idle, so that no Txn of an
// earlier write is still being sent, then marks it busy, so that writes
// queue up as they would behind a Txn in flight. It returns the number
// queued and resume, which sends them.
func PauseBatching(s *Store) (queued func() int, resume func()) {
	b := s.batch
	for {
		b.mu.Lock()
		if !b.busy {
			b.busy = true
			b.mu.Unlock()
			break
		}
		b.mu.Unlock()
		time.Sleep(time.Millisecond)
	}
	queued = func() int {
		b.mu.Lock()
		defer b.mu.Unlock()
		return len(b.queue)
	}
	return queued, b.next
}

// AcquireOnce sends one acquiring Txn of lease name on etcd lease id, built
// as acquire builds it from the epoch and lock-delay marker it reads first,
// with claim in place of the marker's claim when claim != 0, and reports
// whether it committed. It waits for nothing and starts no delay.
func AcquireOnce(ctx context.Context, s *Store, id clientv3.LeaseID, name string, claim int64) (bool, error) {
	resp, err := s.cli.Txn(ctx).Then(clientv3.OpGet(s.epochKey(name)), clientv3.OpGet(s.delayKey(name))).Commit()
	if err != nil {
		return false, err
	}
	var seen epochSeen
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) == 1 {
		seen.modRev = kvs[0].ModRevision
		if _, err := fmt.Sscan(string(kvs[0].Value), &seen.value); err != nil {
			return false, err
		}
	}
	var mark delayMarker
	if kvs := resp.Responses[1].GetResponseRange().Kvs; len(kvs) == 1 {
		if mark, err = decodeMarker(kvs[0].Value, kvs[0].ModRevision); err != nil {
			return false, err
		}
	}
	if claim != 0 {
		mark.claim = clientv3.LeaseID(claim)
	}
	cmps, then := s.acquireOps(id, "skipper", name, 0, seen, mark, nil)
	tr, err := s.cli.Txn(ctx).If(cmps...).Then(then...).Commit()
	if err != nil {
		return false, err
	}
	return tr.Succeeded, nil
}
