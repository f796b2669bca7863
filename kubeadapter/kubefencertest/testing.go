package kubefencertest

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"
)

// RequireEnv is the environment variable that, set to 1, makes
// APIServerForTest and BinaryForTest fail rather than skip when there is no
// kube-apiserver or etcd binary. CI=true has the same effect.
const RequireEnv = "FENCER_REQUIRE_KUBE"

// StartTimeout bounds APIServerForTest's wait for the API server to start.
const StartTimeout = 2 * time.Minute

// APIServerForTest starts an APIServer in a temporary directory of t and
// stops it when the test and its subtests have finished. Startup failures
// fail t; the time startup took is logged.
//
// When there is no kube-apiserver or etcd binary, APIServerForTest fails t
// if CI is "true" or FENCER_REQUIRE_KUBE is "1", so that CI never silently
// skips these tests; otherwise it skips t with a message naming make
// kube-apiserver.
func APIServerForTest(t testing.TB) *APIServer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), StartTimeout)
	defer cancel()
	start := time.Now()
	e, err := StartAPIServer(ctx, t.TempDir())
	SkipIfNoBinaries(t, err)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kubefencertest: kube-apiserver ready at %s in %v", e.Admin().Host, time.Since(start).Round(time.Millisecond))
	t.Cleanup(e.Stop)
	return e
}

// BinaryForTest returns BinaryPath's kube-apiserver, for a test that
// starts it in its own way (such as controller-runtime's envtest). When
// there is none it fails or skips t as APIServerForTest does.
func BinaryForTest(t testing.TB) string {
	t.Helper()
	return forTest(t)(BinaryPath())
}

// EtcdForTest returns EtcdPath's etcd, for a test that starts it in its
// own way (such as controller-runtime's envtest, whose Etcd.Path it can
// be). When there is none it fails or skips t as APIServerForTest does.
func EtcdForTest(t testing.TB) string {
	t.Helper()
	return forTest(t)(EtcdPath())
}

// forTest returns a function that returns path, or fails or skips t on err.
func forTest(t testing.TB) func(path string, err error) string {
	return func(path string, err error) string {
		t.Helper()
		SkipIfNoBinaries(t, err)
		if err != nil {
			t.Fatal(err)
		}
		return path
	}
}

// SkipIfNoBinaries skips t if err (from StartAPIServer, BinaryPath or
// EtcdPath) says there is no kube-apiserver or etcd binary and a missing one
// need not fail the tests (neither CI=true nor FENCER_REQUIRE_KUBE=1). It
// does nothing for any other err, nil included: the caller still fails t on
// one.
func SkipIfNoBinaries(t testing.TB, err error) {
	t.Helper()
	if (errors.Is(err, ErrNoBinary) || errors.Is(err, ErrNoEtcd)) && !required() {
		t.Skipf("%v; or set %s and %s to the binaries", err, BinaryEnv, EtcdEnv)
	}
}

// required reports whether a missing kube-apiserver must fail the tests.
func required() bool {
	return os.Getenv("CI") == "true" || os.Getenv(RequireEnv) == "1"
}
