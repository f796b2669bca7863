// Package acquireon gives package server the etcd store's acquisition of
// a lease on an etcd lease that the caller grants and keeps alive itself,
// as fencer's service does for its remote sessions. It is plumbing, not
// part of etcdstore's API: applications acquire through etcdstore's
// Session, which keeps its etcd lease alive and watches its leases.
//
// acquireon imports token and etcd's client only: no etcd server code, no
// Kubernetes module and no other fencer package (internal/layout enforces
// it).
package acquireon

import (
	"context"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencer-dev/fencer/token"
)

// TryAcquireOn acquires lease name of store (an *etcdstore.Store) for
// holder on etcd lease id, with lockDelay as the acquisition's lock-delay
// (etcdstore.WithLockDelay). cond are further compares that must hold in
// the acquiring Txn (for example, that id belongs to the caller); if they
// fail, nothing is written and etcdstore.ErrCondition is returned. It
// returns a *token.HeldError, with the revision it was seen at, when the
// lease is held, and a *token.LockDelayError, with the revision too, when
// it is free but in its lock-delay; wait with Store.WaitFree from that
// revision. Nothing watches a lease acquired this way: the caller
// detects its loss.
//
// Package etcdstore sets it when it is initialized; store is typed any
// because this package cannot import etcdstore, which imports it.
var TryAcquireOn func(ctx context.Context, store any, id clientv3.LeaseID, holder, name string, lockDelay time.Duration, cond ...clientv3.Cmp) (tok token.Token, heldAt int64, err error)
