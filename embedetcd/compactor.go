package embedetcd

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/server/v3/etcdserver"
	"go.etcd.io/etcd/server/v3/storage/mvcc"
)

// compactorTick is how often a member's compactor looks at its revision,
// its database and its alarms.
const compactorTick = 100 * time.Millisecond

// maxMarks bounds the marks a compactor keeps: one a tick at most, and
// at most one per retention/maxMarks, so the age rule errs by at most that
// much (300 ms at the default 5 minutes).
const maxMarks = 1000

// recoveryGap is the least time between two attempts to recover from the
// NOSPACE alarm.
const recoveryGap = time.Second

// SpaceStats is a member's database size and what its compactor did since
// the member started. The counts only grow.
type SpaceStats struct {
	// DBSize is the size of the database file in bytes, the figure etcd
	// holds against the quota; DBSizeInUse is the part of it in use, the
	// rest being free pages that writes reuse.
	DBSize, DBSizeInUse int64
	// Compactions is the number of compactions the compactor made.
	Compactions int64
	// SizeCompactions is the number of those made because the database's
	// in-use size passed a quarter of the quota, rather than for age:
	// each one shortened the history watches can resume from.
	SizeCompactions int64
	// NoSpaceAlarms is the number of times the compactor found the
	// member's NOSPACE alarm raised.
	NoSpaceAlarms int64
	// Recoveries is the number of those it cleared: compacted the whole
	// history, defragmented the member and disarmed the alarm.
	Recoveries int64
	// RecoveryFailures is the number of recoveries that failed at some
	// step; the compactor tries again a second later.
	RecoveryFailures int64
}

// spaceCounters are a SpaceStats, updated by the compactor's goroutine and
// read by any other.
type spaceCounters struct {
	compactions, sizeCompactions, alarms, recoveries, failures atomic.Int64
}

func (c *spaceCounters) snapshot() SpaceStats {
	return SpaceStats{
		Compactions: c.compactions.Load(), SizeCompactions: c.sizeCompactions.Load(),
		NoSpaceAlarms: c.alarms.Load(), Recoveries: c.recoveries.Load(), RecoveryFailures: c.failures.Load(),
	}
}

// mark is the member's revision at a time.
type mark struct {
	at  time.Time
	rev int64
}

// compactor keeps one member's database within its quota. It replaces
// etcd's own periodic compactor, which keeps between one and two
// retentions of history whatever their size (its first compaction comes a
// whole retention after start), so that a fast writer fills any quota
// before it compacts.
//
// Every compactorTick, on the leader, it compacts away:
//   - every revision older than retention (the age rule), and,
//   - with sizeBound, while the database's in-use size is over a quarter
//     of the quota, the older half of the history kept (the size rule).
//
// On any member, when the member's NOSPACE alarm is raised, it compacts
// the whole history, defragments the member and disarms the alarm.
//
// Invariants: marks, compacted and lastRecovery belong to run's goroutine;
// marks are in increasing order of time and revision, all newer than
// compacted.
type compactor struct {
	srv       *etcdserver.EtcdServer
	retention time.Duration
	quota     int64
	sizeBound bool
	log       *slog.Logger
	stats     *spaceCounters

	marks        []mark
	compacted    int64
	lastRecovery time.Time
}

// run compacts until ctx ends.
func (c *compactor) run(ctx context.Context) {
	t := time.NewTicker(compactorTick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			c.step(ctx, now)
		}
	}
}

