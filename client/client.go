package client

import (
	"context"
	"fmt"
	"time"

	"github.com/cenkalti/backoff/v5"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
	"github.com/fencer-dev/fencer/token"
)

// Client calls a fencer server (or several, behind one grpc connection).
// Beside its connection it holds the Sessions stream its sessions share
// (open while one runs), and whether the server lacks that call; methods
// are safe for concurrent use. Errors are the library's: see fromStatus
// for the mapping.
type Client struct {
	cc       grpc.ClientConnInterface
	rpc      fencerv1.FencerServiceClient
	clock    Clock
	puts     *putBatcher
	sessions *sessionsMux
}

// Option configures a Client.
type Option func(*Client)

// WithClock sets the clock that paces keepalives and measures sessions'
// local deadlines. Tests use a fake clock.
func WithClock(clk Clock) Option { return func(c *Client) { c.clock = clk } }

// New returns a Client that calls through cc. It does not close cc.
func New(cc grpc.ClientConnInterface, opts ...Option) *Client {
	rpc := fencerv1.NewFencerServiceClient(cc)
	c := &Client{cc: cc, rpc: rpc, clock: realClock{}, puts: &putBatcher{rpc: rpc}, sessions: &sessionsMux{rpc: rpc}}
	for _, o := range opts {
		o(c)
	}
	return c
}

// reconnect asks the connection to reconnect at once if it waits out
// gRPC's reconnect backoff (a *grpc.ClientConn's ResetConnectBackoff).
// A session retrying a failed renewal calls it: its own retries are paced
// by its deadline, which gRPC's backoff (1 s growing to 120 s) does not
// know, so that backoff could otherwise keep a session from renewing
// after its server is back, until the session expired.
func (c *Client) reconnect() {
	if r, ok := c.cc.(interface{ ResetConnectBackoff() }); ok {
		r.ResetConnectBackoff()
	}
}

// BearerToken returns per-call credentials that send tok as
// "authorization: Bearer <tok>". With requireTLS, grpc refuses to send it
// over a plaintext connection; pass false only for loopback or tests.
func BearerToken(tok string, requireTLS bool) credentials.PerRPCCredentials {
	return bearer{tok: tok, secure: requireTLS}
}

type bearer struct {
	tok    string
	secure bool
}

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + b.tok}, nil
}

func (b bearer) RequireTransportSecurity() bool { return b.secure }

// WriteOption modifies one guarded write: Put, Delete, Txn or Advance. It
// is token.WriteOption, the one the etcd store takes too.
type WriteOption = token.WriteOption

// TakeOver makes a write take over the data keys it writes, or the
// resource it advances, from whichever lease owns them, instead of failing
// with a *token.ForeignLeaseError: the request's take_over field. The
// takeover is fenced like any write, committing only while tok is current;
// see token.TakeOver, which it is.
func TakeOver() WriteOption { return token.TakeOver() }

// Check returns nil if tok is its lease's current token, and a
// *token.StaleError otherwise. The answer may be out of date when it
// returns; only guarded writes are fenced.
func (c *Client) Check(ctx context.Context, tok token.Token) error {
	_, err := c.rpc.Check(ctx, &fencerv1.CheckRequest{Token: tok.String()})
	return fromStatus(err)
}

// Advance records tok as the highest token that has passed for resource;
// see the library's etcdstore.Store.Advance. A resource another lease
// advanced yields a *token.ForeignLeaseError unless TakeOver is given.
func (c *Client) Advance(ctx context.Context, resource string, tok token.Token, opts ...WriteOption) error {
	o := token.ApplyWriteOptions(opts)
	_, err := c.rpc.Advance(ctx, &fencerv1.AdvanceRequest{Resource: resource, Token: tok.String(), TakeOver: o.TakeOver})
	return fromStatus(err)
}

// Put writes value at key if and only if tok is current and key belongs to
// tok's lease or to none, and returns the revision of the write. A token
// that is not current yields a *token.StaleError, a key of another lease a
// *token.ForeignLeaseError (unless TakeOver is given), and nothing is
// written. A transport error leaves it unknown whether the write
// committed.
//
// Concurrent Puts on one Client share calls: while a call of Put is in
// flight, further Puts wait and leave together when it ends, up to 64 in
// one PutMany call, where each keeps its own guard and gets its own
// result and error, exactly as alone. A Put that finds no call in flight
// is sent at once. A Put whose context ends while it waits is never
// sent; one whose context ends while its PutMany is in flight returns at
// once and may or may not have committed, as with any call given up on.
// A Put whose context carries outgoing gRPC metadata is always sent on
// its own, and so is every Put once the server has answered a PutMany
// with UNIMPLEMENTED (a server older than PutMany).
func (c *Client) Put(ctx context.Context, tok token.Token, key string, value []byte, opts ...WriteOption) (int64, error) {
	o := token.ApplyWriteOptions(opts)
	return c.puts.put(ctx, &fencerv1.PutRequest{Token: tok.String(), Key: key, Value: value, TakeOver: o.TakeOver})
}

