package embedetcd

import (
	"log/slog"
	"time"
)

// DefaultCompactionRetention is how much history a member keeps by
// default, as long as that history fits in a quarter of the quota: 5
// minutes, the interval at which Kubernetes' API server compacts its etcd.
// A watch that reconnects within it resumes where it stopped; one that was
// away longer sees ErrCompacted and must re-read. Under writes fast enough
// that 5 minutes of history outgrow a quarter of the quota, the member
// keeps less (see WithCompactionRetention).
const DefaultCompactionRetention = 5 * time.Minute

// DefaultQuotaBytes is the backend quota a member has by default, etcd's
// own default. A member over its quota raises a NOSPACE alarm and refuses
// writes until space is freed (compaction, defragmentation) and the alarm
// is disarmed.
const DefaultQuotaBytes = 2 << 30

// MaxTxnOps is the --max-txn-ops of every member: the most compares, or
// operations of one branch, a Txn may have, less at each nesting level the
// operations of the Txns around it (etcd's rule). 258 is what the service's
// documented Txn limits need at worst: a guarded Txn is a Txn of the two
// token compares (level 1), around one owner compare per data key written,
// at most 2 x 64 (level 2), around the caller's Txn, whose branch is its
// 64 operations plus one owner claim per fresh key, 128 (level 3):
// 2 + 128 + 128. etcd's default is 128.
const MaxTxnOps = 258

// Option configures the members StartCluster starts.
type Option func(*options)

type options struct {
	retention       time.Duration
	quota           int64
	maxRequestBytes uint
	log             *slog.Logger
	// noSizeBound turns the compactor's size rule off (tests only: the
	// old policy, which compacts by age alone).
	noSizeBound bool
}

func defaultOptions() options {
	return options{retention: DefaultCompactionRetention, quota: DefaultQuotaBytes, log: slog.New(slog.DiscardHandler)}
}

// WithCompactionRetention keeps up to d of history. Every 100 ms the
// member's compactor (on the raft leader) compacts away the revisions
// older than d (the age rule) and, while the database's in-use size is
// over a quarter of the quota, the older half of the history still kept
// (the size rule), so that writes at any rate leave the file under the
// quota: history is bounded by d and by a quarter of the quota, whichever
// is less. d is therefore a most, not a least: under heavy writes a watch
// may find a revision younger than d compacted. d must be at least a
// second; compaction cannot be turned off.
//
// This replaces etcd's own periodic compactor, which the member does not
// run: with retention R, etcd's compactor (v3compactor/periodic.go in etcd
// 3.7) records a revision every R/10, makes its first compaction only
// once R has passed, and then compacts every R to the revision of R ago,
// keeping between R and 2R of history whatever its size; its revision
// mode (revision.go) compacts every 5 minutes, whatever the rate. With an
// hour's retention a member written as fast as it goes reaches its quota
// before the first compaction.
//
// If the member's NOSPACE alarm is raised all the same (live data over the
// quota, a quota set below a tick's writes), the compactor clears it by
// itself: it compacts the whole history, defragments the member and
// disarms the alarm, at most once a second, logging each recovery at warn
// and its outcome at info (or error), and counting it in SpaceStats.
// Writes refused meanwhile fail with etcd's NOSPACE error and were never
// applied; acknowledged writes are kept.
func WithCompactionRetention(d time.Duration) Option {
	return func(o *options) { o.retention = d }
}

// WithQuota sets the backend quota in bytes, which must be positive.
func WithQuota(bytes int64) Option {
	return func(o *options) { o.quota = bytes }
}

// WithMaxRequestBytes sets the largest request the member accepts (etcd's
// default is 1.5 MiB). Zero keeps etcd's default.
func WithMaxRequestBytes(n uint) Option {
	return func(o *options) { o.maxRequestBytes = n }
}

// WithLogger sends etcd's own logs at warn level and above to log, with
// the attribute component=etcd, and the member's compactor's (compactions
// at debug, NOSPACE recoveries at warn, info and error) with
// component=embedetcd. Without it they are discarded.
func WithLogger(log *slog.Logger) Option {
	return func(o *options) { o.log = log }
}
