package clienttest_test

import (
	"context"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/stretchr/testify/require"

	"github.com/fencer-dev/fencer/client"
	"github.com/fencer-dev/fencer/client/clienttest"
	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
	"github.com/fencer-dev/fencer/token"
)

// TestOptionsReachTheSession checks that the hooks cross the seam into
// package client: the options build, a session takes them, and closing the
// session (which never opened, so it calls no server) ends it. The hooks
// themselves are exercised against a real server in integration/client.
func TestOptionsReachTheSession(t *testing.T) {
	c := client.New(nil)
	s, err := c.NewSession(
		clienttest.WithHooks(clienttest.SessionHooks{
			Acquired: func(token.Token) {},
			Watch:    func(int64) {},
			Received: func(*fencerv1.WatchLeaseResponse) {},
			Check:    func(context.Context, token.Token) error { return nil },
		}),
		clienttest.WithRetry(func(time.Duration) backoff.BackOff { return &backoff.ZeroBackOff{} }),
	)
	require.NoError(t, err)
	require.NoError(t, s.Close(t.Context()))
	require.ErrorIs(t, s.Err(), token.ErrSessionClosed)
}
