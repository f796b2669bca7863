package rendezvous

import (
	"hash/fnv"
	"math"
)

// Member is one candidate owner: a stable name and a positive weight.
type Member struct {
	// Name identifies the member; it must be the same in every process
	// that computes owners, such as a StatefulSet pod name.
	Name string
	// Weight scales the member's expected share of keys. Zero or less
	// means 1.
	Weight float64
}

// Hash returns the mixed 64-bit hash of the pair (key, member): FNV-1a
// over key, a zero byte and member, then the murmur3 finalizer.
func Hash(key, member string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(key))
	h.Write([]byte{0})
	h.Write([]byte(member))
	return mix(h.Sum64())
}

// mix is murmur3's fmix64: every input bit affects every output bit.
func mix(x uint64) uint64 {
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb9fe1a85ec53
	x ^= x >> 33
	return x
}

// Score returns the rendezvous score of member m for key: -w/ln(u), with
// u the pair's hash mapped into the open interval (0, 1).
func Score(key string, m Member) float64 {
	w := m.Weight
	if w <= 0 {
		w = 1
	}
	u := (float64(Hash(key, m.Name)>>11) + 0.5) / (1 << 53)
	return -w / math.Log(u)
}

// Owner returns the name of the member with the highest score for key,
// ties broken by the smaller name, and false when members is empty. The
// result depends only on key and the set of members, not on their order.
func Owner(key string, members []Member) (string, bool) {
	best, bestScore, found := "", 0.0, false
	for _, m := range members {
		s := Score(key, m)
		if !found || s > bestScore || (s == bestScore && m.Name < best) {
			best, bestScore, found = m.Name, s, true
		}
	}
	return best, found
}