// Get reads key; found is false when it does not exist. Reads are not
// guarded.
func (c *Client) Get(ctx context.Context, key string) (v token.Value, found bool, err error) {
	resp, err := c.rpc.Get(ctx, &fencerv1.GetRequest{Key: key})
	if err != nil {
		return token.Value{}, false, fromStatus(err)
	}
	if !resp.GetFound() {
		return token.Value{}, false, nil
	}
	return token.Value{Data: resp.GetValue(), CreateRevision: resp.GetCreateRevision(), ModRevision: resp.GetModRevision()}, true, nil
}

// KeyValue is a data key with its value, as ListKeys returns it.
type KeyValue struct {
	Key string
	token.Value
}

// ListKeys reads every data key that starts with prefix ("" for every
// key), with its value, ordered by key, a page of ListKeys at a time (etcdctl
// get --prefix). Reads are not guarded. A listing of several pages is not
// one snapshot: a key written between two pages shows as it was when its
// page was read. On a server with an authorization file it returns only
// the keys the caller may read.
func (c *Client) ListKeys(ctx context.Context, prefix string) ([]KeyValue, error) {
	var out []KeyValue
	req := &fencerv1.ListKeysRequest{Prefix: prefix}
	for {
		resp, err := c.rpc.ListKeys(ctx, req)
		if err != nil {
			return nil, fromStatus(err)
		}
		for _, kv := range resp.GetKeys() {
			out = append(out, KeyValue{Key: kv.GetKey(), Value: token.Value{Data: kv.GetValue(), CreateRevision: kv.GetCreateRevision(), ModRevision: kv.GetModRevision()}})
		}
		if resp.GetNextPageToken() == "" {
			return out, nil
		}
		req.PageToken = resp.GetNextPageToken()
	}
}

// Delete deletes key if and only if tok is current and key belongs to
// tok's lease or to none (or TakeOver is given), and reports whether it
// existed. The errors are Put's.
func (c *Client) Delete(ctx context.Context, tok token.Token, key string, opts ...WriteOption) (bool, error) {
	o := token.ApplyWriteOptions(opts)
	resp, err := c.rpc.Delete(ctx, &fencerv1.DeleteRequest{Token: tok.String(), Key: key, TakeOver: o.TakeOver})
	if err != nil {
		return false, fromStatus(err)
	}
	return resp.GetDeleted(), nil
}

// Txn runs a transaction on data keys if and only if tok is current and
// every key either branch writes belongs to tok's lease or to none (or
// TakeOver is given). A token that is not current yields a
// *token.StaleError, a key of another lease a *token.ForeignLeaseError, and
// neither branch runs; otherwise the response's Succeeded reports the
// caller's compares.
func (c *Client) Txn(ctx context.Context, tok token.Token, compares []*fencerv1.Compare, success, failure []*fencerv1.Op, opts ...WriteOption) (*fencerv1.TxnResponse, error) {
	o := token.ApplyWriteOptions(opts)
	resp, err := c.rpc.Txn(ctx, &fencerv1.TxnRequest{Token: tok.String(), Compares: compares, Success: success, Failure: failure, TakeOver: o.TakeOver})
	return resp, fromStatus(err)
}

// ListOption narrows List.
type ListOption func(*fencerv1.ListLeasesRequest)

// WithNamePrefix lists only the leases whose names start with prefix; the
// server reads only those. "" lists every lease.
func WithNamePrefix(prefix string) ListOption {
	return func(r *fencerv1.ListLeasesRequest) { r.NamePrefix = prefix }
}

// List returns every lease that has ever been acquired, ordered by name,
// reading them from the server a page at a time. Each page is one etcd
// revision's view, but the whole list is not: a lease acquired or released
// while List reads shows as it was when its page was read. It may be out
// of date when it returns.
func (c *Client) List(ctx context.Context, opts ...ListOption) ([]token.Status, error) {
	var out []token.Status
	req := &fencerv1.ListLeasesRequest{}
	for _, o := range opts {
		o(req)
	}
	for {
		resp, err := c.rpc.ListLeases(ctx, req)
		if err != nil {
			return nil, fromStatus(err)
		}
		for _, l := range resp.GetLeases() {
			st := token.Status{Name: l.GetName(), Epoch: l.GetEpoch(), Holder: l.GetHolder(),
				LockDelay: time.Duration(l.GetLockDelayMs()) * time.Millisecond, LockDelayStarted: l.GetLockDelayStarted()}
			if l.GetHeld() {
				tok, err := token.Parse(l.GetToken())
				if err != nil {
					return nil, fmt.Errorf("client: list: lease %q: %w", l.GetName(), err)
				}
				st.Token = tok
			}
			out = append(out, st)
		}
		if resp.GetNextPageToken() == "" {
			return out, nil
		}
		req.PageToken = resp.GetNextPageToken()
	}
}

