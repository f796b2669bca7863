package fencertest

import (
	"context"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/fencer-dev/fencer/embedetcd"
	"github.com/fencer-dev/fencer/etcdstore"
)

// Etcd starts a one-member etcd cluster in-process, on a free loopback port,
// with its data in a temporary directory of t, and stops it when t ends.
// It is a real etcd server (embedetcd): raft, revisions, leases and watches
// behave as in production.
func Etcd(t TB) *embedetcd.Server {
	t.Helper()
	ctx, cancel := stepContext()
	defer cancel()
	srv, err := embedetcd.Start(ctx, embedetcd.Member{Name: "fencertest", Dir: t.TempDir()})
	if err != nil {
		t.Fatalf("fencertest: start etcd: %v", err)
	}
	t.Cleanup(srv.Close)
	return srv
}

// Client returns an etcd client of endpoints (of the shared member, see
// SharedEtcd, when none are given) that is closed when t ends. It dials
// lazily: a member that is down when Client returns is reached once it
// serves.
func Client(t TB, endpoints ...string) *clientv3.Client {
	t.Helper()
	if len(endpoints) == 0 {
		endpoints = []string{SharedEtcd(t)}
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatalf("fencertest: etcd client: %v", err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// Store returns an etcdstore.Store, made with opts, on a fresh etcd member
// of its own (see Etcd). Everything is stopped when t ends; the caller
// closes only the sessions it opens, or leaves them to end with the member.
// Stores on the same etcd but another prefix (etcdstore.WithPrefix) do not
// see each other's leases or keys.
func Store(t TB, opts ...etcdstore.Option) *etcdstore.Store {
	t.Helper()
	return StoreOn(t, []string{Etcd(t).Endpoint()}, opts...)
}

// StoreOn returns an etcdstore.Store, made with opts, on the etcd cluster
// of endpoints, through a client that is closed when t ends.
func StoreOn(t TB, endpoints []string, opts ...etcdstore.Option) *etcdstore.Store {
	t.Helper()
	st, err := etcdstore.New(Client(t, endpoints...), opts...)
	if err != nil {
		t.Fatalf("fencertest: store: %v", err)
	}
	return st
}

// Session opens a session of st with opts, and closes it when t ends, which
// releases every lease it still holds.
func Session(t TB, st *etcdstore.Store, opts ...etcdstore.SessionOption) *etcdstore.Session {
	t.Helper()
	ctx, cancel := stepContext()
	defer cancel()
	s, err := st.NewSession(ctx, opts...)
	if err != nil {
		t.Fatalf("fencertest: session: %v", err)
	}
	t.Cleanup(func() { closeSession(s.Close) })
	return s
}

// closeSession closes a session within Timeout. A session whose close
// failed still ends its goroutines, and its etcd lease expires.
func closeSession(close func(context.Context) error) {
	ctx, cancel := stepContext()
	defer cancel()
	_ = close(ctx)
}
