package server_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fencer-dev/fencer/client"
	"github.com/fencer-dev/fencer/etcdstore"
	"github.com/fencer-dev/fencer/fencertest"
	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
)

// TestBadInputOnceAtTheEdge sends, through the real gRPC service, each
// kind of bad input that both the service and etcdstore could refuse (the
// token's lease name, data keys, values, resources), and pins what a
// client sees: the code, the ErrorInfo reason, the field of the
// BadRequest, and the message. The service checks each input once, before
// anything else it does for the call, so the answer does not depend on
// the token's state: a bad key with another principal's token, or with a
// stale one, is still INVALID_ARGUMENT, not PERMISSION_DENIED or a stale
// token. Nothing under the store's prefix changes.
func TestBadInputOnceAtTheEdge(t *testing.T) {
	ctx := fencertest.Context(t)
	st := fencertest.SharedStore(t)
	addr, _ := startServer(t, st)
	raw := fencerv1.NewFencerServiceClient(dial(t, alice, addr))
	s := newSession(t, client.New(dial(t, alice, addr)))
	old, err := s.Acquire(ctx, "edge")
	require.NoError(t, err)
	stale := old.Token().String()
	require.NoError(t, old.Release(ctx))
	l, err := s.Acquire(ctx, "edge")
	require.NoError(t, err)
	good := l.Token().String()
	lb, err := newSession(t, client.New(dial(t, bob, addr))).Acquire(ctx, "edge-bob")
	require.NoError(t, err)
	bobs := lb.Token().String()
	const slashToken = "v1:1:5:a/b"
	longKey := strings.Repeat("k", etcdstore.MaxKeyLen+1)
	bigValue := make([]byte, etcdstore.MaxValueLen+1)
	before, err := st.Client().Get(ctx, st.Prefix(), clientv3.WithPrefix())
	require.NoError(t, err)

	invalidArg, invalidToken := fencerv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT.Reason(), fencerv1.ErrorReason_ERROR_REASON_INVALID_TOKEN.Reason()
	cases := []struct {
		name, reason, field, message string
		call                         func(ctx context.Context) error
	}{
		{"put: token of a lease with a slash", invalidArg, "token", `invalid lease "a/b": contains the key separator "/" (field token)`, func(ctx context.Context) error {
			_, err := raw.Put(ctx, &fencerv1.PutRequest{Token: slashToken, Key: "k"})
			return err
		}},
		{"put: token with a space", invalidToken, "token", `malformed token: lease "a b": contains a space or control character (a token looks like v1:EPOCH:REVISION:LEASE)`, func(ctx context.Context) error {
			_, err := raw.Put(ctx, &fencerv1.PutRequest{Token: "v1:1:5:a b", Key: "k"})
			return err
		}},
		{"put: empty key", invalidArg, "key", `invalid key "": empty`, func(ctx context.Context) error {
			_, err := raw.Put(ctx, &fencerv1.PutRequest{Token: good, Key: ""})
			return err
		}},
		{"put: key too long", invalidArg, "key", `invalid key "` + longKey[:64] + `": longer than 1024 bytes`, func(ctx context.Context) error {
			_, err := raw.Put(ctx, &fencerv1.PutRequest{Token: good, Key: longKey})
			return err
		}},
		{"put: key with a control character", invalidArg, "key", `invalid key "a\x01": contains a control character`, func(ctx context.Context) error {
			_, err := raw.Put(ctx, &fencerv1.PutRequest{Token: good, Key: "a\x01"})
			return err
		}},
		{"put: value too large", invalidArg, "value", `invalid value "1048577 bytes": larger than 1048576 bytes`, func(ctx context.Context) error {
			_, err := raw.Put(ctx, &fencerv1.PutRequest{Token: good, Key: "k", Value: bigValue})
			return err
		}},
		{"put: bad key with another principal's token", invalidArg, "key", `invalid key "": empty`, func(ctx context.Context) error {
			_, err := raw.Put(ctx, &fencerv1.PutRequest{Token: bobs, Key: ""})
			return err
		}},
		{"put: bad value with a stale token", invalidArg, "value", `invalid value "1048577 bytes": larger than 1048576 bytes`, func(ctx context.Context) error {
			_, err := raw.Put(ctx, &fencerv1.PutRequest{Token: stale, Key: "k", Value: bigValue})
			return err
		}},
		{"delete: token of a lease with a slash", invalidArg, "token", `invalid lease "a/b": contains the key separator "/" (field token)`, func(ctx context.Context) error {
			_, err := raw.Delete(ctx, &fencerv1.DeleteRequest{Token: slashToken, Key: "k"})
			return err
		}},
		{"delete: empty key", invalidArg, "key", `invalid key "": empty`, func(ctx context.Context) error {
			_, err := raw.Delete(ctx, &fencerv1.DeleteRequest{Token: good})
			return err
		}},
		{"delete: bad key with another principal's token", invalidArg, "key", `invalid key "a\x01": contains a control character`, func(ctx context.Context) error {
			_, err := raw.Delete(ctx, &fencerv1.DeleteRequest{Token: bobs, Key: "a\x01"})
			return err
		}},
		{"delete: bad key with a stale token", invalidArg, "key", `invalid key "": empty`, func(ctx context.Context) error {
			_, err := raw.Delete(ctx, &fencerv1.DeleteRequest{Token: stale})
			return err
		}},
		{"get: empty key", invalidArg, "key", `invalid key "": empty`, func(ctx context.Context) error {
			_, err := raw.Get(ctx, &fencerv1.GetRequest{})
			return err
		}},
		{"get: key too long", invalidArg, "key", `invalid key "` + longKey[:64] + `": longer than 1024 bytes`, func(ctx context.Context) error {
			_, err := raw.Get(ctx, &fencerv1.GetRequest{Key: longKey})
			return err
		}},
		{"check: token of a lease with a slash", invalidArg, "token", `invalid lease "a/b": contains the key separator "/" (field token)`, func(ctx context.Context) error {
			_, err := raw.Check(ctx, &fencerv1.CheckRequest{Token: slashToken})
			return err
		}},
		{"advance: empty resource", invalidArg, "resource", `invalid resource "": empty`, func(ctx context.Context) error {
			_, err := raw.Advance(ctx, &fencerv1.AdvanceRequest{Token: good})
			return err
		}},
		{"advance: token of a lease with a slash", invalidArg, "token", `invalid lease "a/b": contains the key separator "/" (field token)`, func(ctx context.Context) error {
			_, err := raw.Advance(ctx, &fencerv1.AdvanceRequest{Resource: "r", Token: slashToken})
			return err
		}},
		{"advance: bad resource with another principal's token", invalidArg, "resource", `invalid resource "a/b": contains the key separator "/"`, func(ctx context.Context) error {
			_, err := raw.Advance(ctx, &fencerv1.AdvanceRequest{Resource: "a/b", Token: bobs})
			return err
		}},
		{"txn: token of a lease with a slash", invalidArg, "token", `invalid lease "a/b": contains the key separator "/" (field token)`, func(ctx context.Context) error {
			_, err := raw.Txn(ctx, &fencerv1.TxnRequest{Token: slashToken})
			return err
		}},
		{"txn: bad key with another principal's token", invalidArg, "success[0].put.key", `invalid key "": empty (field success[0].put.key)`, func(ctx context.Context) error {
			put := &fencerv1.Op{Op: &fencerv1.Op_Put{Put: &fencerv1.PutOp{}}}
			_, err := raw.Txn(ctx, &fencerv1.TxnRequest{Token: bobs, Success: []*fencerv1.Op{put}})
			return err
		}},
		{"release: token of a lease with a slash", invalidArg, "token", `invalid lease "a/b": contains the key separator "/" (field token)`, func(ctx context.Context) error {
			_, err := raw.Release(ctx, &fencerv1.ReleaseRequest{Target: &fencerv1.ReleaseRequest_Token{Token: slashToken}})
			return err
		}},
		{"acquire: name with a slash", invalidArg, "name", `invalid name "a/b": contains the key separator "/"`, func(ctx context.Context) error {
			_, err := raw.Acquire(ctx, &fencerv1.AcquireRequest{Name: "a/b"})
			return err
		}},
		{"list keys: prefix with a control character", invalidArg, "prefix", `invalid key "a\x01": contains a control character (field prefix)`, func(ctx context.Context) error {
			_, err := raw.ListKeys(ctx, &fencerv1.ListKeysRequest{Prefix: "a\x01"})
			return err
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			st := status.Convert(tc.call(ctx))
			require.Equal(t, codes.InvalidArgument, st.Code(), st.Message())
			require.Equal(t, tc.message, st.Message())
			info, field := badRequest(t, st)
			require.Equal(t, tc.reason, info.GetReason())
			require.Equal(t, tc.field, info.GetMetadata()["field"])
			require.Equal(t, tc.field, field)
		})
	}
	after, err := st.Client().Get(ctx, st.Prefix(), clientv3.WithPrefix())
	require.NoError(t, err)
	require.Equal(t, before.Kvs, after.Kvs, "nothing written")
}

// badRequest returns the fencer.dev ErrorInfo of an INVALID_ARGUMENT
// status and the field its BadRequest names ("" without one).
func badRequest(t *testing.T, st *status.Status) (*errdetails.ErrorInfo, string) {
	t.Helper()
	var info *errdetails.ErrorInfo
	var field string
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			require.Equal(t, fencerv1.ErrorDomain, d.GetDomain())
			info = d
		case *errdetails.BadRequest:
			field = d.GetFieldViolations()[0].GetField()
		}
	}
	require.NotNil(t, info, "no ErrorInfo in %v", st)
	return info, field
}
