package deploy_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that no goroutine outlives the tests: the API server's
// process waiter and the clients' connections must end with the test.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
