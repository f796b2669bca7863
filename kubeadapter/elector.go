package kubeadapter

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/util/wait"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/utils/clock"

	"github.com/fencer-dev/fencer/kubeadapter/internal/leaserecord"
	"github.com/fencer-dev/fencer/token"
)

// Elector acquires one coordination.k8s.io/v1 Lease and turns each
// acquisition into a fencing token.
//
// The Lease record uses exactly the fields of client-go's LeaseLock
// (holderIdentity, leaseDurationSeconds, acquireTime, renewTime,
// leaseTransitions), so an Elector and stock client-go electors can contend
// for the same Lease. Unlike client-go, an Elector increments
// leaseTransitions on every acquisition, including one by the identity the
// record already names, and its identity carries a per-Elector nonce.
//
// Every acquiring write, create or update, also sets the label FenceLabel
// to FenceLabelValue, and the labels of Config.Labels, on the Lease, so that the live-Lease admission policy
// takes it as a parameter. Renewals and releases leave labels as they
// are.
//
// The token of an acquisition is (leaseTransitions, resourceVersion of the
// acquiring write); see TokenOf. Tokens of later acquisitions are greater
// because every write to the Lease, including one that recreates it after
// a delete, gets a greater resourceVersion.
//
// An Elector is safe for concurrent use and holds at most one acquisition
// at a time.
//
// An Elector does not fence anything by itself: holding a lease only means
// no other candidate following these rules believes it holds it, judged on
// each candidate's own clock. Writes are fenced by stamping the token and
// writing conditionally (see Client, UpdateFenced and DeleteFenced).
type Elector struct {
	leases   coordinationv1client.LeasesGetter
	cfg      Config
	clock    clock.WithDelayedExecution
	identity string
	// acquireErrors counts failed attempts when there is no Watcher and
	// Config.Registerer is set; nil otherwise.
	acquireErrors *prometheus.CounterVec

	// mu serializes acquisition attempts and guards obs and current.
	mu      sync.Mutex
	obs     observation
	current *Held
}

