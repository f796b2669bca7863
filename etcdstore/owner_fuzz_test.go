package etcdstore

import (
	"errors"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencer-dev/fencer/token"
)

// FuzzDataKeysWritten checks the decision that lets a guarded Txn check
// every data key it writes: a delete of a key range is accepted only if no
// data key lies in the range, and every single key written under the data
// prefix, at any depth of nesting, is reported.
func FuzzDataKeysWritten(f *testing.F) {
	for _, seed := range [][3]string{
		{"/p/data/a", "/p/data/b", "/p/data/a\x00"},
		{"/p/", "/p0", "/p/data/x"},
		{"/p/a", "\x00", "/p/data/"},
		{"/p/elsewhere", "/p/elsewhere0", "/p/data/k"},
		{"/p/datb", "/p/datc", "/p/data"},
		{"/p/data0", "/p/data1", "/p/data/"},
		{"", "\x00", "/p/data/k"},
	} {
		f.Add(seed[0], seed[1], seed[2])
	}
	s := &Store{prefix: "/p/"}
	data := s.prefix + "data/"
	f.Fuzz(func(t *testing.T, key, end, probe string) {
		del := clientv3.OpDelete(key, clientv3.WithRange(end))
		put := clientv3.OpPut(probe, "v")
		keys, err := s.dataKeysWritten([]clientv3.Op{clientv3.OpTxn(nil, []clientv3.Op{del}, []clientv3.Op{put})})
		inRange := probe >= key && (end == "\x00" || probe < end)
		if end == "" {
			inRange = probe == key
		}
		if err == nil && end != "" && inRange && strings.HasPrefix(probe, data) {
			t.Fatalf("range [%q, %q) accepted, but it holds the data key %q", key, end, probe)
		}
		if err != nil {
			return
		}
		want := map[string]bool{}
		written := []string{probe}
		if end == "" {
			written = append(written, key)
		}
		for _, k := range written {
			if rest, ok := strings.CutPrefix(k, data); ok {
				want[rest] = true
			}
		}
		if len(keys) != len(want) {
			t.Fatalf("dataKeysWritten = %q, want the keys of %v", keys, want)
		}
		for _, k := range keys {
			if !want[k] {
				t.Fatalf("dataKeysWritten reported %q, want %v", k, want)
			}
		}
	})
}

// FuzzParseOwnerRecord checks that owner records round-trip and that the
// parser accepts nothing else: what it accepts is exactly the record of the
// token it returns, and that token could have been issued by a store. It
// also checks the compares of "owned by a lease": a record lies in its own
// lease's range and in no other lease's.
func FuzzParseOwnerRecord(f *testing.F) {
	for _, seed := range [][2]string{
		{"orders v1:1:2:orders", "orders2"}, {"orders v1:1:2:billing", "billing"}, {"orders", "order"},
		{"orders  v1:1:2:orders", "orders!"}, {"a:b v1:3:9:a:b", "a"}, {" v1:1:2:", "x"},
		{"orders v1:01:2:orders", "o"}, {"x v2:1:2:x", "x"}, {"a/b v1:1:2:a/b", "a"},
		{"ab v1:1:2:ab", "a"}, {"a v1:1:2:a", "ab"}, {"a\u00e9 v1:1:2:a\u00e9", "a"},
	} {
		f.Add(seed[0], seed[1])
	}
	f.Fuzz(func(t *testing.T, rec, other string) {
		tok, err := ParseOwnerRecord(rec)
		if err != nil {
			if !errors.Is(err, token.ErrMalformed) {
				t.Fatalf("ParseOwnerRecord(%q) = %v, not a malformed-token error", rec, err)
			}
			return
		}
		if got := ownerRecord(tok); got != rec {
			t.Fatalf("ParseOwnerRecord(%q) = %v, whose record is %q", rec, tok, got)
		}
		if err := validToken(tok); err != nil {
			t.Fatalf("ParseOwnerRecord(%q) accepted %v: %v", rec, tok, err)
		}
		if ownerLease(rec) != tok.Lease {
			t.Fatalf("ownerLease(%q) = %q, want %q", rec, ownerLease(rec), tok.Lease)
		}
		inRange := func(lease string) bool { return rec > lease+" " && rec < lease+"!" }
		if !inRange(tok.Lease) {
			t.Fatalf("record %q outside its lease's range", rec)
		}
		if other != tok.Lease && ValidateName("lease", other) == nil && inRange(other) {
			t.Fatalf("record %q of lease %q lies in lease %q's range", rec, tok.Lease, other)
		}
	})
}
