package etcdstore

import (
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fencer-dev/fencer/token"
)

func TestEpochGuessesStayBounded(t *testing.T) {
	var g epochGuesses
	require.Equal(t, epochSeen{}, g.get("unknown"))
	for i := range maxEpochGuesses {
		g.put(strconv.Itoa(i), epochSeen{value: uint64(i), modRev: int64(i)})
	}
	require.Equal(t, epochSeen{value: 7, modRev: 7}, g.get("7"))
	g.put("7", epochSeen{value: 8, modRev: 9})
	require.Len(t, g.seen, maxEpochGuesses, "updating a known name keeps the others")
	g.put("new", epochSeen{value: 1, modRev: 2})
	require.Len(t, g.seen, 1, "a new name past the bound starts over")
	require.Equal(t, epochSeen{value: 1, modRev: 2}, g.get("new"))
	require.Equal(t, epochSeen{}, g.get("7"))
}

// TestOwnerGuessKnowsItsOwnRecord checks that a record the store wrote
// for a token is known as that token's, without formatting it again,
// and stays so when the same record is read back; a record only read is
// no token's until a write records it.
func TestOwnerGuessKnowsItsOwnRecord(t *testing.T) {
	var g ownerGuesses
	tok := token.Token{Lease: "a", Epoch: 2, Revision: 9}
	other := token.Token{Lease: "a", Epoch: 3, Revision: 12}
	rec := ownerRecord(tok)

	g.put("k", rec)
	got, mine := g.getFor("k", tok)
	require.Equal(t, rec, got)
	require.False(t, mine, "a record read from etcd is no token's")

	g.putMine("k", tok, rec)
	_, mine = g.getFor("k", tok)
	require.True(t, mine)
	_, mine = g.getFor("k", other)
	require.False(t, mine, "another token of the same lease")

	g.put("k", rec)
	_, mine = g.getFor("k", tok)
	require.True(t, mine, "the same record read back keeps its token")

	g.put("k", ownerRecord(other))
	got, mine = g.getFor("k", tok)
	require.Equal(t, ownerRecord(other), got)
	require.False(t, mine, "a different record read back")

	g.put("k", "")
	got, mine = g.getFor("k", tok)
	require.Empty(t, got)
	require.False(t, mine)
}
