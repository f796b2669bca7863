package freeport_test

import (
	"net"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fencer-dev/fencer/internal/freeport"
)

func TestTakeHoldsDistinctPortsUntilReleased(t *testing.T) {
	ports, release, err := freeport.Take(50)
	require.NoError(t, err)
	seen := map[int]bool{}
	for _, p := range ports {
		require.False(t, seen[p], "port %d handed out twice", p)
		seen[p] = true
		require.Less(t, p, 32768, "port %d is in the ephemeral range", p)
		_, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		require.Error(t, err, "port %d is not held", p)
	}
	release()
	for _, p := range ports {
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		require.NoError(t, err, "port %d is still held after release", p)
		l.Close()
	}
}
