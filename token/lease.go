package token

import (
	"context"
	"time"
)

// Holder is one held acquisition of a lease, whatever holds it: an
// etcdstore.Lease, a client.Lease (through fencer's gRPC service) or a
// kubeadapter.Held. Helpers that fence a write take a Holder, so the same
// code writes with whichever kind of lease a process holds.
//
// A Holder is advisory about loss: Context and Err report an end only once
// this process has seen it. A write is fenced by the store's check of
// Token, never by Err being nil.
type Holder interface {
	// Token returns the acquisition's token. It never changes.
	Token() Token
	// Context returns a context that is done once the acquisition has
	// ended; its cause (context.Cause) is what Err returns.
	Context() context.Context
	// Err returns nil while the lease is held and, once it is not, why it
	// ended; the error matches ErrNotHeld.
	Err() error
}

// DefaultTTL is the session TTL of the etcd store's library (package
// etcdstore) and of the gRPC client (package client) unless the caller
// sets another: holder keys vanish this long after their process stops
// renewing them.
const DefaultTTL = 10 * time.Second

// Status is a lease's holder as a store reports it (etcdstore.Store.List,
// client.Client.List). It may be stale by the time it is read.
type Status struct {
	// Name is the lease name.
	Name string
	// Token is the current token; zero if the lease is free.
	Token Token
	// Holder is the holder identity; empty if the lease is free.
	Holder string
	// Epoch is the acquisition counter, also when the lease is free.
	Epoch uint64
	// LockDelay is the lock-delay recorded for the lease; 0 if none. For a
	// held lease it is the one its acquisition set, which applies if the
	// acquisition ends without its holder's clean release. For a free
	// lease it is the delay that refuses every acquirer until it has
	// passed (see LockDelayStarted); 0 once it has passed.
	LockDelay time.Duration
	// LockDelayStarted reports, for a free lease with a LockDelay, whether
	// an acquirer has started the delay: it then runs on the store's clock
	// and the lease is free to acquire once it has passed. If not, the next
	// acquirer starts it and is refused. It is false for a held lease. The
	// time left is not reported here; a refused acquisition's
	// *LockDelayError carries it.
	LockDelayStarted bool
}

// Value is a guarded data value with the revisions the store recorded for
// it (etcdstore.Store.Get, client.Client.Get).
type Value struct {
	Data           []byte
	CreateRevision int64
	ModRevision    int64
}

// Ended returns nil while ctx is not done, and then context.Cause(ctx):
// what a Holder's Err returns for the Context its Holder gives, once the
// Holder ends its Context with the reason as cause.
func Ended(ctx context.Context) error {
	if ctx.Err() == nil {
		return nil
	}
	return context.Cause(ctx)
}
