package server_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/fencer-dev/fencer/client"
	"github.com/fencer-dev/fencer/etcdstore"
	"github.com/fencer-dev/fencer/fencertest"
	"github.com/fencer-dev/fencer/internal/holderkey"
	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
	"github.com/fencer-dev/fencer/server"
	"github.com/fencer-dev/fencer/token"
)

func TestGuardedWritesAndStaleErrors(t *testing.T) {
	ctx := fencertest.Context(t)
	st := fencertest.SharedStore(t)
	addr, _ := startServer(t, st)
	c := client.New(dial(t, alice, addr))

	s1 := newSession(t, c)
	l1, err := s1.Acquire(ctx, "jobs")
	require.NoError(t, err)
	_, err = c.Put(ctx, l1.Token(), "k", []byte("one"))
	require.NoError(t, err)
	require.NoError(t, c.Check(ctx, l1.Token()))

	// Another session cannot take it while held.
	s2 := newSession(t, c)
	_, err = s2.TryAcquire(ctx, "jobs")
	var held *token.HeldError
	require.ErrorAs(t, err, &held)
	require.True(t, strings.HasPrefix(held.Holder, "alice/"), held.Holder)

	// Lose the lease from outside; the watch reports it.
	_, err = st.Client().Delete(ctx, st.Prefix()+"leases/jobs")
	require.NoError(t, err)
	fencertest.WaitClosed(t, l1.Done(), 5*time.Second, "lease loss")
	require.ErrorIs(t, l1.Err(), etcdstore.ErrLeaseLost)
	require.ErrorIs(t, l1.Err(), token.ErrNotHeld)

	l2, err := s2.Acquire(ctx, "jobs")
	require.NoError(t, err)
	require.Greater(t, l2.Token().Revision, l1.Token().Revision)
	_, err = c.Put(ctx, l2.Token(), "k", []byte("two"))
	require.NoError(t, err)

	_, err = c.Put(ctx, l1.Token(), "k", []byte("late"))
	var stale *token.StaleError
	require.ErrorAs(t, err, &stale)
	require.ErrorIs(t, err, token.ErrStale)
	require.Equal(t, l1.Token(), stale.Token)
	require.Equal(t, l2.Token(), stale.Newer)
	_, err = c.Delete(ctx, l1.Token(), "k")
	require.ErrorIs(t, err, token.ErrStale)
	require.ErrorIs(t, c.Check(ctx, l1.Token()), token.ErrStale)
	require.ErrorIs(t, c.Advance(ctx, "bucket", l1.Token()), token.ErrStale)
	_, err = c.Txn(ctx, l1.Token(), nil, []*fencerv1.Op{{Op: &fencerv1.Op_Put{Put: &fencerv1.PutOp{Key: "k", Value: []byte("x")}}}}, nil)
	require.ErrorIs(t, err, token.ErrStale)

	v, found, err := c.Get(ctx, "k")
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, "two", string(v.Data))

	// Txn with the current token: compares on data keys.
	resp, err := c.Txn(ctx, l2.Token(),
		[]*fencerv1.Compare{{Key: "k", Target: fencerv1.Compare_TARGET_VALUE, Result: fencerv1.Compare_RESULT_EQUAL, Value: []byte("two")}},
		[]*fencerv1.Op{{Op: &fencerv1.Op_Put{Put: &fencerv1.PutOp{Key: "k", Value: []byte("three")}}}, {Op: &fencerv1.Op_Get{Get: &fencerv1.GetOp{Key: "k"}}}},
		nil)
	require.NoError(t, err)
	require.True(t, resp.GetSucceeded())
	require.Equal(t, "three", string(resp.GetResults()[1].GetGet().GetValue()))
	require.Positive(t, resp.GetResults()[0].GetPut().GetRevision())

	require.NoError(t, c.Advance(ctx, "bucket", l2.Token()))
	list, err := c.List(ctx)
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.Equal(t, l2.Token(), list[0].Token)

	require.NoError(t, l2.Release(ctx))
	require.ErrorIs(t, l2.Err(), etcdstore.ErrReleased)
	require.NoError(t, l2.Release(ctx), "releasing twice is a no-op")
	require.ErrorIs(t, c.Check(ctx, l2.Token()), token.ErrStale)
}

