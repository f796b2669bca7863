package etcdstore

import (
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
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
