package server_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/fencer-dev/fencer/client"
	"github.com/fencer-dev/fencer/fencertest"
	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
	"github.com/fencer-dev/fencer/server"
	"github.com/fencer-dev/fencer/token"
)

// putManyStatus decodes the error of a put of a PutMany.
func putManyStatus(t *testing.T, r *fencerv1.PutResult) *spb.Status {
	t.Helper()
	e, ok := r.GetResult().(*fencerv1.PutResult_Error)
	require.True(t, ok, "want an error, got %v", r)
	var st spb.Status
	require.NoError(t, proto.Unmarshal(e.Error, &st))
	return &st
}

// scrapeOr0 is scrape, with 0 for a series the metrics do not have yet.
func scrapeOr0(t *testing.T, srv *server.Server, series string) float64 {
	t.Helper()
	rec := httptest.NewRecorder()
	srv.MetricsHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if !strings.Contains(rec.Body.String(), series+" ") {
		return 0
	}
	return scrape(t, srv, series)
}

// requireSameStatus checks that got has want's code, message and
// details (compared decoded: an ErrorInfo's metadata map encodes in no
// fixed order).
func requireSameStatus(t *testing.T, want, got *status.Status) {
	t.Helper()
	require.Equal(t, want.Code(), got.Code())
	require.Equal(t, want.Message(), got.Message())
	wd, gd := want.Details(), got.Details()
	require.Len(t, gd, len(wd), "details: want %v, got %v", wd, gd)
	for i := range wd {
		w, wok := wd[i].(proto.Message)
		g, gok := gd[i].(proto.Message)
		require.True(t, wok && gok, "details: want %v, got %v", wd[i], gd[i])
		require.True(t, proto.Equal(w, g), "detail %d: want %v, got %v", i, w, g)
	}
}

