package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencer-dev/fencer/internal/holderkey"
	"github.com/fencer-dev/fencer/token"
)

// Limits on input, checked before anything is sent to etcd.
const (
	// MaxNameLen is the longest lease or resource name, in bytes
	// (token.MaxNameLen).
	MaxNameLen = token.MaxNameLen
	// MaxKeyLen is the longest data key, in bytes.
	MaxKeyLen = 1024
	// MaxValueLen is the largest data value, in bytes. etcd's own request
	// limit (1.5 MiB by default) also applies.
	MaxValueLen = 1 << 20
	// DefaultPrefix is the key prefix a Store uses unless WithPrefix says
	// otherwise.
	DefaultPrefix = "/fencer/"
)

// Store issues and checks fencing tokens in etcd under one key prefix. All
// its state is in etcd: beyond its client it keeps only guesses (the epoch
// it last saw per lease name, to acquire in one round trip, and the owner
// it last saw per data key, to write with the cheapest Txn) and the writes
// it is batching, so several Stores (in one process or many) may share a
// prefix. Methods are safe for concurrent use.
type Store struct {
	cli    *clientv3.Client
	prefix string
	batch  *batcher // nil when batching is off
	epochs epochGuesses
	owners ownerGuesses
}

// Option configures a Store.
type Option func(*Store)

// WithPrefix sets the key prefix; it must end in "/". Stores whose prefixes
// are not nested (neither is a prefix of the other) are independent; a
// Store whose prefix lies inside another's can have its keys written by the
// other's data writes (CheckPrefix detects some of these).
func WithPrefix(prefix string) Option { return func(s *Store) { s.prefix = prefix } }

// New returns a Store that uses cli. The Store does not close cli.
func New(cli *clientv3.Client, opts ...Option) (*Store, error) {
	s := &Store{cli: cli, prefix: DefaultPrefix}
	if cli == nil {
		return nil, invalid("client", "", "nil")
	}
	WithBatching(DefaultBatch)(s)
	for _, o := range opts {
		o(s)
	}
	if !strings.HasSuffix(s.prefix, "/") || !utf8.ValidString(s.prefix) {
		return nil, invalid("prefix", s.prefix, `must be valid UTF-8 and end in "/"`)
	}
	return s, nil
}

// Client returns the etcd client the Store uses.
func (s *Store) Client() *clientv3.Client { return s.cli }

// Prefix returns the Store's key prefix.
func (s *Store) Prefix() string { return s.prefix }

func (s *Store) holderKey(name string) string { return holderkey.Key(s.prefix, name) }

// HolderKey returns the etcd key of lease name's holder record, the key
// whose create revision is the lease's current token's revision. For a
// prefix of lease names (for example "ring:r:"), it is the prefix of the
// holder keys of every lease whose name starts with it, for a Get or Watch
// WithPrefix; HolderKey("") is the prefix of every holder key.
func (s *Store) HolderKey(name string) string { return holderkey.Key(s.prefix, name) }

// HolderOf reads kv, the holder key of lease name as seen in a Get or a
// watch event: the lease's current token and the identity of its holder.
// A value written by something other than fencer yields its raw text as
// the holder and epoch 0.
func HolderOf(name string, kv *mvccpb.KeyValue) (tok token.Token, holder string) {
	return holderkey.Of(name, kv)
}

func (s *Store) epochKey(name string) string     { return s.prefix + "epochs/" + name }
func (s *Store) fenceKey(resource string) string { return s.prefix + "fences/" + resource }

// DataKey returns the etcd key under which Put, Get and Delete store key.
func (s *Store) DataKey(key string) string { return s.prefix + "data/" + key }

// ValidateName checks a lease or resource name: 1 to MaxNameLen bytes of
// UTF-8 without "/", spaces or control characters. It is
// token.ValidateName, the one name check of the store, the server and the
// client.
func ValidateName(arg, name string) error { return token.ValidateName(arg, name) }

// ValidateKey checks a data key: 1 to MaxKeyLen bytes of UTF-8 without
// control characters. "/" is allowed, so keys may form a hierarchy.
func ValidateKey(key string) error {
	switch {
	case key == "":
		return invalid("key", key, "empty")
	case len(key) > MaxKeyLen:
		return invalid("key", key, "longer than "+strconv.Itoa(MaxKeyLen)+" bytes")
	case !utf8.ValidString(key):
		return invalid("key", key, "not valid UTF-8")
	case strings.IndexFunc(key, unicode.IsControl) >= 0:
		return invalid("key", key, "contains a control character")
	}
	return nil
}