func TestReleaseEndsLeaseBeforeDeletingKey(t *testing.T) {
	// Like the library's, a remote Release stops the holder first: Done is
	// closed with ErrReleased before the key is deleted, so the watch's
	// report of that deletion cannot turn the release into a loss, and a
	// Release that cannot reach the server has ended the Lease all the same.
	ctx := fencertest.Context(t)
	addr, _ := startServer(t, fencertest.SharedStore(t))
	c := client.New(dial(t, alice, addr))
	l, err := newSession(t, c).Acquire(ctx, "rel")
	require.NoError(t, err)

	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	require.Equal(t, codes.Canceled, status.Code(l.Release(cancelled)))
	fencertest.WaitClosed(t, l.Done(), time.Second, "release")
	require.ErrorIs(t, l.Err(), etcdstore.ErrReleased)
	require.NoError(t, c.Check(ctx, l.Token()), "the key outlives a release that did not reach the server")

	require.NoError(t, l.Release(ctx), "a retry deletes the key")
	require.ErrorIs(t, c.Check(ctx, l.Token()), token.ErrStale)
	require.ErrorIs(t, l.Err(), etcdstore.ErrReleased)
}

func TestAuth(t *testing.T) {
	ctx := fencertest.Context(t)
	st := fencertest.SharedStore(t)
	addr, _ := startServer(t, st)
	t.Run("unauthenticated", func(t *testing.T) {
		for name, tok := range map[string]string{"no token": "", "unknown token": "not-a-known-token-at-all"} {
			c := client.New(dial(t, tok, addr))
			_, _, err := c.Get(ctx, "k")
			require.ErrorIs(t, err, client.ErrUnauthenticated, name)
			_, err = fencerv1.NewFencerServiceClient(dial(t, tok, addr)).Get(ctx, &fencerv1.GetRequest{Key: "k"})
			require.Equal(t, codes.Unauthenticated, status.Code(err), name)
		}
	})
	requirePrincipalsIsolated(t, dial(t, alice, addr), "alice", dial(t, bob, addr))
}

