package kubefencertest_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that no goroutine outlives the tests: the API server's
// waiter, etcd's servers, and the clients' and Held's goroutines.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