// ValidateValue checks a data value's size.
func ValidateValue(value []byte) error {
	if len(value) > MaxValueLen {
		return invalid("value", fmt.Sprintf("%d bytes", len(value)), "larger than "+strconv.Itoa(MaxValueLen)+" bytes")
	}
	return nil
}

// validToken checks that tok could have been issued by this store.
func validToken(tok token.Token) error {
	if err := tok.Validate(); err != nil {
		return err
	}
	if err := ValidateName("lease", tok.Lease); err != nil {
		return &token.MalformedError{Field: "lease", Input: tok.Lease, Reason: err.(*ArgumentError).Reason}
	}
	return nil
}

// Status is token.Status: a lease's holder as the store sees it.
type Status = token.Status

// Status reads the current holder of lease name. The answer may be stale by
// the time it returns; use Guard to act on it.
func (s *Store) Status(ctx context.Context, name string) (Status, error) {
	if err := ValidateName("name", name); err != nil {
		return Status{}, err
	}
	resp, err := s.cli.Txn(ctx).Then(clientv3.OpGet(s.holderKey(name)), clientv3.OpGet(s.epochKey(name)),
		clientv3.OpGet(s.delayKey(name)), clientv3.OpGet(s.claimKey(name), clientv3.WithCountOnly())).Commit()
	if err != nil {
		return Status{}, fmt.Errorf("etcdstore: status of %q: %w", name, err)
	}
	st := Status{Name: name}
	if kvs := resp.Responses[1].GetResponseRange().Kvs; len(kvs) == 1 {
		st.Epoch, _ = strconv.ParseUint(string(kvs[0].Value), 10, 64)
	}
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) == 1 {
		st.Token, st.Holder = holderkey.Of(name, kvs[0])
	}
	if kvs := resp.Responses[2].GetResponseRange().Kvs; len(kvs) == 1 {
		st.LockDelay, st.LockDelayStarted = lockDelayOf(kvs[0], !st.Token.IsZero(), resp.Responses[3].GetResponseRange().Count > 0)
	}
	return st, nil
}

// lockDelayOf is the Status view of lease's lock-delay marker kv: the
// delay and whether it was started, given whether the lease is held and
// whether the marker's claim key exists. A marker that cannot be decoded
// shows as no delay; an acquisition reports it.
func lockDelayOf(kv *mvccpb.KeyValue, held, claimed bool) (time.Duration, bool) {
	m, err := decodeMarker(kv.Value, kv.ModRevision)
	switch {
	case err != nil:
		return 0, false
	case held:
		return m.delay, false // an acquisition's own marker names no claim
	case m.claim != 0 && !claimed:
		return 0, false // started, and etcd has expired its claim: passed
	}
	return m.delay, m.claim != 0
}

// ListOption narrows a listing of leases (ListPage).
type ListOption func(*listOptions)

type listOptions struct {
	namePrefix string
}

// WithNamePrefix lists only the leases whose names start with prefix,
// reading only their range of keys. "" lists every lease.
func WithNamePrefix(prefix string) ListOption {
	return func(o *listOptions) { o.namePrefix = prefix }
}

