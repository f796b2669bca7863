package kubeadapter

import (
	"context"
	"errors"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fencer-dev/fencer/token"
)

// Holder is what fenced writes need from a held lease: token.Holder, the
// one lease contract of fencer. *Held and kubeadapter/shard's *Held implement it, and so
// do the etcd store's and the gRPC client's leases, whose tokens name no
// Kubernetes Lease and are refused with a *token.MalformedError. Fenced
// writes check Err before every attempt, so that a holder that knows it
// lost the lease stops retrying; their safety never depends on it.
type Holder = token.Holder

// DefaultMaxAttempts is the number of write attempts a fenced write makes
// when its writes keep conflicting, unless WithMaxAttempts says otherwise.
const DefaultMaxAttempts = 5

// Option configures fenced writes (NewClient, UpdateFenced,
// DeleteFenced).
type Option func(*options)

type options struct {
	takeover    bool
	liveRead    bool
	reader      client.Reader
	apiReader   client.Reader
	maxAttempts int
}

// WithTakeover lets fenced writes stamp objects that carry another
// lease's stamp. Without it such writes fail with *token.ForeignLeaseError.
// A takeover keeps the replaced lease's token as its high-water mark, so
// it never reorders that lease: a token of the held lease below the
// object's mark for it, and a malformed stamp, are refused even with
// takeover.
func WithTakeover() Option { return func(o *options) { o.takeover = true } }

// WithLiveRead makes Client read every object it checks through the API
// reader (WithAPIReader), never through the first reader (WithReader).
// It has no effect on UpdateFenced and DeleteFenced, which read with the
// caller's function.
func WithLiveRead() Option { return func(o *options) { o.liveRead = true } }

// WithReader sets the reader of the first read of each Client write, such
// as a manager's cache (mgr.GetClient()). The default is the inner
// client. A lagging reader cannot break fencing: every write is
// conditional on the resourceVersion of the very copy whose stamp was
// checked, so a stale copy costs a conflict and a live re-read, never a
// write.
//
// The check trusts the reader's copy to be what the API server stored at
// its resourceVersion. A reader that shares memory with the objects it
// hands out (a cache with controller-runtime's UnsafeDisableDeepCopy)
// breaks that when its objects are changed in place: when the object
// passed to a write is that memory, Client reads it live instead, but an
// object changed in the reader's memory and then copied is checked as
// changed. Never change such a reader's objects; the admission policy
// (deploy/admission) refuses a stale stamp in the API server regardless.
func WithReader(r client.Reader) Option { return func(o *options) { o.reader = r } }

// WithAPIReader sets the reader Client uses when the first read did not
// return the version a write needs: after a conflict, when the caller
// pinned a resourceVersion that the first reader did not return, and for
// every read with WithLiveRead. Pass a live reader, such as a manager's
// mgr.GetAPIReader(). The default is the inner client.
func WithAPIReader(r client.Reader) Option { return func(o *options) { o.apiReader = r } }

// WithMaxAttempts sets how many write attempts a fenced write makes when
// its writes keep conflicting. n must be at least 1.
func WithMaxAttempts(n int) Option { return func(o *options) { o.maxAttempts = n } }

func newOptions(opts []Option) (options, error) {
	o := options{maxAttempts: DefaultMaxAttempts}
	for _, opt := range opts {
		opt(&o)
	}
	if o.maxAttempts < 1 {
		return o, &ConfigError{Field: "WithMaxAttempts", Reason: "must be at least 1"}
	}
	return o, nil
}

// heldToken returns h's token, or an error matching token.ErrNotHeld when
// h reports that the lease is not held.
func heldToken(h Holder) (token.Token, error) {
	if err := h.Err(); err != nil {
		if errors.Is(err, token.ErrNotHeld) {
			return token.Token{}, err
		}
		return token.Token{}, fmt.Errorf("kubeadapter: %w: %w", token.ErrNotHeld, err)
	}
	return h.Token(), nil
}

// restamp sets on obj the annotations a fenced write sends over a version
// whose annotations are stored: obj's own, except the protocol keys,
// which are taken from stored and stamped with tok (token.Restamp). Neither
// map is written to, so maps shared with the caller or a cache are safe.
func restamp(obj metav1.Object, stored map[string]string, tok token.Token) {
	obj.SetAnnotations(tok.Restamp(obj.GetAnnotations(), stored))
}

// stampedWith reports whether annotations carry exactly tok's lease and
// revision.
func stampedWith(annotations map[string]string, tok token.Token) bool {
	cur, ok, err := token.FromAnnotations(annotations)
	return err == nil && ok && cur.Lease == tok.Lease && cur.Revision == tok.Revision
}

// attemptFunc is one attempt of a fenced write. retryable says whether a
// conflict it returns may be retried after a fresh read: it may not when
// the caller asked for a resourceVersion precondition of its own.
type attemptFunc func(ctx context.Context, first bool) (retryable bool, err error)

// retry runs attempt until it succeeds or fails with anything but a
// retryable conflict, the holder stops holding the lease, ctx is done or
// maxAttempts attempts were made.
func retry(ctx context.Context, h Holder, maxAttempts int, attempt attemptFunc) error {
	var err error
	for i := range maxAttempts {
		if _, herr := heldToken(h); herr != nil {
			if err != nil {
				return fmt.Errorf("%w (after: %v)", herr, err)
			}
			return herr
		}
		if cerr := ctx.Err(); cerr != nil {
			return cerr
		}
		var retryable bool
		retryable, err = attempt(ctx, i == 0)
		if err == nil || !retryable || !apierrors.IsConflict(err) {
			return err
		}
	}
	return fmt.Errorf("kubeadapter: %d attempts: %w", maxAttempts, err)
}

// conflictOrStale classifies a conflict on a write that was conditional on
// the caller's own resourceVersion: when a fresh read shows a stamp the
// holder may not overwrite, it returns that refusal (such as a
// *token.StaleError), otherwise the conflict.
func conflictOrStale(conflict error, check func() error) error {
	if err := check(); err != nil {
		return err
	}
	return conflict
}
