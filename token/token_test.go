package token_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fencer-dev/fencer/token"
)

func TestParseRoundTrip(t *testing.T) {
	for _, tok := range []token.Token{
		{Lease: "a", Epoch: 0, Revision: 1},
		{Lease: "ns/name", Epoch: 7, Revision: 42},
		{Lease: "with:colons:inside", Epoch: 18446744073709551615, Revision: 9223372036854775807},
		{Lease: "ünïcode", Epoch: 1, Revision: 2},
	} {
		t.Run(tok.String(), func(t *testing.T) {
			got, err := token.Parse(tok.String())
			require.NoError(t, err)
			require.Equal(t, tok, got)
			b, err := tok.MarshalText()
			require.NoError(t, err)
			var u token.Token
			require.NoError(t, u.UnmarshalText(b))
			require.Equal(t, tok, u)
		})
	}
}

func TestParseRejects(t *testing.T) {
	for _, tc := range []struct{ in, field string }{
		{"", "version"},
		{"v2:1:2:a", "version"},
		{"V1:1:2:a", "version"},
		{"v1:1:2", "token"},
		{"v1::2:a", "epoch"},
		{"v1:01:2:a", "epoch"},
		{"v1:+1:2:a", "epoch"},
		{"v1:-1:2:a", "epoch"},
		{"v1:18446744073709551616:2:a", "epoch"},
		{"v1:1:0:a", "revision"},
		{"v1:1:-3:a", "revision"},
		{"v1:1:007:a", "revision"},
		{"v1:1:9223372036854775808:a", "revision"},
		{"v1:1:2:", "lease"},
		{"v1:1:2:a b", "lease"},
		{"v1:1:2:a\nb", "lease"},
		{"v1:1:2:\xff", "lease"},
		{"v1:1:2:" + strings.Repeat("x", token.MaxLeaseLen+1), "lease"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			var u token.Token
			err := u.UnmarshalText([]byte(tc.in))
			require.ErrorIs(t, err, token.ErrMalformed)
			var m *token.MalformedError
			require.ErrorAs(t, err, &m)
			require.Equal(t, tc.field, m.Field)
			require.True(t, u.IsZero(), "UnmarshalText changed its receiver on error")
		})
	}
}

func TestCompare(t *testing.T) {
	a := token.Token{Lease: "l", Epoch: 1, Revision: 10}
	for _, tc := range []struct {
		name string
		b    token.Token
		want int
	}{
		{"equal", a, 0},
		{"greater revision", token.Token{Lease: "l", Epoch: 1, Revision: 11}, -1},
		{"lower revision, higher epoch", token.Token{Lease: "l", Epoch: 9, Revision: 9}, 1},
		{"same revision, higher epoch", token.Token{Lease: "l", Epoch: 2, Revision: 10}, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := a.Compare(tc.b)
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
	_, err := a.Compare(token.Token{Lease: "other", Revision: 10})
	var f *token.ForeignLeaseError
	require.ErrorAs(t, err, &f)
	require.ErrorIs(t, err, token.ErrForeignLease)
	require.Equal(t, "other", f.Got)
}

func TestMarshalTextRefusesInvalid(t *testing.T) {
	_, err := token.Token{}.MarshalText()
	require.ErrorIs(t, err, token.ErrMalformed)
	_, err = token.Token{Lease: "l"}.MarshalText()
	require.ErrorIs(t, err, token.ErrMalformed)
}

func TestAnnotations(t *testing.T) {
	tok := token.Token{Lease: "ns/fence", Epoch: 3, Revision: 1234}
	ann := tok.Stamp(map[string]string{"keep": "me"})
	require.Equal(t, map[string]string{
		"keep":                "me",
		token.AnnotationLease: "ns/fence",
		token.AnnotationToken: "1234",
		token.AnnotationEpoch: "3",
	}, ann)
	got, ok, err := token.FromAnnotations(ann)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, tok, got)

	_, ok, err = token.FromAnnotations(map[string]string{"other": "x"})
	require.NoError(t, err)
	require.False(t, ok)

	for _, tc := range []struct {
		name  string
		ann   map[string]string
		field string
	}{
		{"missing lease", map[string]string{token.AnnotationToken: "1"}, token.AnnotationLease},
		{"missing token", map[string]string{token.AnnotationLease: "a/b"}, token.AnnotationToken},
		{"empty lease", map[string]string{token.AnnotationLease: "", token.AnnotationToken: "1"}, token.AnnotationLease},
		{"non-numeric token", map[string]string{token.AnnotationLease: "a/b", token.AnnotationToken: "x"}, token.AnnotationToken},
		{"zero token", map[string]string{token.AnnotationLease: "a/b", token.AnnotationToken: "0"}, token.AnnotationToken},
		{"bad epoch", map[string]string{token.AnnotationLease: "a/b", token.AnnotationToken: "5", token.AnnotationEpoch: "-1"}, token.AnnotationEpoch},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := token.FromAnnotations(tc.ann)
			var m *token.MalformedError
			require.ErrorAs(t, err, &m)
			require.Equal(t, tc.field, m.Field)
		})
	}
}

