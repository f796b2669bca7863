package fencerv1

// ErrorDomain is the google.rpc.ErrorInfo domain of every error fencer's
// service returns.
const ErrorDomain = "fencer.dev"

// ErrorInfo reasons. Each error the service returns carries exactly one,
// with the gRPC code noted beside it; docs/service.md lists the metadata
// each reason carries.
const (
	// ReasonStaleToken (FAILED_PRECONDITION): the token has been superseded
	// or is no longer current. Metadata: "token", and "newer_token" when the
	// superseding token is known.
	ReasonStaleToken = "STALE_TOKEN"
	// ReasonLeaseNotHeld (FAILED_PRECONDITION): the lease is not held.
	ReasonLeaseNotHeld = "LEASE_NOT_HELD"
	// ReasonHeldByAnother (FAILED_PRECONDITION): another holder holds the
	// lease. Metadata: "lease", "holder".
	ReasonHeldByAnother = "HELD_BY_ANOTHER"
	// ReasonLockDelay (FAILED_PRECONDITION): the lease is free but inside
	// the lock-delay of its last acquisition, which ended without a clean
	// release. Metadata: "lease", and "delay_ms" and "remaining_ms" when
	// known.
	ReasonLockDelay = "LOCK_DELAY"
	// ReasonForeignLease (FAILED_PRECONDITION): a token of another lease was
	// found. Metadata: "want", "got".
	ReasonForeignLease = "FOREIGN_LEASE"
	// ReasonInvalidToken (INVALID_ARGUMENT): a token is malformed.
	// Metadata: "field", "input", "reason".
	ReasonInvalidToken = "INVALID_TOKEN"
	// ReasonInvalidArgument (INVALID_ARGUMENT): a request field is invalid.
	// Metadata: "field", "input", "reason"; a google.rpc.BadRequest detail
	// names the field too.
	ReasonInvalidArgument = "INVALID_ARGUMENT"
	// ReasonSessionNotFound (NOT_FOUND): the session has expired or was
	// released, or never existed.
	ReasonSessionNotFound = "SESSION_NOT_FOUND"
	// ReasonPermissionDenied (PERMISSION_DENIED): the session or token
	// belongs to another principal.
	ReasonPermissionDenied = "PERMISSION_DENIED"
	// ReasonUnauthenticated (UNAUTHENTICATED): the call carried no valid
	// credentials.
	ReasonUnauthenticated = "UNAUTHENTICATED"
	// ReasonWatchCompacted (OUT_OF_RANGE): a watch's start revision has been
	// compacted away. Check the tokens held and watch again from now.
	ReasonWatchCompacted = "WATCH_COMPACTED"
	// ReasonStoreUnavailable (UNAVAILABLE or DEADLINE_EXCEEDED): etcd did
	// not answer. A write that fails this way may or may not have
	// committed.
	ReasonStoreUnavailable = "STORE_UNAVAILABLE"
	// ReasonShuttingDown (UNAVAILABLE): the server is shutting down; retry
	// on another server.
	ReasonShuttingDown = "SHUTTING_DOWN"
	// ReasonInternal (INTERNAL): anything else.
	ReasonInternal = "INTERNAL"
)
