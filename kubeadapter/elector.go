package kubeadapter

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/utils/clock"
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
// to FenceLabelValue on the Lease, so that the live-Lease admission policy
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
	return e, nil
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
			ObjectMeta: metav1.ObjectMeta{Namespace: e.cfg.Namespace, Name: e.cfg.Name, Labels: fenceLabels(nil)},
			Spec:       acquiredSpec(nil, e.identity, e.cfg.LeaseDuration, start),
		}, metav1.CreateOptions{})
		if err != nil {
			return nil, fmt.Errorf("kubeadapter: acquire %s: create: %w", e.Lease(), err)
		}
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
	next.Labels = fenceLabels(cur.Labels)
	start := e.clock.Now()
	next.Spec = acquiredSpec(&cur.Spec, e.identity, e.cfg.LeaseDuration, start)
	got, err = leases.Update(ctx, next, metav1.UpdateOptions{})
	if err != nil {
		return nil, fmt.Errorf("kubeadapter: acquire %s: update: %w", e.Lease(), err)
	}
	return e.start(ctx, got, start)
}

// Acquire calls TryAcquire every RetryPeriod, with jitter, until it
// acquires the Lease or ctx is done, in which case it returns ctx's error
// wrapped with the last attempt's. It returns ErrAlreadyHeld at once.
// ctx bounds only the acquisition: the returned Held lasts until Release or
// until the lease is lost.
func (e *Elector) Acquire(ctx context.Context) (*Held, error) {
	for {
		h, err := e.TryAcquire(ctx)
		if err == nil || errors.Is(err, ErrAlreadyHeld) {
			return h, err
		}
		t := e.clock.NewTimer(wait.Jitter(e.cfg.RetryPeriod, JitterFactor))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("kubeadapter: acquire %s: %w (last attempt: %v)", e.Lease(), context.Cause(ctx), err)
		case <-t.C():
		}
	}
}