// TestPutManyEachPutAsAlone: each put of a PutMany is run as Put runs it:
// the valid ones commit, and each refused one (stale token, no grant,
// invalid key or token, a key of another lease, another principal's
// token) fails alone with exactly the status Put returns for it,
// writing nothing; the call itself fails only when it is empty, too
// large or unauthenticated.
func TestPutManyEachPutAsAlone(t *testing.T) {
	ctx := fencertest.Context(t)
	addr, _ := serve(t, authorizedConfig(t))
	a := fencerv1.NewFencerServiceClient(dial(t, alice, addr))
	b := fencerv1.NewFencerServiceClient(dial(t, bob, addr))

	orders, err := a.Acquire(ctx, &fencerv1.AcquireRequest{Name: "orders"})
	require.NoError(t, err)
	other, err := a.Acquire(ctx, &fencerv1.AcquireRequest{Name: "orders-other", SessionId: orders.GetSessionId()})
	require.NoError(t, err)
	old, err := a.Acquire(ctx, &fencerv1.AcquireRequest{Name: "orders-old", SessionId: orders.GetSessionId()})
	require.NoError(t, err)
	_, err = a.Release(ctx, &fencerv1.ReleaseRequest{Target: &fencerv1.ReleaseRequest_Token{Token: old.GetToken()}})
	require.NoError(t, err)
	_, err = a.Put(ctx, &fencerv1.PutRequest{Token: orders.GetToken(), Key: "orders/owned", Value: []byte("0")})
	require.NoError(t, err)

	puts := []*fencerv1.PutRequest{
		{Token: orders.GetToken(), Key: "orders/a", Value: []byte("1")},
		{Token: old.GetToken(), Key: "orders/b", Value: []byte("stale")},
		{Token: orders.GetToken(), Key: "billing/x", Value: []byte("no grant")},
		{Token: orders.GetToken(), Key: "orders/\x01", Value: []byte("control character")},
		{Token: other.GetToken(), Key: "orders/owned", Value: []byte("foreign")},
		{Token: "not a token", Key: "orders/d", Value: []byte("bad token")},
		{Token: orders.GetToken(), Key: "orders/c", Value: []byte("2")},
	}
	wantCodes := []codes.Code{codes.OK, codes.FailedPrecondition, codes.PermissionDenied, codes.InvalidArgument, codes.FailedPrecondition, codes.InvalidArgument, codes.OK}
	resp, err := a.PutMany(ctx, &fencerv1.PutManyRequest{Puts: puts})
	require.NoError(t, err)
	require.Len(t, resp.GetResults(), len(puts))
	for i, r := range resp.GetResults() {
		t.Run(fmt.Sprintf("put %d %s", i, puts[i].GetKey()), func(t *testing.T) {
			if wantCodes[i] == codes.OK {
				require.Positive(t, r.GetRevision())
				g, err := a.Get(ctx, &fencerv1.GetRequest{Key: puts[i].GetKey()})
				require.NoError(t, err)
				require.Equal(t, string(puts[i].GetValue()), string(g.GetValue()))
				return
			}
			got := putManyStatus(t, r)
			require.Equal(t, wantCodes[i], codes.Code(got.GetCode()), got.GetMessage())
			_, err := a.Put(ctx, puts[i])
			require.Error(t, err)
			requireSameStatus(t, status.Convert(err), status.FromProto(got))
		})
	}
	for _, key := range []string{"orders/b", "orders/d"} {
		g, err := a.Get(ctx, &fencerv1.GetRequest{Key: key})
		require.NoError(t, err)
		require.False(t, g.GetFound(), "a refused put wrote %s", key)
	}
	g, err := a.Get(ctx, &fencerv1.GetRequest{Key: "orders/owned"})
	require.NoError(t, err)
	require.Equal(t, "0", string(g.GetValue()), "the foreign put wrote nothing")

	// Another principal's token, beside a put of bob's own.
	billing, err := b.Acquire(ctx, &fencerv1.AcquireRequest{Name: "billing"})
	require.NoError(t, err)
	resp, err = b.PutMany(ctx, &fencerv1.PutManyRequest{Puts: []*fencerv1.PutRequest{
		{Token: billing.GetToken(), Key: "billing/x", Value: []byte("bob")},
		{Token: orders.GetToken(), Key: "shared/x", Value: []byte("alice's token")},
	}})
	require.NoError(t, err)
	require.Positive(t, resp.GetResults()[0].GetRevision())
	denied := putManyStatus(t, resp.GetResults()[1])
	require.Equal(t, codes.PermissionDenied, codes.Code(denied.GetCode()))
	require.NotContains(t, denied.GetMessage(), orders.GetHolder(), "a denial names nothing of alice's")

	// The call itself.
	for _, tc := range []struct {
		name string
		rpc  fencerv1.FencerServiceClient
		n    int
		code codes.Code
	}{
		{"empty", a, 0, codes.InvalidArgument},
		{"too many", a, server.MaxPutMany + 1, codes.InvalidArgument},
		{"unauthenticated", fencerv1.NewFencerServiceClient(dial(t, "not-a-token-of-anyone", addr)), 1, codes.Unauthenticated},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := &fencerv1.PutManyRequest{}
			for i := range tc.n {
				req.Puts = append(req.Puts, &fencerv1.PutRequest{Token: orders.GetToken(), Key: "orders/many/" + strconv.Itoa(i), Value: []byte("v")})
			}
			_, err := tc.rpc.PutMany(ctx, req)
			require.Equal(t, tc.code, status.Code(err), "%v", err)
			g, err := a.Get(ctx, &fencerv1.GetRequest{Key: "orders/many/0"})
			require.NoError(t, err)
			require.False(t, g.GetFound(), "a refused call wrote a put")
		})
	}
}