// NewElector returns an Elector for cfg that reads and writes the Lease
// through leases (for a clientset, clientset.CoordinationV1()). It returns a
// *ConfigError when cfg is invalid and performs no I/O.
func NewElector(leases coordinationv1client.LeasesGetter, cfg Config) (*Elector, error) {
	if leases == nil {
		return nil, &ConfigError{Field: "leases", Reason: "must not be nil"}
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	var nonce [8]byte
	if _, err := rand.Read(nonce[:]); err != nil {
		return nil, fmt.Errorf("kubeadapter: identity nonce: %w", err)
	}
	e := &Elector{
		leases:   leases,
		cfg:      cfg,
		clock:    cfg.Clock,
		identity: cfg.Identity + "_" + hex.EncodeToString(nonce[:]),
	}
	if e.clock == nil {
		e.clock = clock.RealClock{}
	}
	if cfg.Registerer != nil {
		c, err := registerAcquireErrors(cfg.Registerer)
		if err != nil {
			return nil, err
		}
		e.acquireErrors = c
	}
	return e, nil
}

// acquireError counts a failed acquisition attempt, in the Watcher's
// metrics or in Config.Registerer's counter.
func (e *Elector) acquireError(reason string) {
	if e.acquireErrors != nil {
		e.acquireErrors.WithLabelValues(e.Lease(), reason).Inc()
		return
	}
	e.metrics().acquireError(e.Lease(), reason)
}

// metrics returns the metrics of the Elector's Watcher, or nil.
func (e *Elector) metrics() *metrics {
	if e.cfg.Watcher == nil {
		return nil
	}
	return e.cfg.Watcher.metrics
}

// Identity returns the holderIdentity this Elector writes: the configured
// identity, "_" and the Elector's nonce.
func (e *Elector) Identity() string { return e.identity }

// Config returns the Elector's configuration, defaults applied. Changing
// the returned value changes nothing.
func (e *Elector) Config() Config { return e.cfg }

// Lease returns the "namespace/name" of the Lease, the Lease field of the
// Elector's tokens.
func (e *Elector) Lease() string { return e.cfg.lease() }

// TryAcquire makes one acquisition attempt. It reads the Lease and, if it
// does not exist, is free, names this Elector, or has not changed for the
// record's leaseDurationSeconds as measured on this Elector's clock since
// it was first seen in its current form, writes it with the read
// resourceVersion as precondition (or creates it). The write labels the
// Lease FenceLabel=FenceLabelValue.
//
// It returns a *token.HeldError (token.ErrHeldByAnother) when another
// holder's lease is still running, ErrAlreadyHeld when an acquisition of
// this Elector is still held, and the API error, wrapped, when a read or
// the write fails, including a conflict with a concurrent candidate.
// Before the attempt it waits for the renewal loop of this Elector's
// previous, ended acquisition to stop. Cancelling ctx aborts the attempt;
// it does not end a returned Held.
func (e *Elector) TryAcquire(ctx context.Context) (*Held, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.current != nil {
		if e.current.Err() == nil {
			return nil, ErrAlreadyHeld
		}
		// Let the ended acquisition's renewal loop stop, so that no
		// renewal of it races with this attempt.
		select {
		case <-e.current.done:
		case <-ctx.Done():
			return nil, fmt.Errorf("kubeadapter: acquire %s: %w", e.Lease(), context.Cause(ctx))
		}
	}
	leases := e.leases.Leases(e.cfg.Namespace)
	cur, err := leases.Get(ctx, e.cfg.Name, metav1.GetOptions{})
	var got *coordinationv1.Lease
	switch {
	case apierrors.IsNotFound(err):
		start := e.clock.Now()
		got, err = leases.Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Namespace: e.cfg.Namespace, Name: e.cfg.Name, Labels: leaserecord.FenceLabels(nil, e.cfg.Labels)},
			Spec:       leaserecord.Acquired(nil, e.identity, e.cfg.LeaseDuration, start),
		}, metav1.CreateOptions{})
		if err != nil {
			return nil, fmt.Errorf("kubeadapter: acquire %s: create: %w", e.Lease(), err)
		}
		e.metrics().wrote(WriteAssign)
		return e.start(ctx, got, start)
	case err != nil:
		return nil, fmt.Errorf("kubeadapter: acquire %s: get: %w", e.Lease(), err)
	}
	now := e.clock.Now()
	e.obs.observe(cur, now)
	if err := mayAcquire(cur, e.identity, e.obs.live(now)); err != nil {
		return nil, err
	}
	next := cur.DeepCopy()
	next.Labels = leaserecord.FenceLabels(cur.Labels, e.cfg.Labels)
	start := e.clock.Now()
	next.Spec = leaserecord.Acquired(&cur.Spec, e.identity, e.cfg.LeaseDuration, start)
	got, err = leases.Update(ctx, next, metav1.UpdateOptions{})
	if err != nil {
		return nil, fmt.Errorf("kubeadapter: acquire %s: update: %w", e.Lease(), err)
	}
	e.metrics().wrote(WriteAssign)
	return e.start(ctx, got, start)
}

