package mutant

// The mutants. Each is one plausible wrong guard; the comment says what
// the mutated code does instead of the right thing.
const (
	// EpochCompareDropped: the guard of every guarded call (writes,
	// Check, Release, Advance, Store.Guard) compares the holder key's
	// create revision but not the lease's epoch key.
	EpochCompareDropped Name = "epoch-compare-dropped"
	// OwnerCompareDropped: Put, Delete and Txn do not compare the data
	// keys' owner records, so the holder of any lease can overwrite, and
	// claim, a key that another lease owns.
	OwnerCompareDropped Name = "owner-compare-dropped"
	// BatchSharedGuard: a batch of writes from several tokens is checked
	// against the guard of its first write only.
	BatchSharedGuard Name = "batch-shared-guard"
	// ReleaseAnyHolder: a release deletes whatever holder key is there,
	// not only the one its token names.
	ReleaseAnyHolder Name = "release-any-holder"
	// KubeTrustCallerMarks: the Kubernetes fenced-write engine
	// (kubeadapter/fenced) trusts the caller's object (its fencing
	// annotations and resourceVersion) instead of the stored object read
	// in the same write, whenever the caller's object carries a
	// resourceVersion: it checks the caller's stamp, stamps over the
	// caller's marks and writes conditional on the caller's
	// resourceVersion.
	KubeTrustCallerMarks Name = "kube-trust-caller-marks"
	// KubeTrustCallerVersion: the Kubernetes fenced-write engine
	// (kubeadapter/fenced) checks the stamp of the stored object it read,
	// but writes conditional on the caller's resourceVersion (none, for
	// an object the caller built) instead of the version it checked, so
	// a newer holder's write between the check and the write is
	// overwritten.
	KubeTrustCallerVersion Name = "kube-trust-caller-version"
	// PolicyNoMarkRule: the admission policy, as kubefencertest installs
	// it, lacks its per-lease mark rule: the one that refuses a token of
	// a lease below the mark that lease left on the object.
	PolicyNoMarkRule Name = "policy-no-mark-rule"
	// SharderTrustsRenewTime: the Sharder judges a member alive by its
	// Lease's renewTime against the local clock.
	SharderTrustsRenewTime Name = "sharder-trusts-renew-time"
)
