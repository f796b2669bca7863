package etcdstore

import (
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
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
