package server_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/fencer-dev/fencer/etcdstore"
	"github.com/fencer-dev/fencer/internal/freeport"
	"github.com/fencer-dev/fencer/server"
	"github.com/fencer-dev/fencer/token"
)

// TestBoundRequests points an etcd client at a closed port: without a
// deadline of their own, each unary request BoundRequests covers, and a
// guarded write through the store (a Txn), fails with ErrEtcdUnreachable
// once the bound has passed, instead of waiting for a connection forever.
// A caller's earlier deadline still ends a request with its own error.
func TestBoundRequests(t *testing.T) {
	ports, release, err := freeport.Take(1)
	require.NoError(t, err)
	release() // nothing listens there
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{fmt.Sprintf("127.0.0.1:%d", ports[0])}, Logger: zap.NewNop()})
	require.NoError(t, err)
	defer cli.Close()
	server.BoundRequests(cli, 200*time.Millisecond)
	st, err := etcdstore.New(cli)
	require.NoError(t, err)
	tok := token.Token{Lease: "l", Epoch: 1, Revision: 7}
	requests := map[string]func(context.Context) error{
		"Get":    func(ctx context.Context) error { _, err := cli.Get(ctx, "k"); return err },
		"Put":    func(ctx context.Context) error { _, err := cli.Put(ctx, "k", "v"); return err },
		"Delete": func(ctx context.Context) error { _, err := cli.Delete(ctx, "k"); return err },
		"Do":     func(ctx context.Context) error { _, err := cli.Do(ctx, clientv3.OpGet("k")); return err },
		"Txn": func(ctx context.Context) error {
			_, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.Version("k"), "=", 0)).Then(clientv3.OpPut("k", "v")).Commit()
			return err
		},
		"Compact":       func(ctx context.Context) error { _, err := cli.Compact(ctx, 1); return err },
		"Grant":         func(ctx context.Context) error { _, err := cli.Grant(ctx, 10); return err },
		"Revoke":        func(ctx context.Context) error { _, err := cli.Revoke(ctx, 1); return err },
		"TimeToLive":    func(ctx context.Context) error { _, err := cli.TimeToLive(ctx, 1); return err },
		"Leases":        func(ctx context.Context) error { _, err := cli.Leases(ctx); return err },
		"KeepAliveOnce": func(ctx context.Context) error { _, err := cli.KeepAliveOnce(ctx, 1); return err },
		"guarded Put":   func(ctx context.Context) error { _, err := st.Put(ctx, tok, "k", []byte("v")); return err },
	}
	for name, req := range requests {
		t.Run(name, func(t *testing.T) {
			done := make(chan error, 1)
			go func() { done <- req(context.Background()) }()
			select {
			case err := <-done:
				require.ErrorIs(t, err, server.ErrEtcdUnreachable)
			case <-time.After(30 * time.Second):
				t.Fatal("a request without a deadline hangs on an unreachable etcd")
			}
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			defer cancel()
			err := req(ctx)
			require.Error(t, err)
			require.False(t, errors.Is(err, server.ErrEtcdUnreachable), "the caller's own deadline came first: %v", err)
		})
	}
}
