package etcdstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fencer-dev/fencer/etcdstore"
	"github.com/fencer-dev/fencer/internal/etcdtest"
)

func TestMain(m *testing.M) { etcdtest.Main(m) }

func newSession(t testing.TB, st *etcdstore.Store, opts ...etcdstore.SessionOption) *etcdstore.Session {
	t.Helper()
	s, err := st.NewSession(context.Background(), opts...)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.Close(ctx)
	})
	return s
}
