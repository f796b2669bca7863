package server

import (
	"context"
	"errors"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// DefaultEtcdRequestTimeout is the bound that fencer serve puts on each
// etcd request with BoundRequests: longer than etcd's own request timeout
// (7 s at etcd's default election timeout), so that a slow etcd reports
// its own "request timed out" first.
const DefaultEtcdRequestTimeout = 10 * time.Second

// ErrEtcdUnreachable means one etcd request got no answer within the bound
// BoundRequests set: etcd is unreachable (no member answers, or none was
// ever connected) or too slow. A write that fails so may have committed.
// Clients see UNAVAILABLE, STORE_UNAVAILABLE, cause etcd_unreachable.
var ErrEtcdUnreachable = errors.New("server: etcd did not answer")

// errNoAnswer is the cause of a request context that BoundRequests ended.
var errNoAnswer = errors.New("server: etcd request bound reached")

// BoundRequests makes every unary request that cli sends through its KV
// and Lease (Get, Put, Delete, Do, Txn, Compact, Grant, Revoke,
// TimeToLive, Leases, KeepAliveOnce) fail with ErrEtcdUnreachable once it
// has waited d, unless its own context ends first. Without it, the etcd
// client waits for a connection for as long as the caller's context
// allows, so a call without a deadline hangs while etcd is unreachable.
// Call it once, before cli is used, and d must be positive.
//
// It does not bound watches, GetStream or KeepAlive streams, which are
// meant to last; and it cannot tell whether a write it ended reached
// etcd, so such a write may have committed.
func BoundRequests(cli *clientv3.Client, d time.Duration) {
	b := bound(d)
	cli.KV = &boundKV{KV: cli.KV, b: b}
	cli.Lease = &boundLease{Lease: cli.Lease, b: b}
}

// bound is the longest one etcd request may wait.
type bound time.Duration

// do runs f under a context that ends after b, turning its end into
// ErrEtcdUnreachable.
func do[T any](ctx context.Context, b bound, f func(context.Context) (T, error)) (T, error) {
	ctx2, cancel := context.WithTimeoutCause(ctx, time.Duration(b), errNoAnswer)
	defer cancel()
	resp, err := f(ctx2)
	return resp, b.check(ctx, ctx2, err)
}

// check returns ErrEtcdUnreachable for err if the request's context
// (bounded, a child of ctx) ended by the bound, and err otherwise.
func (b bound) check(ctx, bounded context.Context, err error) error {
	if err != nil && ctx.Err() == nil && errors.Is(context.Cause(bounded), errNoAnswer) {
		return fmt.Errorf("%w within %s (%v): it is unreachable or too slow; a write may have committed", ErrEtcdUnreachable, time.Duration(b), err)
	}
	return err
}

type boundKV struct {
	clientv3.KV
	b bound
}

func (k *boundKV) Put(ctx context.Context, key, val string, opts ...clientv3.OpOption) (*clientv3.PutResponse, error) {
	return do(ctx, k.b, func(ctx context.Context) (*clientv3.PutResponse, error) { return k.KV.Put(ctx, key, val, opts...) })
}

func (k *boundKV) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	return do(ctx, k.b, func(ctx context.Context) (*clientv3.GetResponse, error) { return k.KV.Get(ctx, key, opts...) })
}

func (k *boundKV) Delete(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.DeleteResponse, error) {
	return do(ctx, k.b, func(ctx context.Context) (*clientv3.DeleteResponse, error) { return k.KV.Delete(ctx, key, opts...) })
}

func (k *boundKV) Compact(ctx context.Context, rev int64, opts ...clientv3.CompactOption) (*clientv3.CompactResponse, error) {
	return do(ctx, k.b, func(ctx context.Context) (*clientv3.CompactResponse, error) { return k.KV.Compact(ctx, rev, opts...) })
}

func (k *boundKV) Do(ctx context.Context, op clientv3.Op) (clientv3.OpResponse, error) {
	return do(ctx, k.b, func(ctx context.Context) (clientv3.OpResponse, error) { return k.KV.Do(ctx, op) })
}

// Txn bounds the transaction from its creation to its Commit.
func (k *boundKV) Txn(ctx context.Context) clientv3.Txn {
	bounded, cancel := context.WithTimeoutCause(ctx, time.Duration(k.b), errNoAnswer)
	return &boundTxn{Txn: k.KV.Txn(bounded), ctx: ctx, bounded: bounded, cancel: cancel, b: k.b}
}

type boundTxn struct {
	clientv3.Txn
	ctx, bounded context.Context
	cancel       context.CancelFunc
	b            bound
}

func (t *boundTxn) If(cs ...clientv3.Cmp) clientv3.Txn   { t.Txn = t.Txn.If(cs...); return t }
func (t *boundTxn) Then(ops ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Then(ops...); return t }
func (t *boundTxn) Else(ops ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Else(ops...); return t }

func (t *boundTxn) Commit() (*clientv3.TxnResponse, error) {
	defer t.cancel()
	resp, err := t.Txn.Commit()
	return resp, t.b.check(t.ctx, t.bounded, err)
}

type boundLease struct {
	clientv3.Lease
	b bound
}

func (l *boundLease) Grant(ctx context.Context, ttl int64) (*clientv3.LeaseGrantResponse, error) {
	return do(ctx, l.b, func(ctx context.Context) (*clientv3.LeaseGrantResponse, error) { return l.Lease.Grant(ctx, ttl) })
}

func (l *boundLease) Revoke(ctx context.Context, id clientv3.LeaseID) (*clientv3.LeaseRevokeResponse, error) {
	return do(ctx, l.b, func(ctx context.Context) (*clientv3.LeaseRevokeResponse, error) { return l.Lease.Revoke(ctx, id) })
}

func (l *boundLease) TimeToLive(ctx context.Context, id clientv3.LeaseID, opts ...clientv3.LeaseOption) (*clientv3.LeaseTimeToLiveResponse, error) {
	return do(ctx, l.b, func(ctx context.Context) (*clientv3.LeaseTimeToLiveResponse, error) {
		return l.Lease.TimeToLive(ctx, id, opts...)
	})
}

func (l *boundLease) Leases(ctx context.Context) (*clientv3.LeaseLeasesResponse, error) {
	return do(ctx, l.b, func(ctx context.Context) (*clientv3.LeaseLeasesResponse, error) { return l.Lease.Leases(ctx) })
}

func (l *boundLease) KeepAliveOnce(ctx context.Context, id clientv3.LeaseID) (*clientv3.LeaseKeepAliveResponse, error) {
	return do(ctx, l.b, func(ctx context.Context) (*clientv3.LeaseKeepAliveResponse, error) {
		return l.Lease.KeepAliveOnce(ctx, id)
	})
}
