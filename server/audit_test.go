package server_test

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fencer-dev/fencer/client"
	"github.com/fencer-dev/fencer/fencertest"
	"github.com/fencer-dev/fencer/internal/holderkey"
	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
	"github.com/fencer-dev/fencer/server"
	"github.com/fencer-dev/fencer/token"
)

// recorder is a slog.Handler that keeps every record, with its
// attributes flattened into a map.
type recorder struct {
	mu    *sync.Mutex
	recs  *[]map[string]any
	attrs []slog.Attr
}

func newRecorder() *recorder { return &recorder{mu: new(sync.Mutex), recs: new([]map[string]any)} }

func (r *recorder) Enabled(context.Context, slog.Level) bool { return true }

func (r *recorder) Handle(_ context.Context, rec slog.Record) error {
	m := map[string]any{"msg": rec.Message, "level": rec.Level}
	for _, a := range r.attrs {
		m[a.Key] = a.Value.Any()
	}
	rec.Attrs(func(a slog.Attr) bool {
		m[a.Key] = a.Value.Any()
		return true
	})
	r.mu.Lock()
	defer r.mu.Unlock()
	*r.recs = append(*r.recs, m)
	return nil
}

func (r *recorder) WithAttrs(attrs []slog.Attr) slog.Handler {
	c := *r
	c.attrs = append(slices.Clip(r.attrs), attrs...)
	return &c
}

func (r *recorder) WithGroup(string) slog.Handler { return r }

// find returns the records for which match holds.
func (r *recorder) find(match func(map[string]any) bool) []map[string]any {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []map[string]any
	for _, m := range *r.recs {
		if match(m) {
			out = append(out, m)
		}
	}
	return out
}

// audit returns the audit records with message msg.
func (r *recorder) audit(msg string) []map[string]any {
	return r.find(func(m map[string]any) bool { return m["audit"] == true && m["msg"] == msg })
}

