// Package servicetest runs fencer's gRPC server on loopback for tests.
package servicetest

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fencer-dev/fencer/server"
)

// Serve serves cfg on a free loopback port until tb ends, then shuts the
// server down gracefully, and returns its address and the server.
func Serve(tb testing.TB, cfg server.Config) (string, *server.Server) {
	tb.Helper()
	srv, err := server.New(cfg)
	require.NoError(tb, err)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(tb, err)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(lis) }()
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
	})
	return lis.Addr().String(), srv
}
