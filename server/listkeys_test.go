package server_test

import (
	"encoding/base64"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fencer-dev/fencer/client"
	"github.com/fencer-dev/fencer/fencertest"
	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
)

// listKeys reads every page of ListKeys for prefix as cl, and returns the
// keys with their values, and the size of each page.
func listKeys(t *testing.T, cl fencerv1.FencerServiceClient, prefix string, pageSize int32) (keys map[string][]byte, order []string, sizes []int) {
	t.Helper()
	ctx := fencertest.Context(t)
	keys = map[string][]byte{}
	req := &fencerv1.ListKeysRequest{Prefix: prefix, PageSize: pageSize}
	for {
		resp, err := cl.ListKeys(ctx, req)
		require.NoError(t, err)
		sizes = append(sizes, len(resp.GetKeys()))
		for _, kv := range resp.GetKeys() {
			keys[kv.GetKey()] = kv.GetValue()
			order = append(order, kv.GetKey())
			require.NotZero(t, kv.GetModRevision(), kv.GetKey())
		}
		if resp.GetNextPageToken() == "" {
			return keys, order, sizes
		}
		req.PageToken = resp.GetNextPageToken()
	}
}

// TestListKeysPages puts 25 keys under a prefix, and keys beside it, and
// reads them back a page at a time through the service and the Go client:
// every key under the prefix and no other, in order, with its bytes.
func TestListKeysPages(t *testing.T) {
	ctx := fencertest.Context(t)
	st := fencertest.SharedStore(t)
	addr, _ := startServer(t, st)
	c := client.New(dial(t, alice, addr))
	l, err := newSession(t, c).Acquire(ctx, "orders")
	require.NoError(t, err)
	var want []string
	for i := range 25 {
		key := fmt.Sprintf("orders/%02d", i)
		_, err := c.Put(ctx, l.Token(), key, []byte{byte(i), 0xff})
		require.NoError(t, err)
		want = append(want, key)
	}
	for _, key := range []string{"orders", "orders.", "order/1", "ordersx/1"} {
		_, err := c.Put(ctx, l.Token(), key, []byte(key))
		require.NoError(t, err)
	}

	raw := fencerv1.NewFencerServiceClient(dial(t, alice, addr))
	keys, order, sizes := listKeys(t, raw, "orders/", 10)
	require.Equal(t, []int{10, 10, 5}, sizes)
	require.Equal(t, want, order)
	for i, key := range want {
		require.Equal(t, []byte{byte(i), 0xff}, keys[key])
	}
	_, all, _ := listKeys(t, raw, "", 0)
	require.Equal(t, append([]string{"order/1", "orders", "orders."}, append(want, "ordersx/1")...), all)
	_, none, _ := listKeys(t, raw, "nothing/", 0)
	require.Empty(t, none)

	// A page token is a position in key order: one before the prefix
	// starts at its first key, one past it ends the listing.
	for _, tc := range []struct {
		after string
		want  []string
	}{{"a", want}, {"orders/20", want[21:]}, {"zzz", nil}} {
		resp, err := raw.ListKeys(ctx, &fencerv1.ListKeysRequest{Prefix: "orders/", PageToken: base64.RawURLEncoding.EncodeToString([]byte(tc.after))})
		require.NoError(t, err)
		var got []string
		for _, kv := range resp.GetKeys() {
			got = append(got, kv.GetKey())
		}
		require.Equal(t, tc.want, got, "after %q", tc.after)
	}

	list, err := c.ListKeys(ctx, "orders/")
	require.NoError(t, err)
	require.Len(t, list, 25)
	for i, kv := range list {
		require.Equal(t, want[i], kv.Key)
		require.Equal(t, []byte{byte(i), 0xff}, kv.Data)
		v, found, err := c.Get(ctx, kv.Key)
		require.NoError(t, err)
		require.True(t, found)
		require.Equal(t, v, kv.Value)
	}

	for _, bad := range []*fencerv1.ListKeysRequest{
		{PageSize: -1},
		{PageSize: 5001},
		{PageToken: "not base64!"},
		{Prefix: "orders/\x01"},
	} {
		_, err := raw.ListKeys(ctx, bad)
		require.Equal(t, codes.InvalidArgument, status.Code(err), "%v: %v", bad, err)
	}
}

// TestListKeysAuthorization lists keys as principals with different read
// grants: each gets only the keys it may read, and no page token names a
// key it may not.
func TestListKeysAuthorization(t *testing.T) {
	ctx := fencertest.Context(t)
	a, b, c := authorizedClients(t)
	orders, err := a.Acquire(ctx, &fencerv1.AcquireRequest{Name: "orders"})
	require.NoError(t, err)
	billing, err := b.Acquire(ctx, &fencerv1.AcquireRequest{Name: "billing"})
	require.NoError(t, err)
	for _, w := range []struct {
		cl       fencerv1.FencerServiceClient
		tok, key string
	}{
		{a, orders.Token, "orders/1"}, {a, orders.Token, "orders/2"}, {a, orders.Token, "shared/1"},
		{b, billing.Token, "billing/1"}, {b, billing.Token, "billing/2"}, {b, billing.Token, "shared/2"},
	} {
		_, err := w.cl.Put(ctx, &fencerv1.PutRequest{Token: w.tok, Key: w.key, Value: []byte("secret of " + w.key)})
		require.NoError(t, err)
	}

	for _, size := range []int32{0, 1, 2} {
		// alice may write (so read) orders/* and shared/*; bob may read
		// everything; carol nothing.
		_, got, _ := listKeys(t, a, "", size)
		require.Equal(t, []string{"orders/1", "orders/2", "shared/1", "shared/2"}, got)
		_, got, _ = listKeys(t, b, "", size)
		require.Equal(t, []string{"billing/1", "billing/2", "orders/1", "orders/2", "shared/1", "shared/2"}, got)
		_, got, _ = listKeys(t, a, "billing/", size)
		require.Empty(t, got)
		_, got, _ = listKeys(t, c, "", size)
		require.Empty(t, got)
	}

	// Page tokens name only keys the caller may read.
	req := &fencerv1.ListKeysRequest{PageSize: 1}
	for {
		resp, err := a.ListKeys(ctx, req)
		require.NoError(t, err)
		for _, kv := range resp.GetKeys() {
			require.NotContains(t, string(kv.GetValue()), "billing")
		}
		if resp.GetNextPageToken() == "" {
			break
		}
		raw, err := base64.RawURLEncoding.DecodeString(resp.GetNextPageToken())
		require.NoError(t, err)
		require.False(t, strings.HasPrefix(string(raw), "billing/"), "a page token names %q, which alice may not read", raw)
		req.PageToken = resp.GetNextPageToken()
	}
}
