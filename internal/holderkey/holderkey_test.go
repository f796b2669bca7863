package holderkey_test

import (
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/fencer-dev/fencer/internal/holderkey"
	"github.com/fencer-dev/fencer/token"
)

func TestParse(t *testing.T) {
	const prefix = "/fencer/"
	for _, tc := range []struct {
		name string
		kv   *mvccpb.KeyValue
		want token.Status
		ok   bool
	}{
		{"fencer record", &mvccpb.KeyValue{Key: []byte(holderkey.Key(prefix, "jobs")), Value: []byte(holderkey.Encode(holderkey.Record{Holder: "a_1", Epoch: 3})), CreateRevision: 42},
			token.Status{Name: "jobs", Token: token.Token{Lease: "jobs", Epoch: 3, Revision: 42}, Holder: "a_1", Epoch: 3}, true},
		{"foreign value", &mvccpb.KeyValue{Key: []byte(holderkey.Key(prefix, "jobs")), Value: []byte("not json"), CreateRevision: 7},
			token.Status{Name: "jobs", Token: token.Token{Lease: "jobs", Revision: 7}, Holder: "not json"}, true},
		{"other prefix", &mvccpb.KeyValue{Key: []byte(holderkey.Key("/other/", "jobs")), CreateRevision: 7}, token.Status{}, false},
		{"data key", &mvccpb.KeyValue{Key: []byte(prefix + "data/jobs"), CreateRevision: 7}, token.Status{}, false},
		{"nested name", &mvccpb.KeyValue{Key: []byte(holderkey.Key(prefix, "a/b")), CreateRevision: 7}, token.Status{}, false},
		{"empty name", &mvccpb.KeyValue{Key: []byte(holderkey.Key(prefix, "")), CreateRevision: 7}, token.Status{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := holderkey.Parse(prefix, tc.kv)
			require.Equal(t, tc.ok, ok)
			require.Equal(t, tc.want, got)
		})
	}
}

// FuzzParse checks that Parse accepts exactly the holder keys of valid
// names under the prefix, and that a record round-trips through Encode
// and Decode.
func FuzzParse(f *testing.F) {
	f.Add("/fencer/leases/jobs", []byte(`{"holder":"a","epoch":1}`), "a", uint64(1))
	f.Add("/fencer/leases/", []byte("x"), "", uint64(0))
	f.Add("/fencer/leases/a b", []byte("{"), "h\x00", uint64(1<<63))
	f.Fuzz(func(t *testing.T, key string, value []byte, holder string, epoch uint64) {
		st, ok := holderkey.Parse("/fencer/", &mvccpb.KeyValue{Key: []byte(key), Value: value, CreateRevision: 5})
		if ok {
			if holderkey.Key("/fencer/", st.Name) != key || token.ValidateName("name", st.Name) != nil {
				t.Fatalf("Parse accepted %q as lease %q", key, st.Name)
			}
			if st.Token.Lease != st.Name || st.Token.Revision != 5 || st.Epoch != st.Token.Epoch {
				t.Fatalf("Parse(%q) = %+v", key, st)
			}
		} else if st != (token.Status{}) {
			t.Fatalf("Parse(%q) refused but returned %+v", key, st)
		}
		r := holderkey.Record{Holder: holder, Epoch: epoch}
		if got := holderkey.Decode([]byte(holderkey.Encode(r))); utf8.ValidString(holder) && got != r {
			t.Fatalf("record %+v decodes as %+v", r, got)
		}
	})
}
