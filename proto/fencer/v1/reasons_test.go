package fencerv1_test

import (
	"strings"
	"testing"

	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
)

// wire is every reason string the service sent before the ErrorReason
// enum existed, as clients already in use compare it. The enum must
// produce exactly these strings: a changed one breaks those clients.
var wire = map[fencerv1.ErrorReason]string{
	fencerv1.ErrorReason_ERROR_REASON_STALE_TOKEN:       "STALE_TOKEN",
	fencerv1.ErrorReason_ERROR_REASON_LEASE_NOT_HELD:    "LEASE_NOT_HELD",
	fencerv1.ErrorReason_ERROR_REASON_HELD_BY_ANOTHER:   "HELD_BY_ANOTHER",
	fencerv1.ErrorReason_ERROR_REASON_LOCK_DELAY:        "LOCK_DELAY",
	fencerv1.ErrorReason_ERROR_REASON_FOREIGN_LEASE:     "FOREIGN_LEASE",
	fencerv1.ErrorReason_ERROR_REASON_INVALID_TOKEN:     "INVALID_TOKEN",
	fencerv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT:  "INVALID_ARGUMENT",
	fencerv1.ErrorReason_ERROR_REASON_SESSION_NOT_FOUND: "SESSION_NOT_FOUND",
	fencerv1.ErrorReason_ERROR_REASON_PERMISSION_DENIED: "PERMISSION_DENIED",
	fencerv1.ErrorReason_ERROR_REASON_UNAUTHENTICATED:   "UNAUTHENTICATED",
	fencerv1.ErrorReason_ERROR_REASON_WATCH_COMPACTED:   "WATCH_COMPACTED",
	fencerv1.ErrorReason_ERROR_REASON_STORE_UNAVAILABLE: "STORE_UNAVAILABLE",
	fencerv1.ErrorReason_ERROR_REASON_SHUTTING_DOWN:     "SHUTTING_DOWN",
	fencerv1.ErrorReason_ERROR_REASON_INTERNAL:          "INTERNAL",
}

// TestReasonsRoundTrip checks the rule the proto states: a value's reason
// string is its name minus "ERROR_REASON_", it parses back to the value,
// and the strings sent before the enum are unchanged.
func TestReasonsRoundTrip(t *testing.T) {
	values := fencerv1.ErrorReason(0).Descriptor().Values()
	for i := range values.Len() {
		r := fencerv1.ErrorReason(values.Get(i).Number())
		t.Run(r.String(), func(t *testing.T) {
			if r == fencerv1.ErrorReason_ERROR_REASON_UNSPECIFIED {
				if got := r.Reason(); got != "" {
					t.Fatalf("UNSPECIFIED.Reason() = %q, want \"\": it is never sent", got)
				}
				return
			}
			want, ok := strings.CutPrefix(r.String(), "ERROR_REASON_")
			if !ok {
				t.Fatalf("%s lacks the ERROR_REASON_ prefix", r)
			}
			if got := r.Reason(); got != want {
				t.Fatalf("%s.Reason() = %q, want %q", r, got, want)
			}
			if got := fencerv1.ParseReason(want); got != r {
				t.Fatalf("ParseReason(%q) = %s, want %s", want, got, r)
			}
			old, ok := wire[r]
			if !ok {
				return // new since the enum: no client depends on it yet
			}
			if r.Reason() != old {
				t.Fatalf("%s is sent as %q, but clients in use expect %q", r, r.Reason(), old)
			}
		})
	}
	for r := range wire {
		if _, ok := fencerv1.ErrorReason_name[int32(r)]; !ok {
			t.Errorf("reason %q sent before the enum has no value", wire[r])
		}
	}
}

// TestParseReasonUnknown checks that what names no value parses to
// UNSPECIFIED and that out-of-range values have no reason string.
func TestParseReasonUnknown(t *testing.T) {
	for _, s := range []string{"", "UNSPECIFIED", "ERROR_REASON_STALE_TOKEN", "stale_token", "SOMETHING_NEWER"} {
		if got := fencerv1.ParseReason(s); got != fencerv1.ErrorReason_ERROR_REASON_UNSPECIFIED {
			t.Errorf("ParseReason(%q) = %s, want UNSPECIFIED", s, got)
		}
	}
	if got := fencerv1.ErrorReason(1 << 20).Reason(); got != "" {
		t.Errorf("an unknown value's Reason() = %q, want \"\"", got)
	}
}
