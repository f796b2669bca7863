package server_test

import (
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fencer-dev/fencer/fencertest"
	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
	"github.com/fencer-dev/fencer/server"
)

const carol = "carol-token-0123456789"

// startAuthorized serves st with bearer tokens for alice, bob and carol and
// an Authorization that grants alice the orders names, bob the billing
// names (and reading everything), both the lease "shared", and carol
// nothing.
func startAuthorized(t *testing.T) string {
	t.Helper()
	addr, _ := serve(t, authorizedConfig(t))
	return addr
}

// authorizedConfig is the Config that startAuthorized serves.
func authorizedConfig(t *testing.T) server.Config {
	t.Helper()
	tokens := map[string]string{carol: "carol"}
	for k, v := range testTokens {
		tokens[k] = v
	}
	auth, err := server.NewBearerTokens(tokens)
	require.NoError(t, err)
	dir := t.TempDir()
	path := filepath.Join(dir, "authz.yaml")
	require.NoError(t, os.WriteFile(path, []byte(`
principals:
  alice:
    leases: ["orders", "orders-*", "shared"]
    write: ["orders/*", "shared/*"]
    resources: ["orders-db"]
  bob:
    leases: ["billing*", "shared"]
    read: ["*"]
    write: ["billing/*", "shared/*"]
    resources: ["billing-db"]
`), 0o600))
	authz, err := server.LoadAuthorization(path)
	require.NoError(t, err)
	return server.Config{Store: fencertest.SharedStore(t), Authenticator: auth, Authorization: authz}
}

// authorizedClients serves as startAuthorized does and returns clients of
// the service as alice, bob and carol.
func authorizedClients(t *testing.T) (a, b, c fencerv1.FencerServiceClient) {
	t.Helper()
	addr := startAuthorized(t)
	as := func(tok string) fencerv1.FencerServiceClient {
		return fencerv1.NewFencerServiceClient(dial(t, tok, addr))
	}
	return as(alice), as(bob), as(carol)
}

