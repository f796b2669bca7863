package server

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
)

// A snapshot of 50,000 shards with long names (about 5 MB) goes as
// messages under gRPC's 4 MiB limit that join back into it; a small one
// goes as it is.
func TestSplitRingMessage(t *testing.T) {
	msg := &fencerv1.JoinRingResponse{Snapshot: true, Revision: 42, Member: "w1", SessionId: 7}
	for i := range 50000 {
		shard := fmt.Sprintf("%s%05d", strings.Repeat("s", 50), i)
		msg.Changes = append(msg.Changes, &fencerv1.ShardChange{Kind: fencerv1.ShardChange_KIND_GAINED, Shard: shard,
			Token: "v1:1:123456:ring:" + strings.Repeat("r", 63) + ":" + shard})
	}
	want := proto.Clone(msg).(*fencerv1.JoinRingResponse)
	require.Greater(t, proto.Size(msg), 4<<20, "the test's snapshot must be over gRPC's default limit")

	parts := splitRingMessage(msg)
	require.Greater(t, len(parts), 4)
	var joined []*fencerv1.ShardChange
	for i, p := range parts {
		require.LessOrEqual(t, proto.Size(p), maxRingMessage+64, "part %d", i)
		require.Equal(t, i < len(parts)-1, p.GetMore(), "part %d: more", i)
		require.True(t, p.GetSnapshot(), "part %d: snapshot", i)
		require.Equal(t, int64(42), p.GetRevision(), "part %d: revision", i)
		joined = append(joined, p.GetChanges()...)
	}
	require.Equal(t, "w1", parts[0].GetMember())
	require.Equal(t, int64(7), parts[0].GetSessionId())
	require.Empty(t, parts[1].GetMember())
	require.Len(t, joined, len(want.Changes))
	for i := range joined {
		require.True(t, proto.Equal(want.Changes[i], joined[i]), "change %d", i)
	}

	small := &fencerv1.JoinRingResponse{Changes: want.Changes[:3], Revision: 9}
	require.Equal(t, []*fencerv1.JoinRingResponse{small}, splitRingMessage(small))
	require.False(t, small.GetMore())
}
