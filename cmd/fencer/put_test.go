package main

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/fencer-dev/fencer/client"
)

func TestPutTakeOverCommand(t *testing.T) {
	addr, _ := startService(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { cc.Close() })
	c := client.New(cc)
	s, err := c.NewSession()
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	orders, err := s.Acquire(ctx, "orders")
	require.NoError(t, err)
	billing, err := s.Acquire(ctx, "billing")
	require.NoError(t, err)

	put := func(tok string, args ...string) (int, string) {
		var out, errb bytes.Buffer
		code := runPut(ctx, append([]string{"--server", addr, "--token", tok}, args...), &out, &errb)
		return code, errb.String()
	}
	code, stderr := put(orders.Token().String(), "orders/total", "100")
	require.Equal(t, 0, code, stderr)
	code, stderr = put(billing.Token().String(), "orders/total", "0")
	require.Equal(t, exitForeign, code)
	require.Contains(t, stderr, "foreign lease")
	code, stderr = put(billing.Token().String(), "--take-over", "orders/total", "0")
	require.Equal(t, 0, code, stderr)
	code, stderr = put(orders.Token().String(), "orders/total", "250")
	require.Equal(t, exitForeign, code)
	require.Contains(t, stderr, "foreign lease")
	v, _, err := c.Get(ctx, "orders/total")
	require.NoError(t, err)
	require.Equal(t, "0", string(v.Data))
}
