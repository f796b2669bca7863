package token_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fencer-dev/fencer/token"
)

// TestNameRules pins the two name checks on the same inputs: ValidateName
// (the etcd store's, the server's and the client's) and ValidateLease
// (any token's). They share one implementation and differ only where the
// table says: "/" and the length limit.
func TestNameRules(t *testing.T) {
	for _, tc := range []struct {
		name        string
		in          string
		storeReason string // ValidateName's reason, "" when it accepts
		leaseReason string // ValidateLease's reason, "" when it accepts
	}{
		{"plain", "jobs", "", ""},
		{"utf8", "tâche-1", "", ""},
		{"store limit", strings.Repeat("n", token.MaxNameLen), "", ""},
		{"over store limit", strings.Repeat("n", token.MaxNameLen+1), "longer than 253 bytes", ""},
		{"token limit", strings.Repeat("n", token.MaxLeaseLen), "longer than 253 bytes", ""},
		{"over token limit", strings.Repeat("n", token.MaxLeaseLen+1), "longer than 253 bytes", "longer than 512 bytes"},
		{"kube lease", "ns/name", `contains the key separator "/"`, ""},
		{"empty", "", "empty", "empty"},
		{"space", "a b", "contains a space or control character", "contains a space or control character"},
		{"tab", "a\tb", "contains a space or control character", "contains a space or control character"},
		{"nul", "a\x00", "contains a space or control character", "contains a space or control character"},
		{"no-break space", "a\u00a0b", "contains a space or control character", "contains a space or control character"},
		{"invalid utf8", "\xff", "not valid UTF-8", "not valid UTF-8"},
		{"slash and space", "a/ b", `contains the key separator "/"`, "contains a space or control character"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := token.ValidateName("name", tc.in)
			if tc.storeReason == "" {
				require.NoError(t, err)
			} else {
				var ae *token.ArgumentError
				require.ErrorAs(t, err, &ae)
				require.ErrorIs(t, err, token.ErrInvalidArgument)
				require.Equal(t, "name", ae.Arg)
				require.Equal(t, tc.storeReason, ae.Reason)
			}
			err = token.ValidateLease(tc.in)
			if tc.leaseReason == "" {
				require.NoError(t, err)
			} else {
				var me *token.MalformedError
				require.ErrorAs(t, err, &me)
				require.ErrorIs(t, err, token.ErrMalformed)
				require.Equal(t, tc.leaseReason, me.Reason)
			}
		})
	}
}

// FuzzNameRulesAgree checks that the two name checks agree: a name the
// store accepts is a valid token lease whose token round-trips, and on
// names without "/" within the store's limit both give the same answer
// for the same reason.
func FuzzNameRulesAgree(f *testing.F) {
	for _, s := range []string{"jobs", "ns/name", "", "a b", "\xff", "a\u2028b", strings.Repeat("x", 254)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		storeErr := token.ValidateName("name", s)
		leaseErr := token.ValidateLease(s)
		if storeErr != nil && !errors.Is(storeErr, token.ErrInvalidArgument) {
			t.Fatalf("ValidateName(%q) = %v, not ErrInvalidArgument", s, storeErr)
		}
		if leaseErr != nil && !errors.Is(leaseErr, token.ErrMalformed) {
			t.Fatalf("ValidateLease(%q) = %v, not ErrMalformed", s, leaseErr)
		}
		if storeErr == nil {
			if leaseErr != nil {
				t.Fatalf("store name %q is not a valid token lease: %v", s, leaseErr)
			}
			tok := token.Token{Lease: s, Epoch: 1, Revision: 1}
			if got, err := token.Parse(tok.String()); err != nil || got != tok {
				t.Fatalf("token of store name %q does not round-trip: %v, %v", s, got, err)
			}
		}
		if strings.Contains(s, "/") || len(s) > token.MaxNameLen {
			return
		}
		if (storeErr == nil) != (leaseErr == nil) {
			t.Fatalf("%q: ValidateName = %v, ValidateLease = %v", s, storeErr, leaseErr)
		}
		if storeErr != nil {
			var ae *token.ArgumentError
			var me *token.MalformedError
			if !errors.As(storeErr, &ae) || !errors.As(leaseErr, &me) || ae.Reason != me.Reason {
				t.Fatalf("%q: reasons differ: %v vs %v", s, storeErr, leaseErr)
			}
		}
	})
}
