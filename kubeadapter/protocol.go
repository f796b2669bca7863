package kubeadapter

import (
	"context"
	"errors"
	"fmt"
	"maps"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fencer-dev/fencer/token"
)

// Holder is what fenced writes need from a held lease. *Held implements
// it.
type Holder interface {
	// Token returns the token to stamp. It must not change while the
	// Holder is held.
	Token() token.Token
	// Err returns nil while the lease is held and a non-nil error once it
	// is not. Fenced writes check it before every attempt, so that a
	// holder that knows it lost the lease stops retrying; their safety
	// never depends on it.
	Err() error
}

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
	maxAttempts int
}

// WithTakeover lets fenced writes stamp objects that carry another
// lease's stamp. Without it such writes fail with *token.ForeignLeaseError.
// A greater token of the same lease and a malformed stamp are refused
// even with takeover.
func WithTakeover() Option { return func(o *options) { o.takeover = true } }

// WithLiveRead makes Client.Update and Client.Delete always read the object
// before checking its stamp, even when the caller's object carries a
// resourceVersion. Without it they check the caller's object, trusting
// that its annotations are those it was read with. It has no effect on
// UpdateFenced and DeleteFenced, which always read.
func WithLiveRead() Option { return func(o *options) { o.liveRead = true } }

// WithReader makes Client read objects for the protocol through r, such
// as a manager's API reader, instead of through the inner client, which
// may be a cache. A stale read cannot break fencing, since every write is
// conditional on the read's resourceVersion; it only costs conflicts.
func WithReader(r client.Reader) Option { return func(o *options) { o.reader = r } }

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

// stamp sets tok's annotations on obj, over a copy of annotations, so that
// a map shared with the caller or a cache is never written to.
func stamp(obj metav1.Object, annotations map[string]string, tok token.Token) {
	obj.SetAnnotations(tok.Stamp(maps.Clone(annotations)))
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
