package token_test

import (
	"errors"
	"testing"

	"github.com/fencer-dev/fencer/token"
)

func FuzzParse(f *testing.F) {
	for _, s := range []string{"v1:0:1:a", "v1:7:42:ns/name", "v1:1:2:a:b", "v2:1:2:a", "v1:01:2:a", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tok, err := token.Parse(s)
		if err != nil {
			if !tok.IsZero() {
				t.Fatalf("Parse(%q) returned %v with error %v", s, tok, err)
			}
			return
		}
		if got := tok.String(); got != s {
			t.Fatalf("Parse(%q).String() = %q", s, got)
		}
		if err := tok.Validate(); err != nil {
			t.Fatalf("Parse(%q) accepted an invalid token: %v", s, err)
		}
	})
}

func FuzzFromAnnotations(f *testing.F) {
	f.Add("ns/a", "12", "3", true)
	f.Add("", "0", "", false)
	f.Add("ns/a", "012", "x", true)
	f.Fuzz(func(t *testing.T, lease, rev, epoch string, withEpoch bool) {
		ann := map[string]string{token.AnnotationLease: lease, token.AnnotationToken: rev}
		if withEpoch {
			ann[token.AnnotationEpoch] = epoch
		}
		tok, ok, err := token.FromAnnotations(ann)
		if err != nil || !ok {
			return
		}
		again := tok.Stamp(nil)
		if again[token.AnnotationLease] != lease || again[token.AnnotationToken] != rev {
			t.Fatalf("annotations %v do not round-trip: %v", ann, again)
		}
		if withEpoch && again[token.AnnotationEpoch] != epoch {
			t.Fatalf("epoch %q does not round-trip: %q", epoch, again[token.AnnotationEpoch])
		}
		if back, _, err := token.FromAnnotations(again); err != nil || back != tok {
			t.Fatalf("re-read %v, %v; want %v", back, err, tok)
		}
	})
}

// FuzzRestamp checks the order the object protocol promises, whatever the
// stored annotations and the caller's object: when CheckStamp lets held
// write over stored, the annotations Restamp sends are well formed
// (CheckStored), carry held's stamp, and keep every lease's effective
// token at least as great as it was; and a holder of a lower token of any
// lease the result carries is refused.
func FuzzRestamp(f *testing.F) {
	f.Add("ns/l", "100", "ns/m", "7", "ns/l", int64(150), "ns/m", "1", true)
	f.Add("ns/l", "100", "", "", "ns/m", int64(1), "ns/l", "1", true)
	f.Add("ns/l", "01", "ns/l", "x", "ns/l", int64(5), "ns/l", "9", false)
	f.Fuzz(func(t *testing.T, lease, rev, markLease, mark, heldLease string, heldRev int64, callerLease, callerRev string, takeover bool) {
		stored := map[string]string{token.AnnotationLease: lease, token.AnnotationToken: rev}
		if markLease != "" {
			stored[token.MarkKey(markLease)] = mark
		}
		caller := map[string]string{token.AnnotationLease: callerLease, token.AnnotationToken: callerRev, "other": "kept"}
		held := token.Token{Lease: heldLease, Epoch: 1, Revision: heldRev}
		if token.CheckStamp(held, stored, takeover) != nil {
			return
		}
		out := held.Restamp(caller, stored)
		if err := token.CheckStored(out); err != nil {
			t.Fatalf("Restamp(%v over %v) = %v, not storable: %v", held, stored, out, err)
		}
		if got, ok, err := token.FromAnnotations(out); err != nil || !ok || got != held {
			t.Fatalf("Restamp wrote stamp %v, %v, %v; want %v", got, ok, err, held)
		}
		if out["other"] != "kept" {
			t.Fatalf("Restamp dropped the caller's annotation: %v", out)
		}
		for _, l := range []string{lease, markLease} {
			before := effective(stored, l)
			if after := effective(out, l); after < before {
				t.Fatalf("lease %q went from %d to %d: stored %v, out %v", l, before, after, stored, out)
			}
			if before > 1 && token.ValidateKubeLease(l) == nil {
				lower := token.Token{Lease: l, Revision: before - 1}
				if err := token.CheckStamp(lower, out, true); !errors.Is(err, token.ErrStale) {
					t.Fatalf("token %d of %q below its effective %d was let through: %v", before-1, l, before, err)
				}
			}
		}
	})
}

// effective returns lease's effective token in annotations: the greater
// of its mark and, when it is the current lease, its token; 0 when none.
func effective(annotations map[string]string, lease string) int64 {
	if token.ValidateKubeLease(lease) != nil {
		return 0
	}
	var eff int64
	if v, err := token.ParseRevision(annotations[token.MarkKey(lease)]); err == nil {
		eff = v
	}
	if cur, ok, err := token.FromAnnotations(annotations); err == nil && ok && cur.Lease == lease && cur.Revision > eff {
		eff = cur.Revision
	}
	return eff
}