// step does one tick's work at now.
func (c *compactor) step(ctx context.Context, now time.Time) {
	if c.noSpace() {
		if now.Sub(c.lastRecovery) >= recoveryGap {
			c.lastRecovery = now
			c.recover(ctx)
		}
		return
	}
	rev := c.srv.KV().Rev()
	if n := len(c.marks); n == 0 || c.marks[n-1].rev != rev && now.Sub(c.marks[n-1].at) >= c.retention/maxMarks {
		c.marks = append(c.marks, mark{at: now, rev: rev})
	}
	if c.srv.Leader() != c.srv.MemberID() {
		return
	}
	target, bySize := c.target(now, rev, c.srv.Backend().SizeInUse())
	if target <= c.compacted {
		return
	}
	if err := c.compact(ctx, target); err != nil {
		if ctx.Err() == nil {
			c.log.Warn("compaction failed", "revision", target, "error", err)
		}
		return
	}
	c.stats.compactions.Add(1)
	if bySize {
		c.stats.sizeCompactions.Add(1)
	}
	c.log.Debug("compacted", "revision", target, "by_size", bySize, "db_size_in_use", c.srv.Backend().SizeInUse())
}

// target decides, purely, the revision to compact to at now, with the
// member at revision rev and inUse bytes of its database in use, and
// whether the size rule chose it; a target at or under c.compacted means
// none.
func (c *compactor) target(now time.Time, rev, inUse int64) (target int64, bySize bool) {
	for _, m := range c.marks {
		if now.Sub(m.at) < c.retention {
			break
		}
		target = m.rev
	}
	if c.sizeBound && inUse > c.quota/4 {
		half := c.compacted + (rev-c.compacted+1)/2
		if half > target {
			return half, true
		}
	}
	return target, false
}

// compact compacts the member's history up to rev and waits until the
// space is free; a revision already compacted counts as done.
func (c *compactor) compact(ctx context.Context, rev int64) error {
	_, err := c.srv.Compact(ctx, &pb.CompactionRequest{Revision: rev, Physical: true})
	if err != nil && !errors.Is(err, mvcc.ErrCompacted) {
		return err
	}
	c.compacted = rev
	i := 0
	for i < len(c.marks) && c.marks[i].rev <= rev {
		i++
	}
	c.marks = c.marks[i:]
	return nil
}

// noSpace reports whether the member's NOSPACE alarm is raised.
func (c *compactor) noSpace() bool {
	for _, a := range c.srv.Alarms() {
		if a.Alarm == pb.AlarmType_NOSPACE && a.MemberID == uint64(c.srv.MemberID()) {
			return true
		}
	}
	return false
}

// recover clears the member's NOSPACE alarm: it compacts the whole
// history, defragments the member so that its file shrinks, and disarms
// the alarm. It logs and counts each outcome.
func (c *compactor) recover(ctx context.Context) {
	start := time.Now()
	c.stats.alarms.Add(1)
	rev := c.srv.KV().Rev()
	c.log.Warn("etcd out of space: compacting all history, defragmenting and disarming the NOSPACE alarm",
		"db_size", c.srv.Backend().Size(), "db_size_in_use", c.srv.Backend().SizeInUse(), "quota", c.quota, "revision", rev)
	fail := func(step string, err error) {
		if ctx.Err() != nil {
			return
		}
		c.stats.failures.Add(1)
		c.log.Error("etcd out of space: recovery failed; trying again", "step", step, "error", err)
	}
	if err := c.compact(ctx, rev); err != nil {
		fail("compact", err)
		return
	}
	c.stats.compactions.Add(1)
	if err := c.srv.Defragment(); err != nil {
		fail("defragment", err)
		return
	}
	if _, err := c.srv.Alarm(ctx, &pb.AlarmRequest{
		Action: pb.AlarmRequest_DEACTIVATE, MemberID: uint64(c.srv.MemberID()), Alarm: pb.AlarmType_NOSPACE,
	}); err != nil {
		fail("disarm", err)
		return
	}
	c.stats.recoveries.Add(1)
	size := c.srv.Backend().Size()
	c.log.Info("etcd space recovered: NOSPACE alarm disarmed, writes accepted again",
		"took", time.Since(start).Round(time.Millisecond), "db_size", size, "quota", c.quota, "compacted_to", rev)
	if size >= c.quota/2 {
		c.log.Error("etcd's live data alone fills half its quota: raise --etcd-quota-bytes or delete keys", "db_size", size, "quota", c.quota)
	}
}
