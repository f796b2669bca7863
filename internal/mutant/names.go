package mutant

// The mutants. Each is one plausible wrong guard; the comment says what
// the mutated code does instead of the right thing.
const (
	// EpochCompareDropped: a guarded write compares the holder key's
	// revision but not the lease's epoch key.
	EpochCompareDropped Name = "epoch-compare-dropped"
	// OwnerCompareDropped: a guarded write does not compare the data
	// key's owner record, so an older token can overwrite a key that a
	// newer one has claimed.
	OwnerCompareDropped Name = "owner-compare-dropped"
	// BatchSharedGuard: a batch of writes from several tokens is checked
	// against the guard of its first write only.
	BatchSharedGuard Name = "batch-shared-guard"
	// ReleaseAnyHolder: a release deletes whatever holder key is there,
	// not only the one its token names.
	ReleaseAnyHolder Name = "release-any-holder"
	// KubeTrustCallerMarks: the Kubernetes fenced write trusts the
	// caller's object (its fencing annotations and resourceVersion)
	// instead of the stored object read in the same write.
	KubeTrustCallerMarks Name = "kube-trust-caller-marks"
	// PolicyNoMarkRule: the admission policy lacks its per-lease mark
	// rule.
	PolicyNoMarkRule Name = "policy-no-mark-rule"
	// SharderTrustsRenewTime: the Sharder judges a member alive by its
	// Lease's renewTime against the local clock.
	SharderTrustsRenewTime Name = "sharder-trusts-renew-time"
)
