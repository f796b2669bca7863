package fencertest

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fencer-dev/fencer/embedetcd"
	"github.com/fencer-dev/fencer/etcdstore"
)

// shared is the test binary's shared etcd member.
var shared struct {
	once sync.Once
	dir  string
	srv  *embedetcd.Server
	err  error
}

// SharedEtcd returns the client URL of the test binary's shared etcd
// member, starting it on first use, so that a package's tests (and fuzz
// workers that need no etcd) share one member instead of starting one
// each. Main stops it; a TestMain of its own calls StopShared. Tests on
// the shared member see each other's keys unless each keeps to a prefix
// of its own, as SharedStore does.
func SharedEtcd(t TB) string {
	t.Helper()
	shared.once.Do(func() {
		if shared.dir, shared.err = os.MkdirTemp("", "fencer-etcd-"); shared.err != nil {
			return
		}
		ctx, cancel := stepContext()
		defer cancel()
		shared.srv, shared.err = embedetcd.Start(ctx, embedetcd.Member{Name: "shared", Dir: shared.dir})
	})
	if shared.err != nil {
		t.Fatalf("fencertest: start the shared etcd: %v", shared.err)
	}
	return shared.srv.Endpoint()
}

// StopShared stops the shared member, if it was started, and removes its
// data. Main calls it; call it from a TestMain of your own after m.Run.
func StopShared() {
	if shared.srv != nil {
		shared.srv.Close()
	}
	if shared.dir != "" {
		os.RemoveAll(shared.dir)
	}
}

var prefixSeq atomic.Int64

// SharedStore returns an etcdstore.Store on the shared member (see
// SharedEtcd) under a key prefix of its own, so that stores of different
// tests do not see each other's leases or keys; opts follow the prefix (a
// WithPrefix among them replaces it, and then the store shares what it
// sees). It is the fast choice for a package with many tests; Store gives
// each test a member of its own.
func SharedStore(t TB, opts ...etcdstore.Option) *etcdstore.Store {
	t.Helper()
	own := etcdstore.WithPrefix(fmt.Sprintf("/test-%d/", prefixSeq.Add(1)))
	return StoreOn(t, []string{SharedEtcd(t)}, append([]etcdstore.Option{own}, opts...)...)
}

// ContextTimeout bounds the context Context returns.
const ContextTimeout = 30 * time.Second

// Context returns a context that ends after ContextTimeout or when t
// ends, for a test's calls: a hung call fails the test rather than
// hanging it.
func Context(t TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), ContextTimeout)
	t.Cleanup(cancel)
	return ctx
}

// WaitClosed fails t unless ch is closed within d; what names the wait in
// the failure.
func WaitClosed(t TB, ch <-chan struct{}, d time.Duration, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(d):
		t.Fatalf("%s: not done within %s", what, d)
	}
}