// TestPutManyMetricsAndAudit: each put of a PutMany is counted by its
// code, and a refused one has its audit record, as a Put's.
func TestPutManyMetricsAndAudit(t *testing.T) {
	ctx := fencertest.Context(t)
	rec := newRecorder()
	auth, err := server.NewBearerTokens(testTokens)
	require.NoError(t, err)
	addr, srv := serve(t, server.Config{Store: fencertest.SharedStore(t), Authenticator: auth, Logger: slog.New(rec)})
	a := fencerv1.NewFencerServiceClient(dial(t, alice, addr))
	cur, err := a.Acquire(ctx, &fencerv1.AcquireRequest{Name: "many"})
	require.NoError(t, err)
	old, err := a.Acquire(ctx, &fencerv1.AcquireRequest{Name: "many-old", SessionId: cur.GetSessionId()})
	require.NoError(t, err)
	_, err = a.Release(ctx, &fencerv1.ReleaseRequest{Target: &fencerv1.ReleaseRequest_Token{Token: old.GetToken()}})
	require.NoError(t, err)
	resp, err := a.PutMany(ctx, &fencerv1.PutManyRequest{Puts: []*fencerv1.PutRequest{
		{Token: cur.GetToken(), Key: "many/a", Value: []byte("1")},
		{Token: old.GetToken(), Key: "many/b", Value: []byte("2")},
		{Token: cur.GetToken(), Key: "many/c", Value: []byte("3")},
	}})
	require.NoError(t, err)
	require.Len(t, resp.GetResults(), 3)

	require.Equal(t, 2.0, scrape(t, srv, `fencer_server_put_many_puts_total{grpc_code="OK"}`))
	require.Equal(t, 1.0, scrape(t, srv, `fencer_server_put_many_puts_total{grpc_code="FailedPrecondition"}`))
	require.Equal(t, 1.0, scrape(t, srv, `fencer_server_rejected_writes_total{reason="stale"}`))
	require.Equal(t, 1.0, scrape(t, srv, `grpc_server_handled_total{grpc_code="OK",grpc_method="PutMany",grpc_service="fencer.v1.FencerService",grpc_type="unary"}`))
	oldTok, err := token.Parse(old.GetToken())
	require.NoError(t, err)
	requireRecords(t, rec.audit("refused"), map[string]any{"msg": "refused", "op": "put", "reason": "stale", "principal": "alice", "lease": "many-old", "token": oldTok.String()})
}

// TestClientPutsShareCalls: concurrent Puts of one Client on one
// connection leave together as PutMany calls, each under its own guard:
// every stale one fails alone with its *token.StaleError, every other
// lands.
func TestClientPutsShareCalls(t *testing.T) {
	ctx := fencertest.Context(t)
	addr, srv := startServer(t, fencertest.SharedStore(t))
	c := client.New(dial(t, alice, addr))
	sess := newSession(t, c)
	cur, err := sess.Acquire(ctx, "shared-calls")
	require.NoError(t, err)
	old, err := sess.Acquire(ctx, "shared-calls-old")
	require.NoError(t, err)
	require.NoError(t, old.Release(ctx))

	const writers = 32
	for round := 0; scrapeOr0(t, srv, `fencer_server_put_many_puts_total{grpc_code="OK"}`) == 0; round++ {
		require.Less(t, round, 50, "no Put shared a call")
		var wg sync.WaitGroup
		errs := make([]error, writers)
		for i := range writers {
			wg.Go(func() {
				tok := cur.Token()
				if i%8 == 7 {
					tok = old.Token()
				}
				_, errs[i] = c.Put(ctx, tok, "shared/"+strconv.Itoa(i), []byte(strconv.Itoa(round)))
			})
		}
		wg.Wait()
		for i, err := range errs {
			if i%8 == 7 {
				var stale *token.StaleError
				require.ErrorAs(t, err, &stale, "put %d", i)
				require.Equal(t, old.Token(), stale.Token)
				continue
			}
			require.NoError(t, err, "put %d", i)
			v, found, err := c.Get(ctx, "shared/"+strconv.Itoa(i))
			require.NoError(t, err)
			require.True(t, found)
			require.Equal(t, strconv.Itoa(round), string(v.Data))
		}
	}
	require.Positive(t, scrapeOr0(t, srv, `fencer_server_put_many_puts_total{grpc_code="FailedPrecondition"}`)+
		scrapeOr0(t, srv, `grpc_server_handled_total{grpc_code="FailedPrecondition",grpc_method="Put",grpc_service="fencer.v1.FencerService",grpc_type="unary"}`))
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err = c.Put(cctx, cur.Token(), "shared/cancelled", []byte("x"))
	require.Equal(t, codes.Canceled, status.Code(err), "%v", err)
}
