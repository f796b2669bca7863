package kubeadapter

import (
	"errors"
	"fmt"

	"github.com/fencer-dev/fencer/token"
)

// Sentinel errors of this package. Match them with errors.Is. Errors about
// tokens and holding are the token package's: token.ErrStale,
// token.ErrNotHeld, token.ErrHeldByAnother, token.ErrForeignLease and
// token.ErrMalformed.
var (
	// ErrInvalidConfig means a Config or an option was rejected before any
	// I/O. A *ConfigError wraps it.
	ErrInvalidConfig = errors.New("kubeadapter: invalid config")
	// ErrAlreadyHeld means an Elector was asked to acquire while one of its
	// acquisitions is still held.
	ErrAlreadyHeld = errors.New("kubeadapter: elector already holds the lease")
	// ErrCannotAcquire means the API server refused an acquisition
	// attempt in a way that waiting will not change: the identity lacks
	// the rights, the Lease's namespace does not exist, or the server
	// finds the Lease invalid. An *AcquireError wraps it.
	ErrCannotAcquire = errors.New("kubeadapter: cannot acquire")
	// ErrAlreadyStarted means Watcher.Start or leader.Leader.Start was
	// called on a Watcher or Leader that had already been started.
	ErrAlreadyStarted = errors.New("kubeadapter: already started")

	// ErrReleased is the reason a Held ended because Release was called.
	// It is token.ErrReleased, which ends the etcd store's and the gRPC
	// client's released leases too.
	ErrReleased = token.ErrReleased
	// ErrRenewDeadline is the reason a Held ended because no renewal
	// succeeded within Config.RenewDeadline of the last successful write.
	ErrRenewDeadline = errors.New("kubeadapter: renew deadline exceeded")
	// ErrLeaseTaken is the reason a Held ended because the Lease record
	// names another holder or another acquisition.
	ErrLeaseTaken = errors.New("kubeadapter: lease taken by another acquisition")
	// ErrLeaseDeleted is the reason a Held ended because the Lease object
	// was deleted.
	ErrLeaseDeleted = errors.New("kubeadapter: lease deleted")
	// ErrLeaseReplaced is the reason a Held ended because the Lease object
	// was deleted and recreated (its UID changed).
	ErrLeaseReplaced = errors.New("kubeadapter: lease replaced")
)

// ConfigError reports an invalid Config field or option. It wraps
// ErrInvalidConfig.
type ConfigError struct {
	// Field names the offending field or option, such as "RenewDeadline".
	Field string
	// Reason says what is wrong with it.
	Reason string
}

// Error describes the error for people; match it with errors.Is or errors.As, never by its text.
func (e *ConfigError) Error() string {
	return fmt.Sprintf("kubeadapter: invalid config: %s %s", e.Field, e.Reason)
}

// Unwrap returns ErrInvalidConfig.
func (e *ConfigError) Unwrap() error { return ErrInvalidConfig }

// LostError says why a Held is no longer held. It matches both
// token.ErrNotHeld and its Reason (ErrReleased, ErrRenewDeadline,
// ErrLeaseTaken, ErrLeaseDeleted or ErrLeaseReplaced) with errors.Is, and
// the shared ending of the token package that the reason is a case of:
// token.ErrLeaseLost for ErrLeaseTaken, ErrLeaseDeleted and
// ErrLeaseReplaced, token.ErrSessionExpired for ErrRenewDeadline. So
// errors.Is(err, token.ErrLeaseLost) answers alike for every kind of lease.
type LostError struct {
	// Token is the token of the acquisition that ended.
	Token token.Token
	// Reason is one of the reason sentinels of this package.
	Reason error
	// Holder is the holder identity the Lease named when the loss was
	// detected, when known.
	Holder string
}

// Error describes the error for people; match it with errors.Is or errors.As, never by its text.
func (e *LostError) Error() string {
	if e.Holder == "" {
		return fmt.Sprintf("kubeadapter: %s no longer held: %v", e.Token, e.Reason)
	}
	return fmt.Sprintf("kubeadapter: %s no longer held: %v (holder %q)", e.Token, e.Reason, e.Holder)
}

// Unwrap returns token.ErrNotHeld, the reason and, if there is one, the
// token package's ending that the reason is a case of.
func (e *LostError) Unwrap() []error {
	switch e.Reason {
	case ErrLeaseTaken, ErrLeaseDeleted, ErrLeaseReplaced:
		return []error{token.ErrNotHeld, e.Reason, token.ErrLeaseLost}
	case ErrRenewDeadline:
		return []error{token.ErrNotHeld, e.Reason, token.ErrSessionExpired}
	}
	return []error{token.ErrNotHeld, e.Reason}
}

// AcquireError reports an acquisition the API server refuses for a reason
// waiting will not change. It matches ErrCannotAcquire, and the API error
// it carries (apierrors.IsForbidden and the like work on it).
type AcquireError struct {
	// Lease is the Lease's "namespace/name".
	Lease string
	// Reason is the value of the reason label of MetricAcquireErrors:
	// AcquireForbidden, AcquireNotFound or AcquireInvalid.
	Reason string
	// Err is the API server's error.
	Err error
}

// Error describes the error for people; match it with errors.Is or errors.As, never by its text.
func (e *AcquireError) Error() string {
	return fmt.Sprintf("kubeadapter: cannot acquire %s (%s): %v", e.Lease, e.Reason, e.Err)
}

// Unwrap returns ErrCannotAcquire and the API error.
func (e *AcquireError) Unwrap() []error { return []error{ErrCannotAcquire, e.Err} }
