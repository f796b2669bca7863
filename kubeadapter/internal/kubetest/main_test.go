package kubetest_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that no goroutine outlives the tests: an Env's process
// waiter, etcd's servers and the clients' connections must all end with Stop.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
