package kubetest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fencer-dev/fencer/kubeadapter"
	"github.com/fencer-dev/fencer/kubeadapter/kubefencertest"
	"github.com/fencer-dev/fencer/token"
)

// AdminClients returns env's admin clients: a clientset and a
// controller-runtime client with client-go's scheme.
func AdminClients(tb testing.TB, env *kubefencertest.APIServer) (*kubernetes.Clientset, client.Client) {
	tb.Helper()
	cs, err := kubernetes.NewForConfig(env.Admin())
	require.NoError(tb, err)
	crc, err := client.New(env.Admin(), client.Options{Scheme: clientgoscheme.Scheme})
	require.NoError(tb, err)
	return cs, crc
}

// StaticHolder presents a token and never reports it lost: a holder that
// has not noticed its loss, or a test that bypasses the local check to
// show the store's.
type StaticHolder struct{ Tok token.Token }

// Token returns h's token.
func (h StaticHolder) Token() token.Token { return h.Tok }

// Context returns a context that never ends.
func (h StaticHolder) Context() context.Context { return context.Background() }

// Err returns nil: h is never lost.
func (h StaticHolder) Err() error { return nil }

// Acquire acquires e's Lease within 20 seconds, and releases it when t
// ends.
func Acquire(t *testing.T, e *kubeadapter.Elector) *kubeadapter.Held {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	h, err := e.Acquire(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = h.Release(context.Background()) })
	return h
}

// RequireGreater fails t unless newer is greater than older.
func RequireGreater(t *testing.T, newer, older token.Token) {
	t.Helper()
	c, err := newer.Compare(older)
	require.NoError(t, err)
	require.Equal(t, 1, c, "%v is not greater than %v", newer, older)
}
