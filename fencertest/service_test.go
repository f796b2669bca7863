package fencertest_test

import (
	"sync/atomic"
	"testing"
	"time"

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
// its Done fires. Without WithAuthorization the authenticated principal
// acquires and writes without grants: the kit allows all, as fencer serve
// --authz-allow-all does.
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
// server and that the principal it judges is the one of the credentials:
// the bearer token's, or the common name of the client certificate of
// WithClientCert. Only alice is granted "orders"; a certificate for bob,
// from the same authority, is refused it.
func TestServiceAuthorization(t *testing.T) {
	authz, err := server.NewAuthorization(map[string]server.Grants{"alice": {Leases: []string{"orders"}}})
	require.NoError(t, err)
	for _, tc := range []struct {
		name    string
		creds   fencertest.ServiceOption
		granted bool
	}{
		{"bearer alice", fencertest.WithBearerToken("alice"), true},
		{"mtls alice", fencertest.WithClientCert("alice"), true},
		{"mtls bob", fencertest.WithClientCert("bob"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := ctx(t)
			svc := fencertest.Service(t, tc.creds, fencertest.WithAuthorization(authz))
			sess, err := svc.Client.NewSession()
			require.NoError(t, err)
			t.Cleanup(func() { _ = sess.Close(c) })
			_, err = sess.Acquire(c, "orders")
			if tc.granted {
				require.NoError(t, err)
			} else {
				require.ErrorIs(t, err, client.ErrPermissionDenied)
			}
			_, err = sess.Acquire(c, "billing")
			require.ErrorIs(t, err, client.ErrPermissionDenied)
		})
	}
}

// countingClock is the real clock, counting the readings taken of it.
type countingClock struct{ readings atomic.Int64 }

func (c *countingClock) Now() time.Time {
	c.readings.Add(1)
	return time.Now()
}

func (c *countingClock) NewTimer(d time.Duration) client.Timer { return timer{time.NewTimer(d)} }

// timer is a time.Timer as a client.Timer.
type timer struct{ *time.Timer }

func (t timer) C() <-chan time.Time { return t.Timer.C }

// TestServiceClientOptions checks that WithClientOptions reaches
// svc.Client, and that Dial gives another client, with the options it is
// passed, the service's credentials and a connection of its own, of the
// same service: a lease its session holds is held for svc.Client too.
func TestServiceClientOptions(t *testing.T) {
	c := ctx(t)
	var mine, dialed countingClock
	svc := fencertest.Service(t, fencertest.WithBearerToken("alice"), fencertest.WithClientOptions(client.WithClock(&mine)))
	other := svc.Dial(t, client.WithClock(&dialed))
	require.NotSame(t, svc.Client, other)

	sess, err := other.NewSession()
	require.NoError(t, err)
	t.Cleanup(func() { _ = sess.Close(c) })
	held, err := sess.Acquire(c, "orders")
	require.NoError(t, err, "Dial's client must carry the service's bearer token")
	require.Positive(t, dialed.readings.Load(), "Dial's options must reach its client")
	require.Zero(t, mine.readings.Load(), "svc.Client has not been used yet")

	mySess, err := svc.Client.NewSession()
	require.NoError(t, err)
	t.Cleanup(func() { _ = mySess.Close(c) })
	_, err = mySess.TryAcquire(c, "orders")
	var heldErr *token.HeldError
	require.ErrorAs(t, err, &heldErr, "both clients must reach the same service")
	require.Positive(t, mine.readings.Load(), "WithClientOptions must reach svc.Client")
	_, err = svc.Client.Put(c, held.Token(), "total", []byte("100"))
	require.NoError(t, err)
}
