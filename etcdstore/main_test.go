package etcdstore_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fencer-dev/fencer/etcdstore"
	"github.com/fencer-dev/fencer/fencertest"
)

func TestMain(m *testing.M) { fencertest.Main(m, fencertest.IgnoreInProcessPeers()) }

// newSession opens a session of st that is closed when t ends
// (fencertest.Session).
func newSession(t testing.TB, st *etcdstore.Store, opts ...etcdstore.SessionOption) *etcdstore.Session {
	t.Helper()
	return fencertest.Session(t, st, opts...)
}

// holding returns a context, a store on the shared member, a session and
// the session's acquisition of lease name.
func holding(t *testing.T, name string) (context.Context, *etcdstore.Store, *etcdstore.Session, *etcdstore.Lease) {
	t.Helper()
	ctx := fencertest.Context(t)
	st := fencertest.SharedStore(t)
	s := newSession(t, st)
	l, err := s.Acquire(ctx, name)
	require.NoError(t, err)
	return ctx, st, s, l
}
