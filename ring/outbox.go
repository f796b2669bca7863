package ring

import "sync"

// outbox holds the batches the loop has produced and the reader has not
// taken, so that the loop never waits for the reader: the snapshot, then
// every later change merged into one batch.
type outbox struct {
	mu      sync.Mutex
	pending []Batch
	closed  bool          // the loop has stopped: nothing more is put
	signal  chan struct{} // capacity 1: something was put, or closed
}

// put adds b to what is pending.
func (o *outbox) put(b Batch) {
	o.mu.Lock()
	if n := len(o.pending); n > 0 && !o.pending[n-1].Snapshot {
		o.pending[n-1].Changes = append(o.pending[n-1].Changes, b.Changes...)
		o.pending[n-1].Revision = b.Revision
	} else {
		o.pending = append(o.pending, b)
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

// take removes and returns the first pending batch (ok false if none),
// and whether the outbox is closed.
func (o *outbox) take() (b Batch, ok, closed bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.pending) > 0 {
		b, ok, o.pending = o.pending[0], true, o.pending[1:]
	}
	return b, ok, o.closed
}

// send delivers the outbox's batches on Updates until the outbox is
// closed and empty, or Close abandons them; then it closes Updates.
func (m *Member) send() {
	defer m.wg.Done()
	defer close(m.updates)
	for {
		select {
		case <-m.out.signal:
		case <-m.abandon:
			return
		}
		for {
			b, ok, closed := m.out.take()
			if !ok && closed {
				return
			}
			if !ok {
				break
			}
			select {
			case m.updates <- b:
			case <-m.abandon:
				return
			}
		}
	}
}
