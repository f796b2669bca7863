package embedetcd

import (
	"log/slog"
	"time"
)

// DefaultCompactionRetention is how much history a member keeps by default.
// A watch that reconnects within it resumes where it stopped; one that
// was away longer sees ErrCompacted and must re-read.
const DefaultCompactionRetention = time.Hour

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

// WithCompactionRetention keeps d of history: the member compacts away
// revisions older than d, checking every d (at most every hour). d must be
// at least a second; compaction cannot be turned off.
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