// requirePrincipalsIsolated checks the principal binding through two
// connections to one server: a, authenticated as principal aName, and b,
// authenticated as another principal. Leases a acquires name aName as
// their holder's principal; b can neither write with a's tokens nor renew,
// release, watch or acquire through a's sessions (PERMISSION_DENIED), and
// none of its attempts writes or releases anything; b may still read and
// check a's tokens.
func requirePrincipalsIsolated(t *testing.T, a *grpc.ClientConn, aName string, b *grpc.ClientConn) {
	t.Helper()
	ctx := fencertest.Context(t)
	ac, bc := client.New(a), client.New(b)
	la, err := newSession(t, ac).Acquire(ctx, "isolated")
	require.NoError(t, err)
	resp, err := fencerv1.NewFencerServiceClient(a).Acquire(ctx, &fencerv1.AcquireRequest{Name: "isolated2"})
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(resp.GetHolder(), aName+"/"), "holder %q of a lease acquired as %q", resp.GetHolder(), aName)
	t.Cleanup(func() {
		rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, _ = fencerv1.NewFencerServiceClient(a).Release(rctx, &fencerv1.ReleaseRequest{Target: &fencerv1.ReleaseRequest_SessionId{SessionId: resp.GetSessionId()}})
	})
	raw := fencerv1.NewFencerServiceClient(b)
	cases := map[string]func() error{
		"put with another's token": func() error {
			_, err := bc.Put(ctx, la.Token(), "isolated", []byte("x"))
			return err
		},
		"delete with another's token": func() error {
			_, err := bc.Delete(ctx, la.Token(), "isolated")
			return err
		},
		"txn with another's token": func() error {
			_, err := bc.Txn(ctx, la.Token(), nil, nil, nil)
			return err
		},
		"advance with another's token": func() error { return bc.Advance(ctx, "r", la.Token()) },
		"release another's token": func() error {
			_, err := raw.Release(ctx, &fencerv1.ReleaseRequest{Target: &fencerv1.ReleaseRequest_Token{Token: la.Token().String()}})
			return err
		},
		"release another's session": func() error {
			_, err := raw.Release(ctx, &fencerv1.ReleaseRequest{Target: &fencerv1.ReleaseRequest_SessionId{SessionId: resp.GetSessionId()}})
			return err
		},
		"acquire through another's session": func() error {
			_, err := raw.Acquire(ctx, &fencerv1.AcquireRequest{Name: "isolated3", SessionId: resp.GetSessionId()})
			return err
		},
		"renew another's session": func() error {
			ka, err := raw.KeepAlive(ctx)
			if err != nil {
				return err
			}
			if err := ka.Send(&fencerv1.KeepAliveRequest{SessionId: resp.GetSessionId()}); err != nil {
				return err
			}
			_, err = ka.Recv()
			return err
		},
		"watch another's session": func() error {
			w, err := raw.WatchLease(ctx, &fencerv1.WatchLeaseRequest{SessionId: resp.GetSessionId()})
			if err != nil {
				return err
			}
			_, err = w.Recv()
			return err
		},
	}
	for name, call := range cases {
		t.Run(name, func(t *testing.T) {
			err := call()
			if status.Code(err) != codes.PermissionDenied {
				require.ErrorIs(t, err, client.ErrPermissionDenied)
			}
		})
	}
	// Nothing was written or released.
	require.NoError(t, ac.Check(ctx, la.Token()))
	_, found, err := ac.Get(ctx, "isolated")
	require.NoError(t, err)
	require.False(t, found)
	tok2, err := token.Parse(resp.GetToken())
	require.NoError(t, err)
	require.NoError(t, ac.Check(ctx, tok2))
	// The other principal may still read and check.
	require.NoError(t, bc.Check(ctx, la.Token()))
	_, _, err = bc.Get(ctx, "isolated")
	require.NoError(t, err)
}

