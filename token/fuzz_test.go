package token_test

import (
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
