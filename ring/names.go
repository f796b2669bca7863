package ring

import (
	"errors"
	"strings"

	"github.com/fencer-dev/fencer/token"
)

// LeasePrefix starts the fencer lease name of every shard of every ring.
// The service refuses plain acquisitions of names that start with it.
const LeasePrefix = "ring:"

// Limits on names and sizes, checked before anything is sent to etcd.
const (
	// MaxRingLen is the longest ring name, in bytes.
	MaxRingLen = 63
	// MaxShardLen is the longest shard or member name, in bytes.
	MaxShardLen = 128
	// MaxHolderLen is the longest holder identity (Config.Holder), in
	// bytes.
	MaxHolderLen = 512
	// MaxShards is the most shards a ring may have.
	MaxShards = 100000
	// MaxRecordLen is the largest encoded ring record (its shard list as
	// JSON), in bytes: etcd's default request limit (1.5 MiB) less room
	// for the rest of the request. MaxShards shards fit if their names
	// average 12 bytes or less.
	MaxRecordLen = 1536<<10 - 4<<10
)

// Errors of the package. Each is returned wrapped with the ring's name;
// match them with errors.Is.
var (
	// ErrRingNotFound means no ring of that name was defined.
	ErrRingNotFound = errors.New("ring: not found")
	// ErrRingConflict means a ring of that name exists with other shards,
	// or a member name is taken by another session.
	ErrRingConflict = errors.New("ring: conflict")
	// ErrNotLosing means Release was asked to release a shard the member
	// owns but has not reported Losing.
	ErrNotLosing = errors.New("ring: shard is not being handed off")
	// ErrLeft ends a Member that left the ring (Leave).
	ErrLeft = errors.New("ring: member left")
	// ErrClosed ends a Member that was closed (Close).
	ErrClosed = errors.New("ring: member closed")
)

// ShardLease returns the fencer lease name of shard in ring:
// "ring:<ring>:<shard>". It does not validate its arguments.
func ShardLease(ring, shard string) string { return LeasePrefix + ring + ":" + shard }

// ParseShardLease splits a shard's lease name into its ring and shard. ok
// is false unless lease is ShardLease of a valid ring and a valid shard.
// Ring names contain no ":", so the split is unambiguous.
func ParseShardLease(lease string) (ring, shard string, ok bool) {
	rest, ok := strings.CutPrefix(lease, LeasePrefix)
	if !ok {
		return "", "", false
	}
	ring, shard, ok = strings.Cut(rest, ":")
	if !ok || ValidateRing(ring) != nil || ValidateShard(shard) != nil {
		return "", "", false
	}
	return ring, shard, true
}

// ValidateRing checks a ring name: 1 to MaxRingLen bytes of lower-case
// ASCII letters, digits, "." and "-", starting and ending with a letter or
// digit. It returns a *token.ArgumentError otherwise.
func ValidateRing(name string) error {
	alnum := func(c byte) bool { return c >= 'a' && c <= 'z' || c >= '0' && c <= '9' }
	switch {
	case name == "":
		return token.InvalidArgument("ring", name, "empty")
	case len(name) > MaxRingLen:
		return token.InvalidArgument("ring", name, "longer than 63 bytes")
	case !alnum(name[0]) || !alnum(name[len(name)-1]):
		return token.InvalidArgument("ring", name, "must start and end with a lower-case letter or digit")
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; !alnum(c) && c != '.' && c != '-' {
			return token.InvalidArgument("ring", name, `may contain only lower-case letters, digits, "." and "-"`)
		}
	}
	return nil
}

// ValidateShard checks a shard name: 1 to MaxShardLen bytes of UTF-8
// without "/", spaces or control characters (token.ValidateName's rules
// with a shorter limit). It returns a *token.ArgumentError otherwise.
func ValidateShard(name string) error { return validateName("shard", name) }

// ValidateMember checks a member name by ValidateShard's rules.
func ValidateMember(name string) error { return validateName("member", name) }

func validateName(arg, name string) error {
	if len(name) > MaxShardLen {
		return token.InvalidArgument(arg, name, "longer than 128 bytes")
	}
	return token.ValidateName(arg, name)
}
