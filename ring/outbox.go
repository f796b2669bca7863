package ring

import "sync"

// outbox holds the batches the loop has produced and the reader has not
// taken, merged into one, so that the loop never waits for the reader.
type outbox struct {
	mu      sync.Mutex
	pending *Batch
	closed  bool          // the loop has stopped: nothing more is put
	signal  chan struct{} // capacity 1: something was put, or closed
}

// put adds b to what is pending.
func (o *outbox) put(b Batch) {
	o.mu.Lock()
	if o.pending == nil {
		o.pending = &b
	} else {
		*o.pending = merge(*o.pending, b)
	}
	o.mu.Unlock()
	o.poke()
}

// close records that nothing more will be put.
func (o *outbox) close() {
	o.mu.Lock()
	o.closed = true
	o.mu.Unlock()
	o.poke()
}

func (o *outbox) poke() {
	select {
	case o.signal <- struct{}{}:
	default:
	}
}

// take returns the pending batch, if any, and whether the outbox is
// closed.
func (o *outbox) take() (b *Batch, closed bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	b, o.pending = o.pending, nil
	return b, o.closed
}

// merge returns the batch that a followed by b amounts to. A snapshot
// stays a snapshot of what is held after b's changes.
func merge(a, b Batch) Batch {
	if !a.Snapshot {
		a.Changes = append(a.Changes, b.Changes...)
		a.Revision = max(a.Revision, b.Revision)
		return a
	}
	var order []string
	held := map[string][]Change{}
	for _, c := range append(a.Changes, b.Changes...) {
		switch c.Kind {
		case Gained:
			if _, ok := held[c.Shard]; !ok {
				order = append(order, c.Shard)
			}
			held[c.Shard] = []Change{c}
		case Losing:
			held[c.Shard] = append(held[c.Shard], c)
		case Lost:
			delete(held, c.Shard)
		}
	}
	out := Batch{Snapshot: true, Revision: max(a.Revision, b.Revision)}
	for _, s := range order {
		if cs, ok := held[s]; ok {
			out.Changes = append(out.Changes, cs...)
			delete(held, s) // a shard gained, lost and gained again is listed once
		}
	}
	return out
}

// send delivers the outbox's batches on Updates until the outbox is
// closed and empty, or Close abandons them; then it closes Updates.
func (m *Member) send() {
	defer m.wg.Done()
	defer close(m.updates)
	var cur *Batch
	for {
		if cur == nil {
			b, closed := m.out.take()
			if b == nil && closed {
				return
			}
			cur = b
		}
		var out chan<- Batch
		var next Batch
		if cur != nil {
			out, next = m.updates, *cur
		}
		select {
		case out <- next:
			cur = nil
		case <-m.out.signal:
			if b, _ := m.out.take(); b != nil {
				if cur == nil {
					cur = b
				} else {
					merged := merge(*cur, *b)
					cur = &merged
				}
			}
		case <-m.abandon:
			return
		}
	}
}
