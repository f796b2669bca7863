package server_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/fencer-dev/fencer/client"
	"github.com/fencer-dev/fencer/embedetcd"
	"github.com/fencer-dev/fencer/fencertest"
	"github.com/fencer-dev/fencer/internal/testkit/etcdproc"
	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
	"github.com/fencer-dev/fencer/server"
	"github.com/fencer-dev/fencer/token"
)

// requireEtcdError checks that err is the status fencer sends for an etcd
// error of the given class.
func requireEtcdError(t *testing.T, err error, code codes.Code, reason string, causes ...string) {
	t.Helper()
	require.Error(t, err)
	require.Equal(t, code, status.Code(err), "%v", err)
	info := errorInfo(t, err)
	require.Equal(t, reason, info.GetReason())
	require.Contains(t, causes, info.GetMetadata()["cause"], "%v", err)
}

// TestEtcdRefusalsMapToCodes runs fencer over a member with a 64 KiB
// request limit and a 2 MiB quota. A write over the limit is the caller's
// INVALID_ARGUMENT; once the quota is full, writes are UNAVAILABLE
// (NOSPACE: the operator must compact, defragment and disarm the alarm)
// while reads still work.
func TestEtcdRefusalsMapToCodes(t *testing.T) {
	ctx := fencertest.Context(t)
	srv, err := embedetcd.Start(ctx, embedetcd.Member{Name: "m", Dir: t.TempDir()},
		embedetcd.WithMaxRequestBytes(64<<10), embedetcd.WithQuota(2<<20))
	require.NoError(t, err)
	t.Cleanup(srv.Close)
	st := fencertest.StoreOn(t, []string{srv.Endpoint()})
	addr, _ := startServer(t, st)
	cc := dial(t, alice, addr)
	c := client.New(cc)
	l, err := newSession(t, c).Acquire(ctx, "jobs")
	require.NoError(t, err)

	// The Go client turns INVALID_ARGUMENT into an *token.ArgumentError;
	// the raw call shows the status.
	raw := fencerv1.NewFencerServiceClient(cc)
	_, err = raw.Put(ctx, &fencerv1.PutRequest{Token: l.Token().String(), Key: "big", Value: make([]byte, 100<<10)})
	requireEtcdError(t, err, codes.InvalidArgument, fencerv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT.Reason(), "request_too_large")
	_, err = c.Put(ctx, l.Token(), "big", make([]byte, 100<<10))
	var arg *token.ArgumentError
	require.ErrorAs(t, err, &arg)
	require.Equal(t, "request", arg.Arg)

	filler := fencertest.Client(t, srv.Endpoint())
	for i := 0; ; i++ {
		_, err := filler.Put(ctx, fmt.Sprintf("/filler/%d", i), strings.Repeat("x", 60<<10))
		if err != nil {
			require.ErrorIs(t, err, rpctypes.ErrNoSpace)
			break
		}
		require.Less(t, i, 200, "no NOSPACE after 12 MiB into a 2 MiB quota")
	}
	_, err = c.Put(ctx, l.Token(), "k", []byte("v"))
	requireEtcdError(t, err, codes.Unavailable, fencerv1.ErrorReason_ERROR_REASON_STORE_UNAVAILABLE.Reason(), "no_space")
	_, err = newSession(t, c).Acquire(ctx, "other")
	requireEtcdError(t, err, codes.Unavailable, fencerv1.ErrorReason_ERROR_REASON_STORE_UNAVAILABLE.Reason(), "no_space")
	require.NoError(t, c.Check(ctx, l.Token()))
}

