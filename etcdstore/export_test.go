package etcdstore

// PauseBatching marks s's batcher busy, so that writes queue up as they
// would behind a Txn in flight. It returns the number queued and resume,
// which sends them.
func PauseBatching(s *Store) (queued func() int, resume func()) {
	b := s.batch
	b.mu.Lock()
	b.busy = true
	b.mu.Unlock()
	queued = func() int {
		b.mu.Lock()
		defer b.mu.Unlock()
		return len(b.queue)
	}
	return queued, b.next
}