// Release ends the acquisition of tok if and only if tok is still its
// lease's current token, so a late or repeated Release never ends a newer
// holder's lease, and reports whether it ended something. A token that
// had already ended is not an error. Unlike Lease.Release it needs no
// Session: a script that holds only the token (fencer release) uses it.
func (c *Client) Release(ctx context.Context, tok token.Token) (bool, error) {
	resp, err := c.rpc.Release(ctx, &fencerv1.ReleaseRequest{Target: &fencerv1.ReleaseRequest_Token{Token: tok.String()}})
	if err != nil {
		return false, fromStatus(err)
	}
	return resp.GetReleased(), nil
}

// LossEvent is a lease that the server's watch reported lost: its holder
// key was deleted or replaced at Revision.
type LossEvent struct {
	// Token is the token that is no longer current.
	Token token.Token
	// Revision is the etcd revision of the loss.
	Revision int64
	// Reason is "deleted" or "replaced", for people.
	Reason string
}

// WatchSession follows the leases of session id (one of the caller's
// principal, such as the session fencer acquire opened) from now: it calls
// synced (if not nil) with the revision the watch starts from each time
// the server has it in place, and lost for each lease reported lost after
// that, until ctx ends (then it returns ctx's error), lost returns an
// error, or the watch fails for good: with an error that matches
// token.ErrSessionExpired when the session has ended.
//
// When the stream breaks for a reason that may pass (the server, or its
// etcd, is unavailable or restarting) it watches again, with jittered
// backoff (200 ms doubling to 5 s, on the client's clock), from the last
// revision it saw, so a loss while it was reconnecting is still reported,
// and none is reported twice. It does not guarantee that: if the server
// compacted that revision meanwhile, it returns an error, since losses in
// the gap cannot be known (a Session's own watch then checks each token it
// holds; WatchSession knows none).
func (c *Client) WatchSession(ctx context.Context, id int64, synced func(revision int64), lost func(LossEvent) error) error {
	w := &sessionWatch{c: c, id: id, synced: synced, lost: lost, retry: newBackOff(retryMax)}
	for {
		err := w.once(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if status.Code(err) != codes.Unavailable {
			return err
		}
		t := c.clock.NewTimer(w.retry.NextBackOff())
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C():
		}
	}
}

// sessionWatch is the state of one WatchSession across its reconnects.
type sessionWatch struct {
	c      *Client
	id     int64
	synced func(int64)
	lost   func(LossEvent) error
	retry  backoff.BackOff

	from     int64           // the revision to watch from next; 0: now
	reported map[string]bool // the tokens reported lost at revision from
}

// once follows one WatchLease stream until it ends.
func (w *sessionWatch) once(ctx context.Context) error {
	stream, err := w.c.rpc.WatchLease(ctx, &fencerv1.WatchLeaseRequest{SessionId: w.id, StartRevision: w.from})
	if err != nil {
		return fromStatus(err)
	}
	for {
		ev, err := stream.Recv()
		if err != nil {
			return fromStatus(err)
		}
		switch ev.GetType() {
		case fencerv1.WatchLeaseResponse_TYPE_SYNCED:
			w.retry.Reset()
			w.advance(ev.GetRevision())
			if w.synced != nil {
				w.synced(ev.GetRevision())
			}
		case fencerv1.WatchLeaseResponse_TYPE_PROGRESS:
			w.advance(ev.GetRevision() + 1)
		case fencerv1.WatchLeaseResponse_TYPE_LOST:
			// One revision may end several leases, so a watch resumes at
			// the revision of the last loss, and skips what it reported.
			w.advance(ev.GetRevision())
			if w.reported[ev.GetToken()] {
				continue
			}
			tok, err := token.Parse(ev.GetToken())
			if err != nil {
				return fmt.Errorf("client: watch: server sent %w", err)
			}
			if err := w.lost(LossEvent{Token: tok, Revision: ev.GetRevision(), Reason: ev.GetReason()}); err != nil {
				return err
			}
			w.reported[ev.GetToken()] = true
		}
	}
}

// advance moves the resume point to rev, forgetting the losses reported
// at an earlier one.
func (w *sessionWatch) advance(rev int64) {
	if rev != w.from || w.reported == nil {
		w.from, w.reported = rev, map[string]bool{}
	}
}