// TestQuorumLossIsUnavailable kills two of three etcd member processes
// under a server. A lease watch ends with UNAVAILABLE (etcd's "no leader")
// and a guarded write with UNAVAILABLE (etcd's "no leader", since the
// server requires a leader; a request timeout if the member had not yet
// noticed), never INTERNAL and never a hang until the caller's deadline:
// the client treats the write as maybe committed and retries.
func TestQuorumLossIsUnavailable(t *testing.T) {
	cluster := etcdproc.Start(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st := fencertest.StoreOn(t, cluster.Endpoints())
	addr, _ := startServer(t, st)
	cc := dial(t, alice, addr)
	c := client.New(cc)
	session := newSession(t, c)
	l, err := session.Acquire(ctx, "jobs")
	require.NoError(t, err)
	watch, err := fencerv1.NewFencerServiceClient(cc).WatchLease(ctx, &fencerv1.WatchLeaseRequest{SessionId: session.ID()})
	require.NoError(t, err)
	first, err := watch.Recv()
	require.NoError(t, err)
	require.Equal(t, fencerv1.WatchLeaseResponse_TYPE_SYNCED, first.GetType())

	leader, err := cluster.Leader(ctx)
	require.NoError(t, err)
	cluster.Kill(leader)
	cluster.Kill((leader + 1) % 3)

	for {
		_, err = watch.Recv()
		if err != nil {
			break
		}
	}
	requireEtcdError(t, err, codes.Unavailable, fencerv1.ErrorReason_ERROR_REASON_STORE_UNAVAILABLE.Reason(), "no_leader")
	start := time.Now()
	_, err = c.Put(ctx, l.Token(), "k", []byte("v"))
	t.Logf("guarded write without quorum: %v after %v", err, time.Since(start))
	requireEtcdError(t, err, codes.Unavailable, fencerv1.ErrorReason_ERROR_REASON_STORE_UNAVAILABLE.Reason(), "timeout", "no_leader")
}

// TestOverTheEtcdClientsSendLimitIsInvalidArgument sends a Txn that fits
// the server's request limit but whose etcd Txn (with its guard and owner
// records) does not fit the etcd client's send limit (2 MiB): it is the
// caller's INVALID_ARGUMENT (cause request_too_large, do not retry), as
// etcd's own "request is too large" is, and writes nothing. A Put of a new
// key with a 1 MiB value, which the docs allow, succeeds and reads back.
func TestOverTheEtcdClientsSendLimitIsInvalidArgument(t *testing.T) {
	ctx := fencertest.Context(t)
	st := fencertest.SharedStore(t)
	addr, _ := startServer(t, st)
	cc := dial(t, alice, addr)
	raw := fencerv1.NewFencerServiceClient(cc)
	l, err := newSession(t, client.New(cc)).Acquire(ctx, "jobs")
	require.NoError(t, err)

	req := &fencerv1.TxnRequest{Token: l.Token().String()}
	for i := range 64 {
		req.Success = append(req.Success, &fencerv1.Op{Op: &fencerv1.Op_Put{Put: &fencerv1.PutOp{Key: fmt.Sprintf("k%02d", i)}}})
	}
	value := (server.MaxRequestBytes - proto.Size(req) - 64*8) / 64
	for _, op := range req.Success {
		op.GetPut().Value = make([]byte, value)
	}
	require.Less(t, proto.Size(req), server.MaxRequestBytes)
	_, err = raw.Txn(ctx, req)
	requireEtcdError(t, err, codes.InvalidArgument, fencerv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT.Reason(), "request_too_large")
	require.Equal(t, "request", errorInfo(t, err).GetMetadata()["field"])
	_, ok, err := st.Get(ctx, "k00")
	require.NoError(t, err)
	require.False(t, ok, "the refused Txn wrote")

	big := []byte(strings.Repeat("v", 1<<20))
	_, err = raw.Put(ctx, &fencerv1.PutRequest{Token: l.Token().String(), Key: "fresh", Value: big})
	require.NoError(t, err, "a 1 MiB value to a new key")
	got, err := raw.Get(ctx, &fencerv1.GetRequest{Key: "fresh"})
	require.NoError(t, err)
	require.Equal(t, big, got.GetValue())
}