func TestValidationNamesFieldAndWritesNothing(t *testing.T) {
	ctx := fencertest.Context(t)
	st := fencertest.SharedStore(t)
	addr, _ := startServer(t, st)
	raw := fencerv1.NewFencerServiceClient(dial(t, alice, addr))
	l, err := newSession(t, client.New(dial(t, alice, addr))).Acquire(ctx, "v")
	require.NoError(t, err)
	tok := l.Token().String()
	// The etcd member is shared with the package's other tests, whose
	// sessions may expire meanwhile, so compare this store's keys, not
	// the cluster's revision.
	before, err := st.Client().Get(ctx, st.Prefix(), clientv3.WithPrefix())
	require.NoError(t, err)
	cases := []struct {
		name, field, reason string
		call                func() error
	}{
		{"empty name", "name", fencerv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT.Reason(), func() error {
			_, err := raw.Acquire(ctx, &fencerv1.AcquireRequest{})
			return err
		}},
		{"name with slash", "name", fencerv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT.Reason(), func() error {
			_, err := raw.Acquire(ctx, &fencerv1.AcquireRequest{Name: "a/b"})
			return err
		}},
		{"ttl too long", "ttl_seconds", fencerv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT.Reason(), func() error {
			_, err := raw.Acquire(ctx, &fencerv1.AcquireRequest{Name: "x", TtlSeconds: 100000})
			return err
		}},
		{"bad token", "token", fencerv1.ErrorReason_ERROR_REASON_INVALID_TOKEN.Reason(), func() error {
			_, err := raw.Put(ctx, &fencerv1.PutRequest{Token: "v2:1:2:x", Key: "k"})
			return err
		}},
		{"missing token", "token", fencerv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT.Reason(), func() error {
			_, err := raw.Put(ctx, &fencerv1.PutRequest{Key: "k"})
			return err
		}},
		{"key too long", "key", fencerv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT.Reason(), func() error {
			_, err := raw.Put(ctx, &fencerv1.PutRequest{Token: tok, Key: strings.Repeat("k", etcdstore.MaxKeyLen+1)})
			return err
		}},
		{"value too large", "value", fencerv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT.Reason(), func() error {
			_, err := raw.Put(ctx, &fencerv1.PutRequest{Token: tok, Key: "k", Value: make([]byte, etcdstore.MaxValueLen+1)})
			return err
		}},
		{"txn compare target", "compares[0].target", fencerv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT.Reason(), func() error {
			_, err := raw.Txn(ctx, &fencerv1.TxnRequest{Token: tok, Compares: []*fencerv1.Compare{{Key: "k", Result: fencerv1.Compare_RESULT_EQUAL}}})
			return err
		}},
		{"txn duplicate write", "success[1]", fencerv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT.Reason(), func() error {
			put := &fencerv1.Op{Op: &fencerv1.Op_Put{Put: &fencerv1.PutOp{Key: "k"}}}
			_, err := raw.Txn(ctx, &fencerv1.TxnRequest{Token: tok, Success: []*fencerv1.Op{put, put}})
			return err
		}},
		{"txn empty op", "failure[0]", fencerv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT.Reason(), func() error {
			_, err := raw.Txn(ctx, &fencerv1.TxnRequest{Token: tok, Failure: []*fencerv1.Op{{}}})
			return err
		}},
		{"release nothing", "target", fencerv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT.Reason(), func() error {
			_, err := raw.Release(ctx, &fencerv1.ReleaseRequest{})
			return err
		}},
		{"negative page size", "page_size", fencerv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT.Reason(), func() error {
			_, err := raw.ListLeases(ctx, &fencerv1.ListLeasesRequest{PageSize: -1})
			return err
		}},
		{"page too large", "page_size", fencerv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT.Reason(), func() error {
			_, err := raw.ListLeases(ctx, &fencerv1.ListLeasesRequest{PageSize: server.MaxListPageSize + 1})
			return err
		}},
		{"bad page token", "page_token", fencerv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT.Reason(), func() error {
			_, err := raw.ListLeases(ctx, &fencerv1.ListLeasesRequest{PageToken: "not base64!"})
			return err
		}},
		{"bad name prefix", "name_prefix", fencerv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT.Reason(), func() error {
			_, err := raw.ListLeases(ctx, &fencerv1.ListLeasesRequest{NamePrefix: "a/b"})
			return err
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			st := status.Convert(tc.call())
			require.Equal(t, codes.InvalidArgument, st.Code(), st.Message())
			info, field := badRequest(t, st)
			require.Equal(t, tc.reason, info.GetReason())
			require.Equal(t, tc.field, field)
		})
	}
	after, err := st.Client().Get(ctx, st.Prefix(), clientv3.WithPrefix())
	require.NoError(t, err)
	require.Equal(t, before.Kvs, after.Kvs, "nothing written")

	// The Go client returns the library's argument error.
	_, err = client.New(dial(t, alice, addr)).Put(ctx, l.Token(), "", nil)
	var ae *token.ArgumentError
	require.ErrorAs(t, err, &ae)
	require.Equal(t, "key", ae.Arg)
}