// ListPage returns the status of at most limit leases that have ever been
// acquired under the store's prefix, those whose names sort after after
// ("" starts at the first), ordered by name; more reports whether further
// leases follow the last one returned. after is a cursor, usually the last
// name of the previous page, and need not be a valid lease name. Each page
// is read at one etcd revision, but a listing made of several pages is
// not: a lease acquired or released between two pages shows as it was when
// its page was read. It returns an *ArgumentError for limit < 1.
func (s *Store) ListPage(ctx context.Context, after string, limit int, opts ...ListOption) (page []Status, more bool, err error) {
	if limit < 1 {
		return nil, false, invalid("limit", strconv.Itoa(limit), "less than 1")
	}
	var o listOptions
	for _, opt := range opts {
		opt(&o)
	}
	epochs := s.prefix + "epochs/"
	from := epochs + o.namePrefix
	if k := s.epochKey(after) + "\x00"; after != "" && k > from {
		from = k
	}
	end := clientv3.GetPrefixRangeEnd(epochs + o.namePrefix)
	for {
		eresp, err := s.cli.Get(ctx, from, clientv3.WithRange(end), clientv3.WithLimit(int64(limit)))
		if err != nil {
			return nil, false, fmt.Errorf("etcdstore: list: %w", err)
		}
		if len(eresp.Kvs) == 0 {
			return nil, false, nil
		}
		first := strings.TrimPrefix(string(eresp.Kvs[0].Key), epochs)
		last := strings.TrimPrefix(string(eresp.Kvs[len(eresp.Kvs)-1].Key), epochs)
		// A name's claim key sorts after the markers of the names that
		// extend it with a byte below "/" ("a/claim" > "a-b"), so the
		// lock-delay keys' range ends after the greatest claim key of the
		// page, not after the last name's.
		claimsEnd := ""
		for _, kv := range eresp.Kvs {
			claimsEnd = max(claimsEnd, s.claimKey(strings.TrimPrefix(string(kv.Key), epochs))+"\x00")
		}
		rev := clientv3.WithRev(eresp.Header.Revision)
		resp, err := s.cli.Txn(ctx).Then(
			clientv3.OpGet(s.holderKey(first), clientv3.WithRange(s.holderKey(last)+"\x00"), rev),
			clientv3.OpGet(s.delayKey(first), clientv3.WithRange(claimsEnd), rev),
		).Commit()
		if errors.Is(err, rpctypes.ErrCompacted) {
			continue // compacted between the two reads: read the page again
		}
		if err != nil {
			return nil, false, fmt.Errorf("etcdstore: list: %w", err)
		}
		return s.statuses(eresp.Kvs, resp.Responses[0].GetResponseRange().Kvs, resp.Responses[1].GetResponseRange().Kvs), eresp.More, nil
	}
}

// List returns the status of every lease that has ever been acquired under
// the store's prefix, ordered by name, read at one etcd revision. For many
// leases, ListPage reads them a page at a time.
func (s *Store) List(ctx context.Context) ([]Status, error) {
	resp, err := s.cli.Txn(ctx).Then(
		clientv3.OpGet(s.prefix+"epochs/", clientv3.WithPrefix()),
		clientv3.OpGet(s.holderKey(""), clientv3.WithPrefix()),
		clientv3.OpGet(s.delayKey(""), clientv3.WithPrefix()),
	).Commit()
	if err != nil {
		return nil, fmt.Errorf("etcdstore: list: %w", err)
	}
	return s.statuses(resp.Responses[0].GetResponseRange().Kvs, resp.Responses[1].GetResponseRange().Kvs, resp.Responses[2].GetResponseRange().Kvs), nil
}

// statuses joins epoch keys with the holder keys and lock-delay keys
// (markers and claims) of the same names, all read at the same revision:
// one Status per epoch key, in the epoch keys' order.
func (s *Store) statuses(epochs, holders, delays []*mvccpb.KeyValue) []Status {
	held := map[string]Status{}
	for _, kv := range holders {
		name := strings.TrimPrefix(string(kv.Key), s.holderKey(""))
		st := Status{Name: name}
		st.Token, st.Holder = holderkey.Of(name, kv)
		held[name] = st
	}
	markers, claimed := map[string]*mvccpb.KeyValue{}, map[string]bool{}
	for _, kv := range delays {
		name := strings.TrimPrefix(string(kv.Key), s.delayKey(""))
		if n, ok := strings.CutSuffix(name, "/claim"); ok {
			claimed[n] = true
		} else {
			markers[name] = kv
		}
	}
	out := make([]Status, 0, len(epochs))
	for _, kv := range epochs {
		name := strings.TrimPrefix(string(kv.Key), s.prefix+"epochs/")
		st := held[name]
		st.Name = name
		st.Epoch, _ = strconv.ParseUint(string(kv.Value), 10, 64)
		if m := markers[name]; m != nil {
			st.LockDelay, st.LockDelayStarted = lockDelayOf(m, !st.Token.IsZero(), claimed[name])
		}
		out = append(out, st)
	}
	return out
}
