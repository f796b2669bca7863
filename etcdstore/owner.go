package etcdstore

import (
	"context"
	"fmt"
	"strings"
	"sync"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencer-dev/fencer/token"
)

// Keys belong to leases.
//
// Every data key that a guarded write has written has an owner record,
// <prefix>owners/<key> = "<lease> <token>": the lease that owns the key
// and the token of the last guarded write of it, which is of that lease. A
// guarded write of a data key (Put, Delete, or a Txn that puts or deletes
// it) commits only if its token is current (the guard) and, in the same
// etcd Txn, its lease owns the key or nobody does; the write then records
// its own token as the owner's, unless it is already recorded. So once
// lease L has written a key, a holder of another lease cannot overwrite or
// delete it, however current its own token: it gets a
// *token.ForeignLeaseError and nothing changes. The owner record outlives
// a Delete, so a deleted key stays L's and nobody else can recreate it.
//
// Only an explicit takeover (the TakeOver write option) moves a key to
// another lease. It is fenced like any other write: it commits only while
// the taker's token is current, and it then records the taker's token as
// the owner's, after which the previous owner's writes are refused in
// turn.
//
// Only guarded writes write owner records, each under the full guard of
// the token it records (the holder key's create revision and the epoch
// key's value). So a record naming token T proves that T was exactly
// current when it was written, and a later write by T needs only compare
// the holder key's create revision and the record: if T's acquisition is
// still the current one, T is still exact. That is the cheapest Txn for
// etcd, two compares, and the one a lease's repeated writes of its keys
// take.
//
// Advance resources follow the same rule with no extra key: the token
// recorded in <prefix>fences/<resource> names the lease that owns it.

// WriteOption modifies one guarded write: Put, Delete, Txn or Advance. It
// is token.WriteOption, the one the gRPC client takes too.
type WriteOption = token.WriteOption

// TakeOver makes a write take over the data keys it writes (or the
// resource it advances) from whichever lease owns them, instead of
// failing with a *token.ForeignLeaseError. The takeover is fenced like any
// other write: it commits only if the writer's token is its lease's
// current token, checked in the same etcd Txn, and it records the
// writer's lease as the new owner, so the previous owner's later writes
// are refused. A Txn with TakeOver takes over every data key that the
// branch which runs puts or deletes. Taking over a key the lease already
// owns, or one nobody owns, is an ordinary write.
func TakeOver() WriteOption { return token.TakeOver() }

func (s *Store) ownerKey(key string) string { return s.prefix + "owners/" + key }

// OwnerKey returns the etcd key of the data key key's owner record,
// "<lease> <token>" (see ParseOwnerRecord). Only guarded writes of key
// write it.
func (s *Store) OwnerKey(key string) string { return s.ownerKey(key) }

// ownerRecord is the owner record of a key that tok writes.
func ownerRecord(tok token.Token) string { return tok.Lease + " " + tok.String() }

// ParseOwnerRecord reads an owner record, "<lease> <token>", where token
// is the text form of a token of lease: the lease that owns a data key and
// the token of the last guarded write of the key. It accepts only what
// guarded writes record, so that formatting the result gives back rec; it
// returns a *token.MalformedError otherwise.
func ParseOwnerRecord(rec string) (token.Token, error) {
	lease, text, ok := strings.Cut(rec, " ")
	if !ok {
		return token.Token{}, &token.MalformedError{Field: "owner record", Input: truncate(rec), Reason: `want "<lease> <token>"`}
	}
	tok, err := token.Parse(text)
	if err != nil {
		return token.Token{}, err
	}
	if tok.Lease != lease {
		return token.Token{}, &token.MalformedError{Field: "owner record", Input: truncate(rec), Reason: "the token is of another lease"}
	}
	if err := validToken(tok); err != nil {
		return token.Token{}, err
	}
	return tok, nil
}

func truncate(s string) string {
	if len(s) > 64 {
		return s[:64]
	}
	return s
}

// ownerLease returns the lease of an owner record as read from etcd: the
// text before its first space. Guarded writes record only well-formed
// records; a record that something else wrote still names its lease this
// way, which is how a "owned by the lease" compare reads it.
func ownerLease(rec string) string {
	lease, _, _ := strings.Cut(rec, " ")
	return lease
}

