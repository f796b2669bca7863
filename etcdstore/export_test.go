package etcdstore

import "time"

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
