package fencertest

import (
	"github.com/fencer-dev/fencer/etcdstore"
	"github.com/fencer-dev/fencer/token"
)

// Holder is a held lease as Supersede sees it. *etcdstore.Lease and the
// gRPC client's *client.Lease are Holders.
type Holder interface {
	// Token returns the token of the acquisition to supersede.
	Token() token.Token
}

// superseder is the holder identity of the sessions Supersede opens.
const superseder = "fencertest-superseder"

// Supersede makes another holder acquire, at once, the lease that h holds
// in st, and returns that holder's acquisition, whose session is closed when
// t ends. h's holder key is deleted only if h's token is still current (the
// store's guarded Release), then a new session acquires the lease, so
// nothing waits for a TTL to run out.
//
// When Supersede returns, h's token is stale: every guarded write with it
// (Put, Delete, Txn, Advance, also through the gRPC service) fails in etcd
// with a *token.StaleError, whether or not h has noticed. h's Done closes as
// soon as its session's watch sees the holder key deleted; Supersede does not
// wait for that, so that a test can also try a write that races the news.
//
// Supersede fails t if h's token is not current, or if a waiter of the
// same lease (an Acquire elsewhere) wins the race for it: h is superseded
// then too, but not by the returned holder.
func Supersede(t TB, st *etcdstore.Store, h Holder) *etcdstore.Lease {
	t.Helper()
	tok := h.Token()
	ctx, cancel := stepContext()
	defer cancel()
	deleted, err := st.Release(ctx, tok)
	if err != nil {
		t.Fatalf("fencertest: supersede %s: %v", tok, err)
	}
	if !deleted {
		t.Fatalf("fencertest: supersede %s: not its lease's current token", tok)
	}
	l, err := Session(t, st, etcdstore.WithHolder(superseder)).TryAcquire(ctx, tok.Lease)
	if err != nil {
		t.Fatalf("fencertest: supersede %s: acquire: %v", tok, err)
	}
	return l
}
