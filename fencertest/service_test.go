package fencertest_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/fencer-dev/fencer/client"
	"github.com/fencer-dev/fencer/etcdstore"
	"github.com/fencer-dev/fencer/fencertest"
	"github.com/fencer-dev/fencer/server"
	"github.com/fencer-dev/fencer/token"
)

// TestService runs the service with each kind of credentials, checks that
// its client works and that a client without those credentials is
// refused, and supersedes the client's lease: its next Put is stale and
// its Done fires.
func TestService(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []fencertest.ServiceOption
		// plainRefused reports whether a plaintext client without
		// credentials must be refused; unauthenticated, that the
		// server itself refuses it, past the transport.
		plainRefused, unauthenticated bool
	}{
		{name: "anonymous"},
		{name: "bearer", opts: []fencertest.ServiceOption{fencertest.WithBearerToken("alice")}, plainRefused: true, unauthenticated: true},
		{name: "tls", opts: []fencertest.ServiceOption{fencertest.WithTLS()}, plainRefused: true},
		{name: "tls-bearer", opts: []fencertest.ServiceOption{fencertest.WithTLS(), fencertest.WithBearerToken("alice")}, plainRefused: true},
		{name: "mtls", opts: []fencertest.ServiceOption{fencertest.WithClientCert("alice")}, plainRefused: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := ctx(t)
			svc := fencertest.Service(t, tc.opts...)
			sess, err := svc.Client.NewSession()
			require.NoError(t, err)
			t.Cleanup(func() { _ = sess.Close(c) })
			held, err := sess.Acquire(c, "orders")
			require.NoError(t, err)
			_, err = svc.Client.Put(c, held.Token(), "total", []byte("100"))
			require.NoError(t, err)

			cc, err := grpc.NewClient(svc.Addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			require.NoError(t, err)
			t.Cleanup(func() { cc.Close() })
			_, _, err = client.New(cc).Get(c, "total")
			if tc.plainRefused {
				require.Error(t, err, "a client without the service's credentials must be refused")
				if tc.unauthenticated {
					require.ErrorIs(t, err, client.ErrUnauthenticated)
				}
			} else {
				require.NoError(t, err)
			}

			newer := fencertest.Supersede(t, svc.Store, held)
			_, err = svc.Client.Put(c, held.Token(), "total", []byte("late"))
			var stale *token.StaleError
			require.ErrorAs(t, err, &stale)
			require.Equal(t, newer.Token(), stale.Newer)
			waitDone(t, held)
			require.ErrorIs(t, held.Err(), etcdstore.ErrLeaseLost)
			_, err = svc.Store.Put(c, newer.Token(), "total", []byte("250"))
			require.NoError(t, err)
		})
	}
}

// TestServiceAuthorization checks that WithAuthorization reaches the
// server: a lease outside the principal's grants is refused.
func TestServiceAuthorization(t *testing.T) {
	c := ctx(t)
	authz, err := server.NewAuthorization(map[string]server.Grants{"alice": {Leases: []string{"orders"}}})
	require.NoError(t, err)
	svc := fencertest.Service(t, fencertest.WithBearerToken("alice"), fencertest.WithAuthorization(authz))
	sess, err := svc.Client.NewSession()
	require.NoError(t, err)
	t.Cleanup(func() { _ = sess.Close(c) })
	_, err = sess.Acquire(c, "orders")
	require.NoError(t, err)
	_, err = sess.Acquire(c, "billing")
	require.ErrorIs(t, err, client.ErrPermissionDenied)
}