// foreignTo returns compares each of which holds, on its own, exactly
// when key's owner record exists and does not name lease (whatever its
// token): its value sorts at or before "<lease> " (below "<lease> \x00"),
// after "<lease>!", or is "<lease>!". No lease name holds a byte below "!",
// so every other lease's record is among them, and every value sorting
// strictly between "<lease> " and "<lease>!" (a record of lease's) is in
// none. Like every value compare, they all fail when the key has no
// record, which is what lets ownedOps put the record and the write in the
// one branch where all of them failed.
func (s *Store) foreignTo(key, lease string) []clientv3.Cmp {
	owner := s.ownerKey(key)
	return []clientv3.Cmp{
		clientv3.Compare(clientv3.Value(owner), "<", lease+" \x00"),
		clientv3.Compare(clientv3.Value(owner), ">", lease+"!"),
		clientv3.Compare(clientv3.Value(owner), "=", lease+"!"),
	}
}

// Owner returns the token recorded for the data key key: its Lease is
// the lease that owns key, and it is the token of the last guarded write
// of key. ok is false when no guarded write has written key yet. The
// answer may be stale when it returns; the guarded writes check ownership
// themselves. A record that a guarded write did not write yields a
// *token.MalformedError.
func (s *Store) Owner(ctx context.Context, key string) (tok token.Token, ok bool, err error) {
	if err := ValidateKey(key); err != nil {
		return token.Token{}, false, err
	}
	resp, err := s.cli.Get(ctx, s.ownerKey(key))
	if err != nil {
		return token.Token{}, false, fmt.Errorf("etcdstore: owner of %q: %w", key, err)
	}
	if len(resp.Kvs) == 0 {
		return token.Token{}, false, nil
	}
	tok, err = ParseOwnerRecord(string(resp.Kvs[0].Value))
	if err != nil {
		return token.Token{}, false, fmt.Errorf("etcdstore: owner of %q: %w", key, err)
	}
	return tok, true, nil
}

// maxOwnerGuesses bounds ownerGuesses; past it the guesses start over.
const maxOwnerGuesses = 1 << 16

// ownerGuesses remembers, per data key, the owner record a store last saw
// for it, so that a write takes the cheapest Txn. A wrong or missing guess
// costs a round trip or a nested Txn, never correctness.
type ownerGuesses struct {
	mu   sync.Mutex
	seen map[string]ownerGuess
}

// ownerGuess is a key's owner record as a store last saw it, and the
// token it records when the store wrote it itself (zero when it read it),
// so that a write by that token knows the record is its own without
// formatting the record again.
type ownerGuess struct {
	rec string
	tok token.Token
}

func (g *ownerGuesses) get(key string) string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.seen[key].rec
}

// getFor returns key's guessed owner record and whether it is the record
// of tok, as this store wrote it (putMine).
func (g *ownerGuesses) getFor(key string, tok token.Token) (rec string, mine bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	e := g.seen[key]
	return e.rec, e.rec != "" && e.tok == tok
}

// put records rec, read from etcd, as key's owner record; "" forgets the
// key.
func (g *ownerGuesses) put(key, rec string) { g.set(key, ownerGuess{rec: rec}) }

// putMine records rec, which is ownerRecord(tok), as key's owner record.
func (g *ownerGuesses) putMine(key string, tok token.Token, rec string) {
	g.set(key, ownerGuess{rec: rec, tok: tok})
}

func (g *ownerGuesses) set(key string, e ownerGuess) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if e.rec == "" {
		delete(g.seen, key)
		return
	}
	old, ok := g.seen[key]
	if ok && old.rec == e.rec && (e.tok.IsZero() || old.tok == e.tok) {
		return // a record read back keeps the token it was written with
	}
	if g.seen == nil || (!ok && len(g.seen) >= maxOwnerGuesses) {
		g.seen = map[string]ownerGuess{}
	}
	g.seen[key] = e
}

// ownerOf reads the owner record from a Get's response; "" if absent.
func ownerOf(r *pb.ResponseOp) string {
	if kvs := r.GetResponseRange().GetKvs(); len(kvs) == 1 {
		return string(kvs[0].Value)
	}
	return ""
}
