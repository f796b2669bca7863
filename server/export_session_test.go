package server

import (
	"testing"

	"github.com/fencer-dev/fencer/token"
)

// SetAcquiredHook makes every Acquire call h with its token after the
// acquiring Txn, before the reply, until tb ends. Call it before starting
// the server.
func SetAcquiredHook(tb testing.TB, h func(token.Token)) {
	acquiredHook = h
	tb.Cleanup(func() { acquiredHook = nil })
}
