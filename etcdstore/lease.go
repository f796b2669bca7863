package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencer-dev/fencer/token"
)

// Lease is one acquisition of a named lease, held through a Session. Its
// Token is fixed for its lifetime. Methods are safe for concurrent use.
type Lease struct {
	sess *Session
	tok  token.Token

	done chan struct{}
	once sync.Once
	mu   sync.Mutex
	err  error
}

// Token returns the fencing token of this acquisition.
func (l *Lease) Token() token.Token { return l.tok }

// Done is closed when this acquisition ends: released, its holder key
// deleted or replaced by someone else, or its session ended. Done closing
// is prompt but advisory; writes are fenced by the store, not by Done.
func (l *Lease) Done() <-chan struct{} { return l.done }

// Err returns nil while the lease is held and then why it ended:
// ErrReleased, ErrLeaseLost, ErrSessionClosed or ErrSessionExpired, wrapped
// with detail. All of them also match token.ErrNotHeld.
func (l *Lease) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// Guard returns the etcd condition that holds while this acquisition is
// current; see Store.Guard.
func (l *Lease) Guard() clientv3.Cmp { return l.sess.store.guard(l.tok) }

// Release deletes the holder key if and only if it is still this
// acquisition's, so a retried or late Release never deletes a newer
// holder's key. It ends the Lease with ErrReleased. Releasing a lease that
// has already ended changes nothing in etcd and returns nil.
func (l *Lease) Release(ctx context.Context) error {
	key := l.sess.store.holderKey(l.tok.Lease)
	_, err := l.sess.store.cli.Txn(ctx).
		If(l.Guard()).
		Then(clientv3.OpDelete(key)).
		Commit()
	if err != nil {
		return fmt.Errorf("etcdstore: release %s: %w", l.tok, err)
	}
	l.sess.forget(l)
	l.end(ErrReleased)
	return nil
}

func (l *Lease) end(reason error) {
	l.once.Do(func() {
		l.mu.Lock()
		l.err = fmt.Errorf("%w (%w)", reason, token.ErrNotHeld)
		l.mu.Unlock()
		close(l.done)
	})
}

// TryAcquire acquires lease name if it is free and returns at once
// otherwise, with a *token.HeldError naming the current holder (this
// session included, if it already holds name). The acquisition and the
// epoch bump are one etcd Txn.
func (s *Session) TryAcquire(ctx context.Context, name string) (*Lease, error) {
	l, _, err := s.tryAcquire(ctx, name)
	return l, err
}

// tryAcquire returns the revision at which a held lease was seen, so that
// Acquire can wait for its deletion from there.
func (s *Session) tryAcquire(ctx context.Context, name string) (*Lease, int64, error) {
	if err := ValidateName("name", name); err != nil {
		return nil, 0, err
	}
	st := s.store
	hk, ek := st.holderKey(name), st.epochKey(name)
	// Start from the epoch this session last saw, so that the common case
	// is a single Txn; a wrong guess costs one more round trip.
	s.mu.Lock()
	seen := s.epochs[name]
	s.mu.Unlock()
	for {
		if err := s.ctx.Err(); err != nil {
			return nil, 0, s.Err()
		}
		epoch := seen.value + 1
		resp, err := st.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(hk), "=", 0),
				clientv3.Compare(clientv3.ModRevision(ek), "=", seen.modRev)).
			Then(clientv3.OpPut(hk, encodeRecord(record{Holder: s.holder, Epoch: epoch}), clientv3.WithLease(s.id)),
				clientv3.OpPut(ek, strconv.FormatUint(epoch, 10))).
			Else(clientv3.OpGet(hk), clientv3.OpGet(ek)).
			Commit()
		if err != nil {
			return nil, 0, fmt.Errorf("etcdstore: acquire %q: %w", name, err)
		}
		if resp.Succeeded {
			s.rememberEpoch(name, epochSeen{value: epoch, modRev: resp.Header.Revision})
			l := &Lease{sess: s, tok: token.Token{Lease: name, Epoch: epoch, Revision: resp.Header.Revision}, done: make(chan struct{})}
			if err := s.remember(l); err != nil {
				return nil, 0, err
			}
			return l, 0, nil
		}
		seen = epochSeen{}
		if kvs := resp.Responses[1].GetResponseRange().Kvs; len(kvs) == 1 {
			seen.modRev = kvs[0].ModRevision
			if seen.value, err = strconv.ParseUint(string(kvs[0].Value), 10, 64); err != nil {
				return nil, 0, fmt.Errorf("etcdstore: acquire %q: corrupt epoch %q", name, kvs[0].Value)
			}
		}
		s.rememberEpoch(name, seen)
		if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) == 1 {
			return nil, resp.Header.Revision, &token.HeldError{Lease: name, Holder: decodeRecord(kvs[0].Value).Holder}
		}
		// Only the epoch differed from the guess: retry with the one read.
	}
}

// epochSeen is the last value and mod revision of an epoch key that a
// session saw.
type epochSeen struct {
	value  uint64
	modRev int64
}

func (s *Session) rememberEpoch(name string, e epochSeen) {
	s.mu.Lock()
	s.epochs[name] = e
	s.mu.Unlock()
}

// Acquire acquires lease name, waiting while another holder has it. It
// returns when acquired, or with ctx's error when ctx ends first, or with
// the session's error if the session ends. Waiters are not queued: when a
// holder key is deleted, all waiters race for it.
func (s *Session) Acquire(ctx context.Context, name string) (*Lease, error) {
	for {
		l, seenAt, err := s.tryAcquire(ctx, name)
		if !errors.Is(err, token.ErrHeldByAnother) {
			return l, err
		}
		if err := s.waitDelete(ctx, name, seenAt); err != nil {
			return nil, err
		}
	}
}

// waitDelete waits until the holder key of name is deleted after rev.
func (s *Session) waitDelete(ctx context.Context, name string, rev int64) error {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := s.store.cli.Watch(wctx, s.store.holderKey(name), clientv3.WithRev(rev+1), clientv3.WithFilterPut())
	for {
		select {
		case <-s.ctx.Done():
			return s.Err()
		case <-ctx.Done():
			return ctx.Err()
		case resp, ok := <-wch:
			if !ok || resp.Err() != nil {
				// The watch broke (compaction, leader loss): re-read instead.
				return nil
			}
			for _, ev := range resp.Events {
				if ev.Type == mvccpb.DELETE {
					return nil
				}
			}
		}
	}
}

// remember registers l with the session's watch. If the session has
// already ended, l ends too and the session's error is returned; l's key
// is attached to the session's etcd lease and goes with it.
func (s *Session) remember(l *Lease) error {
	s.mu.Lock()
	err := s.err
	if err == nil {
		s.held[l.tok.Lease] = l
	}
	s.mu.Unlock()
	if err != nil {
		l.end(err)
	}
	return err
}

func (s *Session) forget(l *Lease) {
	s.mu.Lock()
	if s.held[l.tok.Lease] == l {
		delete(s.held, l.tok.Lease)
	}
	s.mu.Unlock()
}
