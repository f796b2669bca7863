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
	"github.com/fencer-dev/fencer/internal/etcdtest"
	"github.com/fencer-dev/fencer/internal/holderkey"
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
	ctx := etcdtest.Context(t)
	st := etcdtest.Store(t)
	rec := newRecorder()
	auth, err := server.NewBearerTokens(testTokens)
	require.NoError(t, err)
	addr, _ := serve(t, server.Config{Store: st, Authenticator: auth, Logger: slog.New(rec)})
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
	etcdtest.WaitClosed(t, l1.Done(), 5*time.Second, "lease loss")
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
