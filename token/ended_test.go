package token_test

import (
	"context"
	"errors"
	"testing"

	"github.com/fencer-dev/fencer/token"
)

// TestEnded checks that Ended is nil while the context runs and then the
// cause it was cancelled with, or context.Canceled without one.
func TestEnded(t *testing.T) {
	ctx, cancel := context.WithCancelCause(context.Background())
	if err := token.Ended(ctx); err != nil {
		t.Fatalf("running: %v, want nil", err)
	}
	cancel(token.ErrReleased)
	if err := token.Ended(ctx); !errors.Is(err, token.ErrReleased) {
		t.Fatalf("ended: %v, want token.ErrReleased", err)
	}
	plain, stop := context.WithCancel(context.Background())
	stop()
	if err := token.Ended(plain); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled without a cause: %v, want context.Canceled", err)
	}
}