// Acquire calls TryAcquire until it acquires the Lease, ctx is done, or the
// API server refuses in a way that waiting will not change.
//
//   - While another holder's lease runs, or a concurrent candidate wins a
//     write (a conflict), it tries again every RetryPeriod, with jitter.
//   - It returns an *AcquireError (ErrCannotAcquire) at once when the
//     identity lacks the rights (Forbidden), the Lease's namespace does not
//     exist, or the server finds the write invalid: a replica that can
//     never lead says so instead of waiting forever.
//   - Any other error (timeouts, throttling, an unavailable or
//     unauthenticating server) is retried with exponential backoff from
//     RetryPeriod up to LeaseDuration, with jitter.
//
// Every failed attempt except "held by another" is counted in
// MetricAcquireErrors when Config.Watcher has metrics, or, without a
// Watcher, when Config.Registerer is set. Retried errors are
// logged through the logr.Logger in ctx (logr.NewContext; controller-
// runtime's log.IntoContext): the first of each reason at once, then at
// most once per AcquireLogInterval with the number left unlogged.
//
// It returns ErrAlreadyHeld at once. When ctx is done it returns ctx's
// error wrapped with the last attempt's. ctx bounds only the acquisition:
// the returned Held lasts until Release or until the lease is lost.
func (e *Elector) Acquire(ctx context.Context) (*Held, error) {
	log := logr.FromContextOrDiscard(ctx).WithValues("lease", e.Lease())
	backoff := e.backoff()
	logs := failureLog{last: map[string]time.Time{}, suppressed: map[string]int{}}
	for {
		h, err := e.TryAcquire(ctx)
		if err == nil || errors.Is(err, ErrAlreadyHeld) {
			return h, err
		}
		delay := wait.Jitter(e.cfg.RetryPeriod, JitterFactor)
		switch reason, permanent := acquireReason(err); {
		case ctx.Err() != nil:
		case errors.Is(err, token.ErrHeldByAnother):
			backoff = e.backoff()
		case permanent:
			e.acquireError(reason)
			return nil, &AcquireError{Lease: e.Lease(), Reason: reason, Err: err}
		case reason == AcquireConflict:
			e.acquireError(reason)
			backoff = e.backoff()
		default:
			e.acquireError(reason)
			delay = backoff.Step()
			if n, ok := logs.due(reason, e.clock.Now()); ok {
				log.Error(err, "acquire failed; retrying", "reason", reason, "retry_in", delay.String(), "unlogged", n)
			}
		}
		t := e.clock.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("kubeadapter: acquire %s: %w (last attempt: %v)", e.Lease(), context.Cause(ctx), err)
		case <-t.C():
		}
	}
}

// backoff is the retry schedule of Acquire after errors that may pass:
// from RetryPeriod, doubling, capped at LeaseDuration.
func (e *Elector) backoff() wait.Backoff {
	return wait.Backoff{Duration: e.cfg.RetryPeriod, Factor: 2, Jitter: JitterFactor, Steps: math.MaxInt32, Cap: e.cfg.LeaseDuration}
}

// AcquireLogInterval is the least time between two log lines of Acquire
// for the same reason.
const AcquireLogInterval = time.Minute

// failureLog rate-limits Acquire's log lines per reason.
type failureLog struct {
	last       map[string]time.Time
	suppressed map[string]int
}

// due reports whether a failure with reason should be logged at now, and
// how many of that reason were left unlogged since the last line.
func (l failureLog) due(reason string, now time.Time) (int, bool) {
	if last, ok := l.last[reason]; ok && now.Sub(last) < AcquireLogInterval {
		l.suppressed[reason]++
		return 0, false
	}
	n := l.suppressed[reason]
	l.last[reason], l.suppressed[reason] = now, 0
	return n, true
}

// acquireReason classifies a failed acquisition attempt by the reason
// label of MetricAcquireErrors, and says whether waiting cannot help. A
// NotFound is permanent only when it names the namespace: a Lease deleted
// between the read and the write of an attempt is a race, not a fault.
func acquireReason(err error) (reason string, permanent bool) {
	var status apierrors.APIStatus
	switch {
	case apierrors.IsForbidden(err):
		return AcquireForbidden, true
	case apierrors.IsNotFound(err):
		ns := errors.As(err, &status) && status.Status().Details != nil && status.Status().Details.Kind == "namespaces"
		return AcquireNotFound, ns
	case apierrors.IsInvalid(err), apierrors.IsBadRequest(err):
		return AcquireInvalid, true
	case apierrors.IsConflict(err), apierrors.IsAlreadyExists(err):
		return AcquireConflict, false
	case apierrors.IsUnauthorized(err):
		return AcquireUnauthorized, false
	case apierrors.IsTooManyRequests(err):
		return AcquireThrottled, false
	case apierrors.IsTimeout(err), apierrors.IsServerTimeout(err), errors.Is(err, context.DeadlineExceeded):
		return AcquireTimeout, false
	case apierrors.IsServiceUnavailable(err), apierrors.IsInternalError(err), utilnet.IsConnectionRefused(err), utilnet.IsConnectionReset(err):
		return AcquireUnavailable, false
	}
	return AcquireOther, false
}
