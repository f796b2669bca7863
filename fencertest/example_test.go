package fencertest_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/fencer-dev/fencer/etcdstore"
	"github.com/fencer-dev/fencer/fencertest"
	"github.com/fencer-dev/fencer/token"
)

// reconciler writes the desired state of "orders" with the token of the
// lease it holds, and stops for good once a write is refused as stale.
type reconciler struct {
	st      *etcdstore.Store
	lease   *etcdstore.Lease
	stopped bool
}

// reconcile makes one guarded write. It reports the stale error to its
// caller and stops the reconciler, since another replica now owns the work.
func (r *reconciler) reconcile(ctx context.Context, total string) error {
	if r.stopped {
		return nil
	}
	_, err := r.st.Put(ctx, r.lease.Token(), "orders/total", []byte(total))
	if errors.Is(err, token.ErrStale) {
		r.stopped = true
	}
	return err
}

// A controller is superseded between two reconciles: the second write is
// refused by etcd, the controller sees token.ErrStale and stops, and the
// new holder's state stands.
func Example_supersededController() {
	t := &exampleT{} // in a test, the test's *testing.T
	defer t.cleanup()
	ctx := context.Background()

	st := fencertest.Store(t)
	lease, _ := fencertest.Session(t, st).Acquire(ctx, "orders")
	r := &reconciler{st: st, lease: lease}
	fmt.Println("first reconcile:", r.reconcile(ctx, "100"))

	newer := fencertest.Supersede(t, st, lease)
	_, _ = st.Put(ctx, newer.Token(), "orders/total", []byte("250"))

	err := r.reconcile(ctx, "999")
	fmt.Println("second reconcile is stale:", errors.Is(err, token.ErrStale))
	fmt.Println("stopped:", r.stopped)
	v, _, _ := st.Get(ctx, "orders/total")
	fmt.Println("orders/total:", string(v.Data))
	// Output:
	// first reconcile: <nil>
	// second reconcile is stale: true
	// stopped: true
	// orders/total: 250
}

// A client of the gRPC service loses its lease to another holder: its
// Done fires, its Err says why, and its writes are stale.
func Example_serviceClient() {
	t := &exampleT{} // in a test, the test's *testing.T
	defer t.cleanup()
	ctx := context.Background()

	svc := fencertest.Service(t, fencertest.WithBearerToken("alice"))
	sess, _ := svc.Client.NewSession()
	defer sess.Close(ctx)
	lease, _ := sess.Acquire(ctx, "orders")

	fencertest.Supersede(t, svc.Store, lease)
	<-lease.Done()
	fmt.Println("lost:", errors.Is(lease.Err(), etcdstore.ErrLeaseLost))
	_, err := svc.Client.Put(ctx, lease.Token(), "orders/total", []byte("999"))
	fmt.Println("put is stale:", errors.Is(err, token.ErrStale))
	// Output:
	// lost: true
	// put is stale: true
}

// A table over a sequencer: each step advances the resource "printer"
// with the token of one acquisition. Advance takes only its lease's
// current token, and never one lower than the token recorded, so once
// first is superseded its token is refused even before anything was
// recorded, while second's passes, and passes again on a retry.
func Example_advanceTable() {
	t := &exampleT{} // in a test, the test's *testing.T
	defer t.cleanup()
	ctx := context.Background()

	st := fencertest.Store(t)
	sess := fencertest.Session(t, st)
	first, _ := sess.Acquire(ctx, "printer")
	second := fencertest.Supersede(t, st, first)

	for _, step := range []struct {
		name string
		tok  token.Token
	}{
		{"first", first.Token()}, // no longer current: stale, though nothing is recorded yet
		{"second", second.Token()},
		{"first, late", first.Token()},
		{"second, again", second.Token()}, // an equal token passes again
	} {
		err := st.Advance(ctx, "printer", step.tok)
		fmt.Printf("%-14s stale=%t\n", step.name+":", errors.Is(err, token.ErrStale))
	}
	// Output:
	// first:         stale=true
	// second:        stale=false
	// first, late:   stale=true
	// second, again: stale=false
}