// TestAuthorizationPerRPC calls every RPC that names a lease, key or
// resource as a principal without the grant, and checks that each is
// refused with PERMISSION_DENIED, names nothing of another principal's, and
// changes nothing; and that the same calls within the grants succeed.
func TestAuthorizationPerRPC(t *testing.T) {
	ctx := fencertest.Context(t)
	a, b, c := authorizedClients(t)

	orders, err := a.Acquire(ctx, &fencerv1.AcquireRequest{Name: "orders"})
	require.NoError(t, err)
	_, err = a.Put(ctx, &fencerv1.PutRequest{Token: orders.Token, Key: "orders/total", Value: []byte("100")})
	require.NoError(t, err)
	_, err = a.Advance(ctx, &fencerv1.AdvanceRequest{Resource: "orders-db", Token: orders.Token})
	require.NoError(t, err)
	billing, err := b.Acquire(ctx, &fencerv1.AcquireRequest{Name: "billing"})
	require.NoError(t, err)

	denied := func(t *testing.T, err error) {
		t.Helper()
		require.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
		require.NotContains(t, err.Error(), "alice", "a denial leaks nothing of alice's")
		require.NotContains(t, err.Error(), orders.Holder)
	}
	for _, tc := range []struct {
		name string
		call func() error
	}{
		{"acquire another's lease name", func() error {
			_, err := b.Acquire(ctx, &fencerv1.AcquireRequest{Name: "orders"})
			return err
		}},
		{"check another's token", func() error {
			_, err := b.Check(ctx, &fencerv1.CheckRequest{Token: orders.Token})
			return err
		}},
		{"release another's token", func() error {
			_, err := b.Release(ctx, &fencerv1.ReleaseRequest{Target: &fencerv1.ReleaseRequest_Token{Token: orders.Token}})
			return err
		}},
		{"advance another's resource", func() error {
			_, err := b.Advance(ctx, &fencerv1.AdvanceRequest{Resource: "orders-db", Token: billing.Token})
			return err
		}},
		{"put another's key", func() error {
			_, err := b.Put(ctx, &fencerv1.PutRequest{Token: billing.Token, Key: "orders/total", Value: []byte("0")})
			return err
		}},
		{"delete another's key", func() error {
			_, err := b.Delete(ctx, &fencerv1.DeleteRequest{Token: billing.Token, Key: "orders/total"})
			return err
		}},
		{"get a key without a read grant", func() error {
			_, err := c.Get(ctx, &fencerv1.GetRequest{Key: "orders/total"})
			return err
		}},
		{"txn writing another's key", func() error {
			_, err := b.Txn(ctx, &fencerv1.TxnRequest{Token: billing.Token,
				Success: []*fencerv1.Op{{Op: &fencerv1.Op_Put{Put: &fencerv1.PutOp{Key: "orders/total", Value: []byte("0")}}}}})
			return err
		}},
		{"txn deleting another's key in its failure branch", func() error {
			_, err := b.Txn(ctx, &fencerv1.TxnRequest{Token: billing.Token,
				Failure: []*fencerv1.Op{{Op: &fencerv1.Op_Delete{Delete: &fencerv1.DeleteOp{Key: "orders/total"}}}}})
			return err
		}},
		{"txn comparing a key without a read grant", func() error {
			_, err := c.Txn(ctx, &fencerv1.TxnRequest{Token: billing.Token,
				Compares: []*fencerv1.Compare{{Key: "orders/total", Target: fencerv1.Compare_TARGET_VERSION, Result: fencerv1.Compare_RESULT_EQUAL}}})
			return err
		}},
		{"a principal with no grants acquires", func() error {
			_, err := c.Acquire(ctx, &fencerv1.AcquireRequest{Name: "billing"})
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) { denied(t, tc.call()) })
	}

	// Nothing changed: alice's lease, key and resource are as she left them.
	_, err = a.Check(ctx, &fencerv1.CheckRequest{Token: orders.Token})
	require.NoError(t, err)
	got, err := b.Get(ctx, &fencerv1.GetRequest{Key: "orders/total"})
	require.NoError(t, err, "bob may read everything")
	require.Equal(t, "100", string(got.Value))
	_, err = a.Advance(ctx, &fencerv1.AdvanceRequest{Resource: "orders-db", Token: orders.Token})
	require.NoError(t, err)

	// Within the grants.
	_, err = b.Put(ctx, &fencerv1.PutRequest{Token: billing.Token, Key: "billing/x", Value: []byte("1")})
	require.NoError(t, err)
	_, err = b.Acquire(ctx, &fencerv1.AcquireRequest{Name: "billing-eu", SessionId: billing.SessionId})
	require.NoError(t, err)

	// A key of alice's lease, which bob may write: the refusal does not
	// name alice's lease, which bob may not use.
	_, err = a.Put(ctx, &fencerv1.PutRequest{Token: orders.Token, Key: "shared/7", Value: []byte("a")})
	require.NoError(t, err)
	_, err = b.Put(ctx, &fencerv1.PutRequest{Token: billing.Token, Key: "shared/7", Value: []byte("b")})
	require.Equal(t, codes.FailedPrecondition, status.Code(err), "%v", err)
	require.NotContains(t, err.Error(), "orders")
	for _, d := range status.Convert(err).Details() {
		require.NotContains(t, stringify(d), "orders")
	}

	// Listing shows each principal only the leases it may use, page by
	// page, with page tokens that name none of the others, and another
	// principal's holder as such.
	_, err = a.Acquire(ctx, &fencerv1.AcquireRequest{Name: "shared", SessionId: orders.SessionId})
	require.NoError(t, err)
	names := func(cl fencerv1.FencerServiceClient, pageSize int32) []string {
		var out []string
		req := &fencerv1.ListLeasesRequest{PageSize: pageSize}
		for {
			resp, err := cl.ListLeases(ctx, req)
			require.NoError(t, err)
			for _, l := range resp.GetLeases() {
				out = append(out, l.GetName())
				if l.GetName() == "shared" && cl == b {
					require.Equal(t, "another principal", l.GetHolder())
				}
			}
			if resp.GetNextPageToken() == "" {
				return out
			}
			raw, err := base64.RawURLEncoding.DecodeString(resp.GetNextPageToken())
			require.NoError(t, err)
			if cl != a {
				require.NotContains(t, string(raw), "orders", "a page token names a lease the caller may not use")
			}
			req.PageToken = resp.GetNextPageToken()
		}
	}
	for _, size := range []int32{0, 1, 2} {
		require.Equal(t, []string{"orders", "shared"}, names(a, size))
		require.Equal(t, []string{"billing", "billing-eu", "shared"}, names(b, size))
		require.Empty(t, names(c, size))
	}
}