// TestAuditRecords checks one audit record per acquisition, release,
// loss and refused write, naming the principal, the lease and the token.
func TestAuditRecords(t *testing.T) {
	ctx := fencertest.Context(t)
	st := fencertest.SharedStore(t)
	rec := newRecorder()
	auth, err := server.NewBearerTokens(testTokens)
	require.NoError(t, err)
	addr, srv := serve(t, server.Config{Store: st, Authenticator: auth, Logger: slog.New(rec)})
	// A passed readiness check has started the server's own holder-key
	// watch, which records losses whether or not a stream watches.
	require.Eventually(t, func() bool { return scrape(t, srv, "fencer_etcd_up") == 1 }, 10*time.Second, 10*time.Millisecond)
	alices, bobs := client.New(dial(t, alice, addr)), client.New(dial(t, bob, addr))

	l1, err := newSession(t, alices).Acquire(ctx, "jobs")
	require.NoError(t, err)
	want := func(msg, principal string, tok token.Token) map[string]any {
		return map[string]any{"msg": msg, "principal": principal, "lease": "jobs", "token": tok.String()}
	}
	requireRecords(t, rec.audit("acquire"), want("acquire", "alice", l1.Token()))

	// Lost: the holder key goes from outside.
	_, err = st.Client().Delete(ctx, holderkey.Key(st.Prefix(), "jobs"))
	require.NoError(t, err)
	fencertest.WaitClosed(t, l1.Done(), 5*time.Second, "lease loss")
	require.Eventually(t, func() bool { return len(rec.audit("lost")) == 1 }, 5*time.Second, 10*time.Millisecond)
	requireRecords(t, rec.audit("lost"), want("lost", "alice", l1.Token()))

	l2, err := newSession(t, alices).Acquire(ctx, "jobs")
	require.NoError(t, err)
	_, err = alices.Put(ctx, l1.Token(), "k", []byte("late"))
	require.ErrorIs(t, err, token.ErrStale)
	_, err = bobs.Put(ctx, l2.Token(), "k", []byte("not mine"))
	require.ErrorIs(t, err, client.ErrPermissionDenied)
	stale, denied := want("refused", "alice", l1.Token()), want("refused", "bob", l2.Token())
	stale["reason"], stale["op"] = "stale", "put"
	denied["reason"], denied["op"] = "permission", "put"
	requireRecords(t, rec.audit("refused"), stale, denied)

	require.NoError(t, l2.Release(ctx))
	requireRecords(t, rec.audit("release"), want("release", "alice", l2.Token()))
	requireRecords(t, rec.audit("acquire"), want("acquire", "alice", l1.Token()), want("acquire", "alice", l2.Token()))

	rpc := fencerv1.NewFencerServiceClient(dial(t, alice, addr))
	lose := func(name string) {
		_, err := st.Client().Delete(ctx, holderkey.Key(st.Prefix(), name))
		require.NoError(t, err)
	}
	lostRecord := func(name, tok string) map[string]any {
		return map[string]any{"msg": "lost", "principal": "alice", "lease": name, "token": tok, "reason": "deleted"}
	}

	// A loss that no stream watches is recorded, once. The server's own
	// release of l2 before it was not recorded as a loss: the hub sees
	// changes in revision order, so it would have come first.
	alone, err := rpc.Acquire(ctx, &fencerv1.AcquireRequest{Name: "alone"})
	require.NoError(t, err)
	lose("alone")
	require.Eventually(t, func() bool { return len(rec.audit("lost")) == 2 }, 5*time.Second, 10*time.Millisecond)

	// A loss that two streams watch is recorded once.
	watched, err := rpc.Acquire(ctx, &fencerv1.AcquireRequest{Name: "watched"})
	require.NoError(t, err)
	var streams []fencerv1.FencerService_WatchLeaseClient
	for range 2 {
		w, err := rpc.WatchLease(ctx, &fencerv1.WatchLeaseRequest{SessionId: watched.GetSessionId()})
		require.NoError(t, err)
		synced, err := w.Recv()
		require.NoError(t, err)
		require.Equal(t, fencerv1.WatchLeaseResponse_TYPE_SYNCED, synced.GetType())
		streams = append(streams, w)
	}
	lose("watched")
	for _, w := range streams {
		for {
			msg, err := w.Recv()
			require.NoError(t, err)
			if msg.GetType() == fencerv1.WatchLeaseResponse_TYPE_LOST {
				require.Equal(t, watched.GetToken(), msg.GetToken())
				break
			}
		}
	}

	// Closing a session records each lease it drops, with its token, and
	// none as lost.
	s1, err := rpc.Acquire(ctx, &fencerv1.AcquireRequest{Name: "a"})
	require.NoError(t, err)
	s2, err := rpc.Acquire(ctx, &fencerv1.AcquireRequest{Name: "b", SessionId: s1.GetSessionId()})
	require.NoError(t, err)
	resp, err := rpc.Release(ctx, &fencerv1.ReleaseRequest{Target: &fencerv1.ReleaseRequest_SessionId{SessionId: s1.GetSessionId()}})
	require.NoError(t, err)
	require.True(t, resp.GetReleased())
	releaseOf := func(name, tok string) map[string]any {
		return map[string]any{"msg": "release", "principal": "alice", "lease": name, "token": tok, "holder": s1.GetHolder(), "session_release": true}
	}
	requireRecords(t, rec.audit("release"), want("release", "alice", l2.Token()), releaseOf("a", s1.GetToken()), releaseOf("b", s2.GetToken()))
	sessions := rec.audit("release session")
	require.Len(t, sessions, 1)
	require.Equal(t, s1.GetHolder(), sessions[0]["holder"])
	require.ElementsMatch(t, []string{"a", "b"}, sessions[0]["leases"])

	// A later loss is recorded after anything the session's release
	// could have caused: it caused nothing.
	last, err := rpc.Acquire(ctx, &fencerv1.AcquireRequest{Name: "last"})
	require.NoError(t, err)
	lose("last")
	require.Eventually(t, func() bool { return len(rec.audit("lost")) == 4 }, 5*time.Second, 10*time.Millisecond)
	requireRecords(t, rec.audit("lost"), want("lost", "alice", l1.Token()), lostRecord("alone", alone.GetToken()),
		lostRecord("watched", watched.GetToken()), lostRecord("last", last.GetToken()))
}

// requireRecords checks that got holds exactly one record per want, in
// order, each with at least want's attributes.
func requireRecords(t *testing.T, got []map[string]any, want ...map[string]any) {
	t.Helper()
	require.Len(t, got, len(want), "%v", got)
	for i, w := range want {
		for k, v := range w {
			require.Equal(t, v, got[i][k], "record %d, %s: %v", i, k, got[i])
		}
	}
}
