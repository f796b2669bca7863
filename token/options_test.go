package token_test

import (
	"testing"

	"github.com/fencer-dev/fencer/token"
)

// TestApplyWriteOptions checks that no option is a plain write, that
// TakeOver sets TakeOver, and that a nil option is skipped.
func TestApplyWriteOptions(t *testing.T) {
	if o := token.ApplyWriteOptions(nil); o.TakeOver {
		t.Fatalf("no option: %+v, want a plain write", o)
	}
	if o := token.ApplyWriteOptions([]token.WriteOption{nil, token.TakeOver()}); !o.TakeOver {
		t.Fatalf("TakeOver: %+v, want TakeOver", o)
	}
}