func TestListLeasesPages(t *testing.T) {
	ctx := fencertest.Context(t)
	st := fencertest.SharedStore(t)
	addr, _ := startServer(t, st)
	c := client.New(dial(t, alice, addr))
	s := newSession(t, c)
	var names []string
	for i := range 25 {
		name := fmt.Sprintf("page-%02d", i)
		l, err := s.Acquire(ctx, name)
		require.NoError(t, err)
		if i%3 == 0 {
			require.NoError(t, l.Release(ctx))
		}
		names = append(names, name)
	}

	raw := fencerv1.NewFencerServiceClient(dial(t, alice, addr))
	var got []string
	var sizes []int
	req := &fencerv1.ListLeasesRequest{PageSize: 10}
	for {
		resp, err := raw.ListLeases(ctx, req)
		require.NoError(t, err)
		sizes = append(sizes, len(resp.GetLeases()))
		for _, l := range resp.GetLeases() {
			got = append(got, l.GetName())
			held, _ := strconv.Atoi(strings.TrimPrefix(l.GetName(), "page-"))
			require.Equal(t, held%3 != 0, l.GetHeld(), l.GetName())
		}
		if resp.GetNextPageToken() == "" {
			break
		}
		req.PageToken = resp.GetNextPageToken()
	}
	require.Equal(t, []int{10, 10, 5}, sizes)
	require.Equal(t, names, got)

	list, err := c.List(ctx)
	require.NoError(t, err)
	want, err := st.List(ctx)
	require.NoError(t, err)
	require.Equal(t, want, list)

	// A name prefix, over pages of its own.
	got = nil
	req = &fencerv1.ListLeasesRequest{PageSize: 4, NamePrefix: "page-1"}
	for {
		resp, err := raw.ListLeases(ctx, req)
		require.NoError(t, err)
		for _, l := range resp.GetLeases() {
			got = append(got, l.GetName())
		}
		if resp.GetNextPageToken() == "" {
			break
		}
		req.PageToken = resp.GetNextPageToken()
	}
	require.Equal(t, names[10:20], got)
	list, err = c.List(ctx, client.WithNamePrefix("page-2"))
	require.NoError(t, err)
	require.Equal(t, want[20:], list)
}

func TestSessionFailsClosedWhenServerGone(t *testing.T) {
	ctx := fencertest.Context(t)
	st := fencertest.SharedStore(t)
	addr, srv := startServer(t, st)
	s := newSession(t, client.New(dial(t, alice, addr)), client.WithTTL(2*time.Second))
	l, err := s.Acquire(ctx, "gone")
	require.NoError(t, err)
	start := time.Now()
	sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	require.NoError(t, srv.Shutdown(sctx))
	fencertest.WaitClosed(t, l.Done(), 3*time.Second, "local deadline")
	require.Less(t, time.Since(start), 2500*time.Millisecond)
	require.ErrorIs(t, l.Err(), etcdstore.ErrSessionExpired)
}

func TestHealthAndShutdown(t *testing.T) {
	ctx := fencertest.Context(t)
	addr, srv := startServer(t, fencertest.SharedStore(t))
	h, err := healthpb.NewHealthClient(dial(t, alice, addr)).Watch(ctx, &healthpb.HealthCheckRequest{Service: fencerv1.FencerService_ServiceDesc.ServiceName})
	require.NoError(t, err)
	awaitHealth(t, h, healthpb.HealthCheckResponse_SERVING)

	// An open watch stream ends with SHUTTING_DOWN rather than blocking shutdown.
	raw := fencerv1.NewFencerServiceClient(dial(t, alice, addr))
	ar, err := raw.Acquire(ctx, &fencerv1.AcquireRequest{Name: "h"})
	require.NoError(t, err)
	w, err := raw.WatchLease(ctx, &fencerv1.WatchLeaseRequest{SessionId: ar.GetSessionId()})
	require.NoError(t, err)
	ev, err := w.Recv()
	require.NoError(t, err)
	require.Equal(t, fencerv1.WatchLeaseResponse_TYPE_SYNCED, ev.GetType())
	sctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	require.NoError(t, srv.Shutdown(sctx))
	_, err = w.Recv()
	require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	require.False(t, errors.Is(err, context.DeadlineExceeded))
	require.Equal(t, http.StatusServiceUnavailable, probe(srv, "/readyz"))
}

