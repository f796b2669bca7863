package server_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/fencer-dev/fencer/fencertest"
	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
)

// rawCodec sends a request's bytes as they are, so that a test can send
// what a protobuf library would refuse to encode.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return v.([]byte), nil }
func (rawCodec) Unmarshal(data []byte, v any) error {
	return proto.Unmarshal(data, v.(proto.Message))
}
func (rawCodec) Name() string { return "proto" }

// TestInvalidUTF8IsRefusedBeforeTheServer pins the limit docs/service.md
// states: a request whose string field is not valid UTF-8 fails with
// INTERNAL and no ErrorInfo, since gRPC cannot decode it, and writes
// nothing.
func TestInvalidUTF8IsRefusedBeforeTheServer(t *testing.T) {
	ctx := fencertest.Context(t)
	st := fencertest.SharedStore(t)
	addr, _ := startServer(t, st)
	cc := dial(t, alice, addr)
	req, err := proto.Marshal(&fencerv1.PutRequest{Token: "v1:1:1:x", Key: "aXb", Value: []byte("v")})
	require.NoError(t, err)
	i := len(req) - 1
	for req[i] != 'X' {
		i--
	}
	req[i] = 0xff
	err = cc.Invoke(ctx, "/"+fencerv1.FencerService_ServiceDesc.ServiceName+"/Put", req, new(fencerv1.PutResponse), grpc.ForceCodec(rawCodec{}))
	require.Equal(t, codes.Internal, status.Code(err), "%v", err)
	require.Contains(t, status.Convert(err).Message(), "unmarshal", "refused by the server's decoding, not the client's encoding")
	require.Empty(t, status.Convert(err).Details())
	resp, err := st.Client().Get(ctx, st.DataKey("a\xffb"))
	require.NoError(t, err)
	require.Empty(t, resp.Kvs)
}
