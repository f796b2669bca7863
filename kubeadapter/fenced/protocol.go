package fenced

import (
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fencer-dev/fencer/token"
)

// Holder is what fenced writes need from a held lease: token.Holder, the
// one lease contract of fencer. kubeadapter's *Held and kubeadapter/shard's
// *Held implement it, and so do the etcd store's and the gRPC client's
// leases, whose tokens name no
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

// stampedWith reports whether annotations carry exactly tok's lease and
// revision.
func stampedWith(annotations map[string]string, tok token.Token) bool {
	cur, ok, err := token.FromAnnotations(annotations)
	return err == nil && ok && cur.Lease == tok.Lease && cur.Revision == tok.Revision
}