// TestCallMetrics: the grpc_server_* metrics count each call with the
// code that fencer's interceptor made of its error (a stale write is
// FailedPrecondition, not Unknown; a bad credential Unauthenticated), and
// started minus handled is the open streams.
func TestCallMetrics(t *testing.T) {
	ctx := fencertest.Context(t)
	addr, srv := startServer(t, fencertest.SharedStore(t))
	c := client.New(dial(t, alice, addr))
	l, err := newSession(t, c).Acquire(ctx, "metrics")
	require.NoError(t, err)
	released, err := c.Release(ctx, l.Token())
	require.NoError(t, err)
	require.True(t, released)
	_, err = c.Put(ctx, l.Token(), "metrics/k", []byte("v"))
	require.ErrorIs(t, err, token.ErrStale)
	_, _, err = client.New(dial(t, "not-a-token-of-anyone", addr)).Get(ctx, "metrics/k")
	require.ErrorIs(t, err, client.ErrUnauthenticated)

	const svc = `grpc_service="fencer.v1.FencerService"`
	series := func(metric, labels string) float64 {
		return scrape(t, srv, metric+"{"+labels+"}")
	}
	require.Equal(t, 1.0, series("grpc_server_handled_total", `grpc_code="FailedPrecondition",grpc_method="Put",`+svc+`,grpc_type="unary"`))
	require.Equal(t, 1.0, series("grpc_server_handled_total", `grpc_code="Unauthenticated",grpc_method="Get",`+svc+`,grpc_type="unary"`))
	require.Equal(t, 1.0, series("grpc_server_handled_total", `grpc_code="OK",grpc_method="Release",`+svc+`,grpc_type="unary"`))
	require.Equal(t, 1.0, series("grpc_server_handling_seconds_count", `grpc_method="Put",`+svc+`,grpc_type="unary"`))
	open := series("grpc_server_started_total", `grpc_method="Sessions",`+svc+`,grpc_type="bidi_stream"`)
	require.Equal(t, 1.0, open, "the client's Sessions stream is open, and none has ended")
}

// scrape returns the value of the series (a metric name with its labels,
// in the exposition's order) in srv's metrics, failing t if there is none.
func scrape(t *testing.T, srv *server.Server, series string) float64 {
	t.Helper()
	rec := httptest.NewRecorder()
	srv.MetricsHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	for _, line := range strings.Split(rec.Body.String(), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			require.NoError(t, err)
			return f
		}
	}
	t.Fatalf("no series %s in:\n%s", series, rec.Body.String())
	return 0
}

func TestWatchLeaseStreamsShareOneEtcdWatch(t *testing.T) {
	ctx := fencertest.Context(t)
	st := fencertest.SharedStore(t)
	addr, srv := startServer(t, st)
	c := client.New(dial(t, alice, addr))
	var leases []*client.Lease
	for i := range 5 {
		l, err := newSession(t, c).Acquire(ctx, "shared-"+strconv.Itoa(i))
		require.NoError(t, err)
		leases = append(leases, l)
	}
	require.Eventually(t, func() bool {
		return scrape(t, srv, "fencer_server_lease_watches") == 1
	}, 5*time.Second, 10*time.Millisecond, "five sessions' streams on one etcd watch")

	_, err := st.Client().Delete(ctx, holderkey.Key(st.Prefix(), "shared-2"))
	require.NoError(t, err)
	fencertest.WaitClosed(t, leases[2].Done(), 5*time.Second, "the loss of shared-2")
	require.ErrorIs(t, leases[2].Err(), etcdstore.ErrLeaseLost)
	for i, l := range leases {
		if i != 2 {
			require.NoError(t, l.Err(), "only shared-2 was lost")
			require.NoError(t, c.Check(ctx, l.Token()))
		}
	}
}

// TestKeepAliveFailureMetric renews a session that etcd no longer has:
// the renewal fails with SESSION_NOT_FOUND and is counted as expired.
func TestKeepAliveFailureMetric(t *testing.T) {
	ctx := fencertest.Context(t)
	st := fencertest.SharedStore(t)
	addr, srv := startServer(t, st)
	rpc := fencerv1.NewFencerServiceClient(dial(t, alice, addr))
	const expired = `fencer_server_keepalive_failures_total{reason="expired"}`
	require.Equal(t, 0.0, scrape(t, srv, expired))
	resp, err := rpc.Acquire(ctx, &fencerv1.AcquireRequest{Name: "renewed"})
	require.NoError(t, err)
	_, err = st.Client().Revoke(ctx, clientv3.LeaseID(resp.GetSessionId()))
	require.NoError(t, err)
	ka, err := rpc.KeepAlive(ctx)
	require.NoError(t, err)
	require.NoError(t, ka.Send(&fencerv1.KeepAliveRequest{SessionId: resp.GetSessionId()}))
	_, err = ka.Recv()
	require.Equal(t, codes.NotFound, status.Code(err), "%v", err)
	require.Equal(t, 1.0, scrape(t, srv, expired))
	require.Equal(t, 0.0, scrape(t, srv, `fencer_server_keepalive_failures_total{reason="etcd"}`))
}

