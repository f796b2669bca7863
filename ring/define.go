package ring

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencer-dev/fencer/etcdstore"
	"github.com/fencer-dev/fencer/token"
)

// Define creates ring with shards, in any order, and reports created. A
// ring is immutable: if it exists with the same set of shards, Define
// changes nothing and reports false; with other shards it returns
// ErrRingConflict. Shards must be 1 to MaxShards distinct valid names
// whose record fits MaxRecordLen; a *token.ArgumentError is returned
// otherwise, before anything is sent to etcd.
func Define(ctx context.Context, st *etcdstore.Store, ring string, shards []string) (created bool, err error) {
	if err := ValidateRing(ring); err != nil {
		return false, err
	}
	sorted, err := checkShards(shards)
	if err != nil {
		return false, err
	}
	b, _ := json.Marshal(record{Shards: sorted})
	if len(b) > MaxRecordLen {
		return false, token.InvalidArgument("shards", fmt.Sprintf("%d shards", len(shards)), fmt.Sprintf("the record is %d bytes, over %d", len(b), MaxRecordLen))
	}
	k := recordKey(st, ring)
	resp, err := st.Client().Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
		Then(clientv3.OpPut(k, string(b))).
		Else(clientv3.OpGet(k)).Commit()
	if err != nil {
		return false, fmt.Errorf("ring: define %q: %w", ring, err)
	}
	if resp.Succeeded {
		return true, nil
	}
	have, err := decodeRecord(ring, resp.Responses[0].GetResponseRange().Kvs[0])
	if err != nil {
		return false, err
	}
	if !slices.Equal(have, sorted) {
		return false, fmt.Errorf("%w: ring %q exists with %d other shards", ErrRingConflict, ring, len(have))
	}
	return false, nil
}

// checkShards validates a shard list and returns it sorted.
func checkShards(shards []string) ([]string, error) {
	switch {
	case len(shards) == 0:
		return nil, token.InvalidArgument("shards", "", "empty")
	case len(shards) > MaxShards:
		return nil, token.InvalidArgument("shards", fmt.Sprintf("%d shards", len(shards)), fmt.Sprintf("more than %d", MaxShards))
	}
	for _, s := range shards {
		if err := ValidateShard(s); err != nil {
			return nil, err
		}
	}
	sorted := slices.Clone(shards)
	slices.Sort(sorted)
	for i := 1; i < len(sorted); i++ {
		if sorted[i] == sorted[i-1] {
			return nil, token.InvalidArgument("shards", sorted[i], "listed twice")
		}
	}
	return sorted, nil
}

func decodeRecord(ring string, kv *mvccpb.KeyValue) ([]string, error) {
	var r record
	if err := json.Unmarshal(kv.Value, &r); err != nil {
		return nil, fmt.Errorf("ring: record of %q: %w", ring, err)
	}
	return r.Shards, nil
}

// Shards returns ring's shards, sorted, or ErrRingNotFound.
func Shards(ctx context.Context, st *etcdstore.Store, ring string) ([]string, error) {
	if err := ValidateRing(ring); err != nil {
		return nil, err
	}
	resp, err := st.Client().Get(ctx, recordKey(st, ring))
	if err != nil {
		return nil, fmt.Errorf("ring: read %q: %w", ring, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, fmt.Errorf("%w: %q", ErrRingNotFound, ring)
	}
	return decodeRecord(ring, resp.Kvs[0])
}

// MemberStatus is one member of a ring as ReadStatus saw it.
type MemberStatus struct {
	// Member is the member's name.
	Member string
	// Holder is the holder identity of the member's session.
	Holder string
	// Leaving is true once the member has started to leave.
	Leaving bool
	// Owned is how many shards the member's session holds.
	Owned int
}

// Status is a ring as ReadStatus saw it, at one revision.
type Status struct {
	// Shards is the number of shards of the ring.
	Shards int
	// Members are the ring's members, by name.
	Members []MemberStatus
	// Unowned is the number of shards nobody holds.
	Unowned int
	// Revision is the etcd revision of the read.
	Revision int64
}

// ReadStatus reads ring's record, members and shard holders at one
// revision, or returns ErrRingNotFound.
func ReadStatus(ctx context.Context, st *etcdstore.Store, ring string) (Status, error) {
	if err := ValidateRing(ring); err != nil {
		return Status{}, err
	}
	resp, err := st.Client().Txn(ctx).Then(
		clientv3.OpGet(recordKey(st, ring)),
		clientv3.OpGet(memberPrefix(st, ring), clientv3.WithPrefix()),
		clientv3.OpGet(holderPrefix(st, ring), clientv3.WithPrefix()),
	).Commit()
	if err != nil {
		return Status{}, fmt.Errorf("ring: read the status of %q: %w", ring, err)
	}
	rec := resp.Responses[0].GetResponseRange().Kvs
	if len(rec) == 0 {
		return Status{}, fmt.Errorf("%w: %q", ErrRingNotFound, ring)
	}
	shards, err := decodeRecord(ring, rec[0])
	if err != nil {
		return Status{}, err
	}
	s := Status{Shards: len(shards), Revision: resp.Header.Revision}
	byLease := map[int64]int{}
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		v, err := decodeMember(kv.Value)
		if err != nil {
			continue // not a member this package wrote
		}
		byLease[kv.Lease] = len(s.Members)
		s.Members = append(s.Members, MemberStatus{
			Member:  strings.TrimPrefix(string(kv.Key), memberPrefix(st, ring)),
			Holder:  v.Holder,
			Leaving: v.State == stateLeaving,
		})
	}
	held := 0
	for _, kv := range resp.Responses[2].GetResponseRange().Kvs {
		shard := strings.TrimPrefix(string(kv.Key), holderPrefix(st, ring))
		if _, ok := slices.BinarySearch(shards, shard); !ok {
			continue
		}
		held++
		if i, ok := byLease[kv.Lease]; ok {
			s.Members[i].Owned++
		}
	}
	s.Unowned = s.Shards - held
	return s, nil
}
