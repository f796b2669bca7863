package etcdstore

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencer-dev/fencer/token"
)

// A lock-delay keeps a lease that ended without a clean release from being
// acquired again for a while, so that a holder that has not yet noticed
// the end (a process still in its grace period, say) does not overlap its
// successor in side effects the store cannot fence. etcd has no clock in
// a Txn's compares, so the delay is timed by an etcd lease, which expires
// on etcd's clock:
//
//   - An acquisition with a delay D > 0 writes the marker delays/<name>,
//     "<D in ms>", in its acquiring Txn. A clean release (Lease.Release:
//     the holder's own session) deletes the marker in the Txn that deletes
//     the holder key. Every other end (expiry, a deleted holder key, a
//     release by token through Store.Release) leaves it.
//   - An acquirer that finds the lease free and the marker unclaimed
//     starts the delay: in one Txn, conditional on the marker's mod
//     revision and on the holder key's absence, it writes the claim key
//     delays/<name>/claim on a new etcd lease with a TTL of D (in whole
//     seconds, rounded up; etcd raises it to its minimum lease TTL) and
//     rewrites the marker as "<D in ms> <claim's etcd lease ID>".
//   - The acquiring Txn compares the marker's mod revision with the one
//     the acquirer read and, when the marker names a claim, requires the
//     claim key to be absent: etcd has expired it, so the delay has passed
//     on etcd's clock. It then rewrites the marker for its own delay, or
//     deletes it (D = 0).
//
// Lease names contain no "/", so a claim key never collides with a marker.

// MaxLockDelay is the longest lock-delay an acquisition may set.
const MaxLockDelay = time.Hour

func (s *Store) delayKey(name string) string { return s.prefix + "delays/" + name }
func (s *Store) claimKey(name string) string { return s.prefix + "delays/" + name + "/claim" }

// delayMarker is the decoded marker of a lease name.
type delayMarker struct {
	present bool
	modRev  int64
	delay   time.Duration
	claim   clientv3.LeaseID // 0 until the delay has been started
}

func encodeMarker(delay time.Duration, claim clientv3.LeaseID) string {
	v := strconv.FormatInt(delay.Milliseconds(), 10)
	if claim != 0 {
		v += " " + strconv.FormatInt(int64(claim), 10)
	}
	return v
}

func decodeMarker(b []byte, modRev int64) (delayMarker, error) {
	ms, claim, claimed := strings.Cut(string(b), " ")
	m := delayMarker{present: true, modRev: modRev}
	n, err := strconv.ParseInt(ms, 10, 64)
	if err != nil || n < 0 {
		return delayMarker{}, fmt.Errorf("etcdstore: corrupt lock-delay marker %q", b)
	}
	m.delay = time.Duration(n) * time.Millisecond
	if claimed {
		id, err := strconv.ParseInt(claim, 10, 64)
		if err != nil || id == 0 {
			return delayMarker{}, fmt.Errorf("etcdstore: corrupt lock-delay marker %q", b)
		}
		m.claim = clientv3.LeaseID(id)
	}
	return m, nil
}

// validLockDelay checks a lock-delay asked of an acquisition.
func validLockDelay(d time.Duration) error {
	if d < 0 || d > MaxLockDelay {
		return invalid("lock-delay", d.String(), "must be between 0 and "+MaxLockDelay.String())
	}
	return nil
}

// delaySeconds is the TTL of a claim: d in whole seconds, rounded up.
func delaySeconds(d time.Duration) int64 {
	return int64((d + time.Second - 1) / time.Second)
}

// startDelay starts the lock-delay recorded in m for lease name: it grants
// an etcd lease of the delay's length and, if the marker is still at m's
// mod revision and the lease still free, puts the claim key on it and
// names it in the marker. It reports whether it started the delay, and
// then the TTL etcd granted the claim, the time the delay has left; when
// it did not (another acquirer was first, or the lease was acquired), the
// caller reads again.
func (s *Store) startDelay(ctx context.Context, name string, m delayMarker) (time.Duration, bool, error) {
	g, err := s.cli.Grant(ctx, delaySeconds(m.delay))
	if err != nil {
		return 0, false, fmt.Errorf("etcdstore: start lock-delay of %q: %w", name, err)
	}
	dk := s.delayKey(name)
	resp, err := s.cli.Txn(ctx).If(
		clientv3.Compare(clientv3.ModRevision(dk), "=", m.modRev),
		clientv3.Compare(clientv3.CreateRevision(s.holderKey(name)), "=", 0),
	).Then(
		clientv3.OpPut(s.claimKey(name), "", clientv3.WithLease(g.ID)),
		clientv3.OpPut(dk, encodeMarker(m.delay, g.ID)),
	).Commit()
	if err == nil && resp.Succeeded {
		return time.Duration(g.TTL) * time.Second, true, nil
	}
	// Not started by this call: the lease goes now, or expires unused.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	_, _ = s.cli.Revoke(rctx, g.ID)
	cancel()
	if err != nil {
		return 0, false, fmt.Errorf("etcdstore: start lock-delay of %q: %w", name, err)
	}
	return 0, false, nil
}

// delayError returns the *token.LockDelayError of a lease whose delay,
// recorded in m, is running, with the time its claim has left when etcd
// says.
func (s *Store) delayError(ctx context.Context, name string, m delayMarker) error {
	e := &token.LockDelayError{Lease: name, Delay: m.delay}
	if m.claim != 0 {
		if ttl, err := s.cli.TimeToLive(ctx, m.claim); err == nil && ttl.TTL > 0 {
			e.Remaining = time.Duration(ttl.TTL) * time.Second
		}
	}
	return e
}
