package ring

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestMemberValueRoundTrip(t *testing.T) {
	for _, v := range []memberValue{{Holder: "h-1", State: stateActive}, {Holder: `odd "holder"`, State: stateLeaving}} {
		got, err := decodeMember([]byte(v.encode()))
		require.NoError(t, err)
		require.Equal(t, v, got)
	}
	for _, bad := range []string{"", "{}", `{"holder":"h","state":"gone"}`, `{"holder":"","state":"active"}`,
		`{"state":"active","holder":"h"}`, `{"holder":"h","state":"active","x":1}`, `{"holder":"h","state":"active"} `} {
		_, err := decodeMember([]byte(bad))
		require.Error(t, err, bad)
	}
}

// FuzzDecodeMember: the decoder accepts only what encode writes, so the
// acquiring Txn's compare of the member key's value to the active
// encoding means exactly "this holder, active".
func FuzzDecodeMember(f *testing.F) {
	for _, s := range []string{`{"holder":"h","state":"active"}`, `{"holder":"h","state":"leaving"}`, `{"holder":"h"}`, `[]`, `{"holder":"\u0068","state":"active"}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := decodeMember(b)
		if err != nil {
			return
		}
		require.Equal(t, string(b), v.encode())
		require.NotEmpty(t, v.Holder)
		require.Contains(t, []string{stateActive, stateLeaving}, v.State)
	})
}
