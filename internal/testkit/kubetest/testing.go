package kubetest

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"
)

// RequireEnv is the environment variable that, set to 1, makes StartForTest
// fail rather than skip when there is no kube-apiserver binary. CI=true has
// the same effect.
const RequireEnv = "FENCER_REQUIRE_KUBE"

// startTimeout bounds StartForTest's wait for the API server.
const startTimeout = 2 * time.Minute

// StartForTest starts an Env in a temporary directory of t and stops it when
// the test and its subtests have finished. Startup failures fail t; the
// time startup took is logged.
//
// When there is no kube-apiserver binary, StartForTest fails t if CI is
// "true" or FENCER_REQUIRE_KUBE is "1", so that CI never silently skips
// these tests; otherwise it skips t with a message naming make
// kube-apiserver.
func StartForTest(t testing.TB) *Env {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	start := time.Now()
	e, err := Start(ctx, t.TempDir())
	skipIfNoBinary(t, err)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kubetest: kube-apiserver ready at %s in %v", e.Admin().Host, time.Since(start).Round(time.Millisecond))
	t.Cleanup(e.Stop)
	return e
}

// BinaryForTest returns BinaryPath's kube-apiserver, for a test that
// starts it in its own way (such as controller-runtime's envtest). When
// there is none it fails or skips t as StartForTest does.
func BinaryForTest(t testing.TB) string {
	t.Helper()
	path, err := BinaryPath()
	skipIfNoBinary(t, err)
	if err != nil {
		t.Fatal(err)
	}
	return path
}

// skipIfNoBinary skips t if err says there is no kube-apiserver binary
// and a missing one need not fail the tests.
func skipIfNoBinary(t testing.TB, err error) {
	t.Helper()
	if errors.Is(err, ErrNoBinary) && !required() {
		t.Skipf("%v; or set %s to a kube-apiserver binary", err, BinaryEnv)
	}
}

// required reports whether a missing kube-apiserver must fail the tests.
func required() bool {
	return os.Getenv("CI") == "true" || os.Getenv(RequireEnv) == "1"
}