// TestAcquireThroughAnotherPrincipalsSession checks the order of refusals:
// acquiring through a session that is not the caller's is PERMISSION_DENIED
// even when the lease is held, and a HELD_BY_ANOTHER answer never names
// another principal's holder.
func TestAcquireThroughAnotherPrincipalsSession(t *testing.T) {
	ctx := fencertest.Context(t)
	for _, authorized := range []bool{false, true} {
		addr, _ := startServer(t, fencertest.SharedStore(t))
		if authorized {
			addr = startAuthorized(t)
		}
		a := fencerv1.NewFencerServiceClient(dial(t, alice, addr))
		b := fencerv1.NewFencerServiceClient(dial(t, bob, addr))
		held, err := a.Acquire(ctx, &fencerv1.AcquireRequest{Name: "shared"})
		require.NoError(t, err)

		_, err = b.Acquire(ctx, &fencerv1.AcquireRequest{Name: "shared", SessionId: held.SessionId})
		require.Equal(t, codes.PermissionDenied, status.Code(err), "authorized=%v: %v", authorized, err)
		require.NotContains(t, err.Error(), held.Holder)

		_, err = b.Acquire(ctx, &fencerv1.AcquireRequest{Name: "shared"})
		require.Equal(t, codes.FailedPrecondition, status.Code(err), "%v", err)
		require.NotContains(t, err.Error(), held.Holder)
		require.NotContains(t, err.Error(), "alice")
		for _, d := range status.Convert(err).Details() {
			require.NotContains(t, strings.ToLower(stringify(d)), "alice")
		}
	}
}

func stringify(v any) string {
	if s, ok := v.(interface{ String() string }); ok {
		return s.String()
	}
	return ""
}

func TestLoadAuthorizationRejectsBadFiles(t *testing.T) {
	for name, body := range map[string]string{
		"empty":             "",
		"no principals":     "principals: {}\n",
		"unknown field":     "principals:\n  alice:\n    lease: [\"x\"]\n",
		"star inside":       "principals:\n  alice:\n    leases: [\"a*b\"]\n",
		"empty pattern":     "principals:\n  alice:\n    write: [\"\"]\n",
		"invalid principal": "principals:\n  \"a/b\":\n    leases: [\"x\"]\n",
		"not yaml":          "principals: [\n",
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "authz.yaml")
			require.NoError(t, os.WriteFile(path, []byte(body), 0o600))
			_, err := server.LoadAuthorization(path)
			require.Error(t, err)
			require.Contains(t, err.Error(), path)
		})
	}
}

// TestAuthorizationBadPatternNamesItsField checks that a bad pattern's
// error names the field it is in: write patterns also grant reading, but
// a bad one is reported as write's.
func TestAuthorizationBadPatternNamesItsField(t *testing.T) {
	for field, g := range map[string]server.Grants{
		"leases":    {Leases: []string{"a**"}},
		"read":      {Read: []string{"a**"}},
		"write":     {Write: []string{"a**"}},
		"resources": {Resources: []string{"a**"}},
	} {
		_, err := server.NewAuthorization(map[string]server.Grants{"alice": g})
		require.Error(t, err, field)
		require.Contains(t, err.Error(), `principal "alice": `+field+`: pattern "a**"`)
	}
}

func TestAuthorizationPatterns(t *testing.T) {
	a, err := server.NewAuthorization(map[string]server.Grants{
		"p": {Leases: []string{"exact", "pre*"}, Write: []string{"*"}},
	})
	require.NoError(t, err)
	for _, tc := range []struct {
		kind, name string
		want       bool
	}{
		{"lease", "exact", true},
		{"lease", "exactly", false},
		{"lease", "pre", true},
		{"lease", "prefix", true},
		{"lease", "pr", false},
		{"read", "anything", true},
		{"write", "anything", true},
		{"resource", "anything", false},
		{"unknown", "exact", false},
	} {
		require.Equal(t, tc.want, a.Allowed("p", tc.kind, tc.name), "%s %s", tc.kind, tc.name)
		require.False(t, a.Allowed("q", tc.kind, tc.name), "an unlisted principal may do nothing")
	}
}