func TestCheckStamp(t *testing.T) {
	held := token.Token{Lease: "ns/fence", Epoch: 2, Revision: 100}
	stamp := func(tk token.Token) map[string]string { return tk.Stamp(nil) }
	for _, tc := range []struct {
		name     string
		existing map[string]string
		takeover bool
		want     error
	}{
		{"unstamped", map[string]string{"a": "b"}, false, nil},
		{"nil annotations", nil, false, nil},
		{"own token", stamp(held), false, nil},
		{"older token", stamp(token.Token{Lease: "ns/fence", Epoch: 1, Revision: 50}), false, nil},
		{"newer token", stamp(token.Token{Lease: "ns/fence", Epoch: 3, Revision: 101}), false, token.ErrStale},
		{"newer token with takeover", stamp(token.Token{Lease: "ns/fence", Epoch: 3, Revision: 101}), true, token.ErrStale},
		{"foreign lease", stamp(token.Token{Lease: "ns/other", Revision: 1}), false, token.ErrForeignLease},
		{"foreign lease with takeover", stamp(token.Token{Lease: "ns/other", Revision: 1 << 40}), true, nil},
		{"malformed", map[string]string{token.AnnotationLease: "ns/fence", token.AnnotationToken: "1e9"}, true, token.ErrMalformed},
		{"leading zero", map[string]string{token.AnnotationLease: "ns/fence", token.AnnotationToken: "099"}, true, token.ErrMalformed},
		{"lease hop back to an old token", hop(token.Token{Lease: "ns/fence", Revision: 101}, token.Token{Lease: "ns/other", Revision: 1}), true, token.ErrStale},
		{"lease hop back to the newest token", hop(token.Token{Lease: "ns/fence", Revision: 100}, token.Token{Lease: "ns/other", Revision: 1}), true, nil},
		{"lease hop back without takeover", hop(token.Token{Lease: "ns/fence", Revision: 99}, token.Token{Lease: "ns/other", Revision: 1}), false, token.ErrForeignLease},
		{"own mark above the stamp", map[string]string{token.AnnotationLease: "ns/fence", token.AnnotationToken: "5", token.MarkKey("ns/fence"): "101"}, false, token.ErrStale},
		{"malformed mark", map[string]string{token.MarkKey("ns/x"): "01"}, true, token.ErrMalformed},
		{"mark naming no lease", map[string]string{"nodot" + token.MarkSuffix: "1"}, true, token.ErrMalformed},
		{"uppercase lease", map[string]string{token.AnnotationLease: "NS/fence", token.AnnotationToken: "1"}, true, token.ErrMalformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := token.CheckStamp(held, tc.existing, tc.takeover)
			if tc.want == nil {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, tc.want)
		})
	}
	require.ErrorIs(t, token.CheckStamp(token.Token{}, nil, false), token.ErrMalformed)
}

// hop returns the annotations of an object stamped with first and then,
// as a takeover, with second.
func hop(first, second token.Token) map[string]string {
	return second.Stamp(first.Stamp(nil))
}

