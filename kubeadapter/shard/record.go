package shard

import (
	"crypto/sha256"
	"encoding/hex"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/fencer-dev/fencer/internal/rendezvous"
	"github.com/fencer-dev/fencer/kubeadapter/internal/leaserecord"
)

// This file holds the pure part of the Sharder: how ring Leases are named
// and labelled, which shards are orphaned, and which moves a member makes.
// It performs no I/O and reads no clock.

// Labels and annotations of the Leases of a ring.
const (
	// RingLabel names the ring on every Lease of it: the heartbeat Lease
	// of each member and the Lease of each shard.
	RingLabel = "fencer.dev/ring"
	// RoleLabel is RoleMember on a heartbeat Lease and RoleShard on a
	// shard Lease.
	RoleLabel = "fencer.dev/role"
	// RoleMember and RoleShard are the values of RoleLabel.
	RoleMember = "member"
	RoleShard  = "shard"
	// NameAnnotation holds the shard's name on its Lease, whose name is
	// a hash of it.
	NameAnnotation = "fencer.dev/shard"
	// MemberAnnotation holds, on a shard Lease, the name of the heartbeat
	// Lease of the member whose incarnation holderIdentity names.
	MemberAnnotation = "fencer.dev/member"
	// LeavingAnnotation is set on a heartbeat Lease by a member that is
	// leaving the ring, to its incarnation (holderIdentity): the others
	// keep its shards assigned to it (it is alive) but assign it none,
	// while it hands its shards to them. A later incarnation of the same
	// identity, which inherits the annotation with the Lease, is not
	// leaving.
	LeavingAnnotation = "fencer.dev/leaving"
	// WeightLabel holds, on a heartbeat Lease, the member's rendezvous
	// weight (Config.Weight) as a decimal integer. A missing or
	// unparsable value counts as 1.
	WeightLabel = "fencer.dev/weight"
)

// weightOf returns the rendezvous weight a heartbeat Lease declares.
func weightOf(member *coordinationv1.Lease) float64 {
	w, err := strconv.ParseUint(member.Labels[WeightLabel], 10, 32)
	if err != nil || w == 0 {
		return 1
	}
	return float64(w)
}

// memberLeaseName is the name of the heartbeat Lease of identity in ring.
func memberLeaseName(ring, identity string) string { return ring + "-m-" + identity }

// LeaseName returns the name of the Lease of shard in ring: the ring,
// "-s-" and 16 hex digits of the SHA-256 of the shard's name, so that any
// shard name, whatever its characters or length, gives a valid Lease
// name. The name itself is in NameAnnotation.
func LeaseName(ring, shard string) string {
	sum := sha256.Sum256([]byte(shard))
	return ring + "-s-" + hex.EncodeToString(sum[:8])
}

// ringLabels are the labels of a Lease of ring with role.
func ringLabels(ring, role string) map[string]string {
	return map[string]string{RingLabel: ring, RoleLabel: role}
}

// identityOf returns the member identity of a heartbeat Lease of ring.
func identityOf(ring string, member *coordinationv1.Lease) string {
	return strings.TrimPrefix(member.Name, ring+"-m-")
}

// ringView is what a member knows of its ring: the heartbeat Leases by
// Lease name and the shard Leases by shard name.
type ringView struct {
	members map[string]*coordinationv1.Lease
	shards  map[string]*coordinationv1.Lease
}

// newRingView sorts the Leases of ring by role. A shard Lease without its
// NameAnnotation, or whose name is not the hash of it, is ignored.
func newRingView(ring string, leases []*coordinationv1.Lease) ringView {
	v := ringView{members: map[string]*coordinationv1.Lease{}, shards: map[string]*coordinationv1.Lease{}}
	for _, l := range leases {
		switch l.Labels[RoleLabel] {
		case RoleMember:
			v.members[l.Name] = l
		case RoleShard:
			if shard, ok := l.Annotations[NameAnnotation]; ok && l.Name == LeaseName(ring, shard) {
				v.shards[shard] = l
			}
		}
	}
	return v
}

// orphaned reports whether the shard Lease names no live incarnation: it
// names no holder, or the heartbeat Lease it points to is missing, was
// released (tombstoned), or names another incarnation. It reads no clock
// and no timestamp: whether a heartbeat is still renewed is decided
// elsewhere, by the tombstone that ends it.
func orphaned(shard *coordinationv1.Lease, members map[string]*coordinationv1.Lease) bool {
	holder := leaserecord.Holder(&shard.Spec)
	if holder == "" {
		return true
	}
	m, ok := members[shard.Annotations[MemberAnnotation]]
	return !ok || leaserecord.Holder(&m.Spec) != holder
}

