package ring

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/fencer-dev/fencer/etcdstore"
)

// recordKey is the key of ring's record.
func recordKey(st *etcdstore.Store, ring string) string { return st.Prefix() + "rings/" + ring }

// memberPrefix is the prefix of ring's member keys.
func memberPrefix(st *etcdstore.Store, ring string) string {
	return st.Prefix() + "ringmembers/" + ring + "/"
}

// holderPrefix is the prefix of the holder keys of ring's shards, and of
// no other ring's: ring names contain no ":".
func holderPrefix(st *etcdstore.Store, ring string) string { return st.HolderKey(ShardLease(ring, "")) }

// Member states, as stored in a member key.
const (
	stateActive  = "active"
	stateLeaving = "leaving"
)

// memberValue is the value of a member key: the holder identity of the
// member's session and its state. Its encoding is canonical (encode of a
// decoded value gives the same bytes), so that an acquiring Txn can
// compare the member key's value to encode(holder, active).
type memberValue struct {
	Holder string `json:"holder"`
	State  string `json:"state"`
}

func (v memberValue) encode() string {
	b, _ := json.Marshal(v)
	return string(b)
}

// decodeMember reads a member key's value; it refuses anything encode
// would not have written.
func decodeMember(b []byte) (memberValue, error) {
	var v memberValue
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		return memberValue{}, fmt.Errorf("ring: member value %q: %w", b, err)
	}
	if v.Holder == "" || (v.State != stateActive && v.State != stateLeaving) {
		return memberValue{}, fmt.Errorf("ring: member value %q: want a holder and state active or leaving", b)
	}
	if v.encode() != string(b) {
		return memberValue{}, fmt.Errorf("ring: member value %q: not canonical", b)
	}
	return v, nil
}

// record is the value of a ring record.
type record struct {
	Shards []string `json:"shards"`
}
