// Package holderkey is the etcd store's holder key: where a lease's holder
// record lives under a store's prefix, and how the record is encoded. It
// is plumbing shared by package etcdstore, which writes and guards holder
// keys, and package server, which watches them for its remote sessions;
// applications use etcdstore's Session, Lease and Status instead.
//
// holderkey imports token and etcd's API types only: no etcd server code,
// no Kubernetes module and no other fencer package (internal/layout
// enforces it).
package holderkey

import (
	"encoding/json"
	"strings"

	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/fencer-dev/fencer/token"
)

// Key returns the holder key of lease name under prefix. Key(prefix, "")
// is the prefix of every holder key. The key's create revision is the
// lease's current token's revision.
func Key(prefix, name string) string { return prefix + "leases/" + name }

// Record is the value of a holder key.
type Record struct {
	Holder string `json:"holder"`
	Epoch  uint64 `json:"epoch"`
}

// Encode returns r as a holder key's value.
func Encode(r Record) string {
	b, _ := json.Marshal(r)
	return string(b)
}

// Decode reads a holder key's value. A value written by something other
// than fencer yields a record with only its raw text as holder, so that a
// foreign writer's key still blocks acquisition.
func Decode(v []byte) Record {
	var r Record
	if err := json.Unmarshal(v, &r); err != nil {
		return Record{Holder: string(v)}
	}
	return r
}

// Of reads kv, the holder key of lease name: the current token and its
// holder.
func Of(name string, kv *mvccpb.KeyValue) (token.Token, string) {
	r := Decode(kv.Value)
	return token.Token{Lease: name, Epoch: r.Epoch, Revision: kv.CreateRevision}, r.Holder
}

// Parse reads a holder key's key-value pair under prefix, as seen in a Get
// or a watch event, into the lease's Status. ok is false if kv is not a
// holder key under prefix.
func Parse(prefix string, kv *mvccpb.KeyValue) (st token.Status, ok bool) {
	name, ok := strings.CutPrefix(string(kv.Key), Key(prefix, ""))
	if !ok || token.ValidateName("name", name) != nil {
		return token.Status{}, false
	}
	st = token.Status{Name: name}
	st.Token, st.Holder = Of(name, kv)
	st.Epoch = st.Token.Epoch
	return st, true
}
