package embedetcd

// WithoutSizeBound turns the compactor's size rule off: history is then
// compacted by age alone, as etcd's periodic compactor did, and a fast
// writer fills the quota (the policy the size rule replaced).
func WithoutSizeBound() Option { return func(o *options) { o.noSizeBound = true } }

// CatchUpEntries is the member's etcd --snapshot-catchup-entries.
func (s *Server) CatchUpEntries() uint64 { return s.etcd.Server.Cfg.SnapshotCatchUpEntries }

// SoloCatchUpEntries is what a single member keeps.
const SoloCatchUpEntries = soloCatchUpEntries