// incarnation is a live member as the planner sees it.
type incarnation struct {
	// identity is the member's stable name, the rendezvous key.
	identity string
	// holder is the holderIdentity of its heartbeat Lease.
	holder string
	// lease is the name of its heartbeat Lease.
	lease string
	// weight is its rendezvous weight; zero counts as 1.
	weight float64
}

// Kinds of move, and the values of the reason label of
// MetricMoves.
const (
	MoveCreate  = "create"
	MoveHandoff = "handoff"
	MoveOrphan  = "orphan"
	MoveRelease = "release"
)

// move is one write a member makes to a shard Lease.
type move struct {
	kind  string
	shard string
	// cur is the shard Lease the write is conditional on; nil for a
	// create.
	cur *coordinationv1.Lease
	// to is the incarnation the write names; zero for a release.
	to incarnation
}

// plan returns the moves member me makes: it creates the Lease of a
// tracked shard that has none and takes over an orphaned tracked shard
// when it is the shard's rendezvous owner among live; it hands a shard it
// holds to its rendezvous owner when that is another live member, and
// releases a shard it holds but no longer tracks. Creates and takeovers
// come first, then handoffs, then releases, each in shard order.
func plan(v ringView, tracked []string, live []incarnation, me incarnation) []move {
	members := make([]rendezvous.Member, len(live))
	byID := make(map[string]incarnation, len(live))
	for i, m := range live {
		members[i] = rendezvous.Member{Name: m.identity, Weight: m.weight}
		byID[m.identity] = m
	}
	isTracked := make(map[string]bool, len(tracked))
	var first, handoffs, releases []move
	for _, shard := range tracked {
		isTracked[shard] = true
		owner, ok := rendezvous.Owner(shard, members)
		if !ok {
			continue
		}
		cur := v.shards[shard]
		switch {
		case cur == nil:
			if owner == me.identity {
				first = append(first, move{kind: MoveCreate, shard: shard, to: me})
			}
		case orphaned(cur, v.members):
			if owner == me.identity {
				first = append(first, move{kind: MoveOrphan, shard: shard, cur: cur, to: me})
			}
		case holds(cur, me) && owner != me.identity:
			handoffs = append(handoffs, move{kind: MoveHandoff, shard: shard, cur: cur, to: byID[owner]})
		}
	}
	for _, shard := range slices.Sorted(maps.Keys(v.shards)) {
		if cur := v.shards[shard]; !isTracked[shard] && holds(cur, me) {
			releases = append(releases, move{kind: MoveRelease, shard: shard, cur: cur})
		}
	}
	return slices.Concat(first, handoffs, releases)
}

// holds reports whether the shard Lease names incarnation m.
func holds(shard *coordinationv1.Lease, m incarnation) bool {
	return leaserecord.Holder(&shard.Spec) == m.holder && shard.Annotations[MemberAnnotation] == m.lease
}

// assigned returns the shard Lease that a move writes: over cur (nil for a
// create) it names to (no one for a zero to), with leaseTransitions
// counted as for any acquisition (acquiredSpec), so that every assignment
// has a new epoch. The write must be conditional on cur's
// resourceVersion, which the returned object keeps.
func assigned(namespace, ring, shard string, cur *coordinationv1.Lease, to incarnation, d time.Duration, now time.Time) *coordinationv1.Lease {
	var next *coordinationv1.Lease
	var old *coordinationv1.LeaseSpec
	if cur == nil {
		next = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: LeaseName(ring, shard)}}
	} else {
		next = cur.DeepCopy()
		old = &cur.Spec
	}
	next.Labels = leaserecord.FenceLabels(next.Labels, ringLabels(ring, RoleShard))
	next.Annotations = maps.Clone(next.Annotations)
	if next.Annotations == nil {
		next.Annotations = map[string]string{}
	}
	next.Annotations[NameAnnotation] = shard
	next.Annotations[MemberAnnotation] = to.lease
	next.Spec = leaserecord.Acquired(old, to.holder, d, now)
	return next
}

// tombstoned returns the heartbeat Lease that declares member dead: as
// released by its holder (releasedSpec), to be written conditional on
// exactly the resourceVersion that was observed unchanged.
func tombstoned(member *coordinationv1.Lease, now time.Time) *coordinationv1.Lease {
	next := member.DeepCopy()
	next.Spec = leaserecord.Released(&member.Spec, now)
	return next
}