// TestKeepAliveStreamRunsOnOneGoroutine opens KeepAlive streams that have
// renewed once and now wait for their next request: each waits on its
// handler's goroutine alone, with no goroutine reading the stream beside
// it, so the process holds two goroutines per stream (the handler and the
// client's stream).
func TestKeepAliveStreamRunsOnOneGoroutine(t *testing.T) {
	ctx := fencertest.Context(t)
	addr, _ := startServer(t, fencertest.SharedStore(t))
	rpc := fencerv1.NewFencerServiceClient(dial(t, alice, addr))
	ar, err := rpc.Acquire(ctx, &fencerv1.AcquireRequest{Name: "one-goroutine"})
	require.NoError(t, err)
	const n = 50
	handlers, before := goroutinesIn(t, "server.(*Server).KeepAlive"), runtime.NumGoroutine()
	for range n {
		ka, err := rpc.KeepAlive(ctx)
		require.NoError(t, err)
		require.NoError(t, ka.Send(&fencerv1.KeepAliveRequest{SessionId: ar.GetSessionId()}))
		_, err = ka.Recv()
		require.NoError(t, err)
	}
	require.Equal(t, n, goroutinesIn(t, "server.(*Server).KeepAlive")-handlers, "goroutines in the KeepAlive handler, or started by it")
	require.Eventually(t, func() bool { return runtime.NumGoroutine()-before <= 2*n+n/5 }, 5*time.Second, 20*time.Millisecond,
		"%d streams, %d more goroutines", n, runtime.NumGoroutine()-before)
}

// goroutinesIn counts the goroutines that have a frame of fn (or of a
// closure of fn: fn.func1) on their stack.
func goroutinesIn(t *testing.T, fn string) int {
	var b strings.Builder
	require.NoError(t, pprof.Lookup("goroutine").WriteTo(&b, 2))
	n := 0
	for _, g := range strings.Split(b.String(), "\n\n") {
		if strings.Contains(g, fn+"(") || strings.Contains(g, fn+".func") {
			n++
		}
	}
	return n
}

// TestKeepAliveStreamWaitingForARequestEndsOnShutdown opens a KeepAlive
// stream that renews once and then sends nothing: its handler waits in
// Recv, and Shutdown still ends the stream at once with SHUTTING_DOWN, so
// that its client moves to another server.
func TestKeepAliveStreamWaitingForARequestEndsOnShutdown(t *testing.T) {
	ctx := fencertest.Context(t)
	addr, srv := startServer(t, fencertest.SharedStore(t))
	rpc := fencerv1.NewFencerServiceClient(dial(t, alice, addr))
	ar, err := rpc.Acquire(ctx, &fencerv1.AcquireRequest{Name: "idle-renewal"})
	require.NoError(t, err)
	ka, err := rpc.KeepAlive(ctx)
	require.NoError(t, err)
	require.NoError(t, ka.Send(&fencerv1.KeepAliveRequest{SessionId: ar.GetSessionId()}))
	_, err = ka.Recv()
	require.NoError(t, err)
	sctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	start := time.Now()
	require.NoError(t, srv.Shutdown(sctx), "the waiting KeepAlive stream held graceful shutdown")
	_, err = ka.Recv()
	require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	require.Equal(t, fencerv1.ErrorReason_ERROR_REASON_SHUTTING_DOWN.Reason(), errorInfo(t, err).GetReason())
	require.Less(t, time.Since(start), 2*time.Second)
}
