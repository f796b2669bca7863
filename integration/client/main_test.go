// Package client_test drives the gRPC client (package client) against a
// real fencer server on a real etcd member. It lives in the root module
// because the client module must not require the server.
package client_test

import (
	"testing"

	"github.com/fencer-dev/fencer/fencertest"
)

// TestMain stops the shared embedded etcd member and checks for leaked
// goroutines with the rules that etcd needs.
func TestMain(m *testing.M) { fencertest.Main(m, fencertest.IgnoreInProcessPeers()) }
