package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
	"github.com/fencer-dev/fencer/token"
)

// TestServeFailsFastWhenEtcdIsUnreachable runs fencer serve against an
// etcd endpoint with nothing behind it. An Acquire and a guarded Put sent
// without a deadline must not hang: each fails with UNAVAILABLE,
// STORE_UNAVAILABLE and the cause etcd_unreachable, saying that a write
// may have committed, once the server's bound on one etcd request ends.
// And the server does not claim to serve before etcd has answered.
func TestServeFailsFastWhenEtcdIsUnreachable(t *testing.T) {
	nothing := "http://" + freeAddr(t) // a closed port
	addr, logs := startServeLogged(t, serveFlags{etcdEndpoints: nothing, prefix: "/unreachable/", etcdRequestTimeout: 2 * time.Second})
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer cc.Close()
	c := fencerv1.NewFencerServiceClient(cc)

	tok := token.Token{Lease: "l", Epoch: 1, Revision: 7}.String()
	calls := map[string]func(context.Context) error{
		"Acquire": func(ctx context.Context) error {
			_, err := c.Acquire(ctx, &fencerv1.AcquireRequest{Name: "l"})
			return err
		},
		"Put": func(ctx context.Context) error {
			_, err := c.Put(ctx, &fencerv1.PutRequest{Token: tok, Key: "k", Value: []byte("v")})
			return err
		},
	}
	errs := make(chan error, len(calls))
	for _, call := range calls {
		go func() {
			// No deadline: only the server's bound may end the call.
			errs <- status.Convert(call(context.Background())).Err()
		}()
	}
	for range calls {
		var err error
		select {
		case err = <-errs:
		case <-time.After(time.Minute):
			t.Fatalf("a call without a deadline hangs while etcd is unreachable; server log:\n%s", logs)
		}
		st := status.Convert(err)
		require.Equal(t, codes.Unavailable, st.Code(), "%v", err)
		var info *errdetails.ErrorInfo
		for _, d := range st.Details() {
			if i, ok := d.(*errdetails.ErrorInfo); ok {
				info = i
			}
		}
		require.NotNil(t, info, "%v", err)
		require.Equal(t, fencerv1.ErrorReason_ERROR_REASON_STORE_UNAVAILABLE.Reason(), info.GetReason())
		require.Equal(t, "etcd_unreachable", info.GetMetadata()["cause"], "%v", err)
		require.Contains(t, st.Message(), "may have committed")
	}
	for _, line := range strings.Split(logs.String(), "\n") {
		require.NotContains(t, line, "msg=serving", "fencer serve claimed to serve before etcd answered")
	}
}

// TestServeLogsTheEtcdClientsWarnings runs fencer serve against an etcd
// endpoint with nothing behind it: the etcd client's warnings about the
// requests it could not send reach fencer's log, at warn, with
// component=etcd-client.
func TestServeLogsTheEtcdClientsWarnings(t *testing.T) {
	nothing := "http://" + freeAddr(t) // a closed port
	_, logs := startServeLogged(t, serveFlags{etcdEndpoints: nothing, prefix: "/client-logs/", logFormat: "json"})
	require.Eventually(t, func() bool {
		for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
			var rec map[string]any
			if json.Unmarshal([]byte(line), &rec) == nil && rec["component"] == "etcd-client" && rec["level"] == "WARN" {
				return true
			}
		}
		return false
	}, 30*time.Second, 50*time.Millisecond, "no warning of the etcd client in fencer's log:\n%s", logs)
}
