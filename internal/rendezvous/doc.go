// Package rendezvous chooses an owner for a key among members by
// rendezvous (highest random weight) hashing, so that every process that
// sees the same members chooses the same owner without talking to the
// others, and a change of members moves only the keys whose owner joined
// or left.
//
// The score of a (key, member) pair is -w/ln(u), where u in (0, 1) is a
// well-mixed 64-bit hash of the pair and w the member's weight, so that a
// member's expected share of keys is its weight over the sum of weights
// (Schindelhauer and Schomaker's weighted distributed hash tables). The
// hash is FNV-1a over the key, a zero byte and the member name, followed
// by the murmur3 64-bit finalizer: FNV-1a alone barely mixes the last
// bytes, so members that differ only in a trailing digit, such as
// StatefulSet pods x-0, x-1 and x-2, would get unequal shares.
//
// What it does not guarantee: balance is statistical (a share is within
// a few percent of its expectation for thousands of keys, not exactly
// equal), and two processes that see different members may choose
// different owners; callers that need one owner must make the choice a
// conditional write.
package rendezvous
