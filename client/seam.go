package client

import (
	"context"
	"time"

	"github.com/cenkalti/backoff/v5"

	"github.com/fencer-dev/fencer/client/internal/seam"
	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
	"github.com/fencer-dev/fencer/token"
)

// The test hooks of sessions reach package clienttest through seam, so
// that they are not part of this package's API.
func init() {
	seam.WithHooks = func(acquired func(token.Token), watch func(from int64), received func(*fencerv1.WatchLeaseResponse), check func(context.Context, token.Token) error) SessionOption {
		return func(s *Session) {
			s.hooks = sessionHooks{acquired: acquired, watch: watch, received: received, check: check}
		}
	}
	seam.WithRetry = func(newBackOff func(maxInterval time.Duration) backoff.BackOff) SessionOption {
		return func(s *Session) { s.retry = newBackOff }
	}
}