func TestStampKeepsMarks(t *testing.T) {
	l100 := token.Token{Lease: "ns/l", Epoch: 4, Revision: 100}
	m1 := token.Token{Lease: "ns/m", Epoch: 1, Revision: 1}
	ann := m1.Stamp(l100.Stamp(map[string]string{"keep": "me"}))
	require.Equal(t, map[string]string{
		"keep":                    "me",
		token.AnnotationLease:     "ns/m",
		token.AnnotationToken:     "1",
		token.AnnotationEpoch:     "1",
		"ns.l" + token.MarkSuffix: "100",
	}, ann)
	// Back to l with a greater token: l's mark follows it; m's is kept.
	l200 := token.Token{Lease: "ns/l", Epoch: 5, Revision: 200}
	require.NoError(t, token.CheckStamp(l200, ann, true))
	ann = l200.Stamp(ann)
	require.Equal(t, "200", ann["ns.l"+token.MarkSuffix])
	require.Equal(t, "1", ann["ns.m"+token.MarkSuffix])
	require.NoError(t, token.CheckStamp(m1, ann, true), "m's mark is 1, not above m1")
	require.ErrorIs(t, token.CheckStamp(l100, ann, true), token.ErrStale)
}

func TestRestampIgnoresCallerProtocolKeys(t *testing.T) {
	stored := token.Token{Lease: "ns/l", Revision: 100}.Stamp(map[string]string{"old": "x"})
	stored[token.MarkKey("ns/m")] = "7"
	caller := map[string]string{
		"new":                  "y",
		token.AnnotationLease:  "ns/l",
		token.AnnotationToken:  "1",
		token.MarkKey("ns/m"):  "1",
		token.MarkKey("ns/zz"): "3",
	}
	held := token.Token{Lease: "ns/l", Epoch: 2, Revision: 150}
	got := held.Restamp(caller, stored)
	require.Equal(t, map[string]string{
		"new":                 "y",
		token.AnnotationLease: "ns/l",
		token.AnnotationToken: "150",
		token.AnnotationEpoch: "2",
		token.MarkKey("ns/m"): "7",
	}, got)
	require.Equal(t, "1", caller[token.AnnotationToken], "caller's map is not modified")
}

func TestValidateKubeLease(t *testing.T) {
	long := strings.Repeat("a", token.MaxKubeLeaseLen-2)
	for lease, ok := range map[string]bool{
		"ns/name":                      true,
		"ns/a.b-c":                     true,
		"a/" + long:                    true,
		"ab/" + long:                   false,
		strings.Repeat("n", 63) + "/x": true,
		strings.Repeat("n", 64) + "/x": false,
		"ns/a..b":                      false,
		"ns/-a":                        false,
		"ns/A":                         false,
		"ns":                           false,
		"ns/a/b":                       false,
		"n.s/a":                        false,
		"":                             false,
		"/a":                           false,
		"ns/":                          false,
		"ns/a b":                       false,
	} {
		err := token.ValidateKubeLease(lease)
		require.Equal(t, ok, err == nil, "%q: %v", lease, err)
		if ok {
			require.LessOrEqual(t, len(token.MarkKey(lease))-len("/token"), 253)
		}
	}
}

func TestErrorsAreDistinct(t *testing.T) {
	all := []error{token.ErrStale, token.ErrNotHeld, token.ErrHeldByAnother, token.ErrForeignLease, token.ErrMalformed}
	for i, a := range all {
		for j, b := range all {
			require.Equal(t, i == j, errors.Is(a, b), "%v vs %v", a, b)
		}
	}
	var h *token.HeldError
	require.ErrorAs(t, error(&token.HeldError{Lease: "l", Holder: "h"}), &h)
	require.ErrorIs(t, h, token.ErrHeldByAnother)
	s := &token.StaleError{Token: token.Token{Lease: "l", Revision: 1}}
	require.ErrorIs(t, s, token.ErrStale)
	require.Contains(t, s.Error(), "no longer current")
}
