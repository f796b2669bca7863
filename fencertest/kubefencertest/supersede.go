package kubefencertest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"

	"github.com/fencer-dev/fencer/fencertest"
	"github.com/fencer-dev/fencer/kubeadapter"
	"github.com/fencer-dev/fencer/token"
)

// Superseder is the configured identity of the holder Supersede installs;
// its holderIdentity is Superseder, "_" and a random nonce, as an
// Elector's would be.
const Superseder = "fencertest-superseder"

// Taken is the acquisition Supersede made. It is a kubeadapter.Holder:
// write with it (kubeadapter.NewClient) to make objects carry the newer
// token. Nothing renews it, so it is held in the Lease until the Lease's
// leaseDurationSeconds have passed without a change, when an Elector may
// take the Lease over.
type Taken struct {
	tok      token.Token
	identity string
}

var _ kubeadapter.Holder = (*Taken)(nil)

// Token returns the token of the takeover.
func (t *Taken) Token() token.Token { return t.tok }

// Context returns a context that is never done: Taken does not watch the
// Lease, so it never learns of a loss.
func (t *Taken) Context() context.Context { return context.Background() }

// Err returns nil: Taken does not watch the Lease, so it never learns of a
// loss.
func (t *Taken) Err() error { return nil }

// Identity returns the holderIdentity the takeover wrote.
func (t *Taken) Identity() string { return t.identity }

// Supersede makes another identity take over, at once, the Lease that h
// holds, through cfg: one Update, conditional on the Lease's
// resourceVersion (retried on a conflict, such as h's own renewal), that
// names a new holder and increments leaseTransitions, as an Elector's
// takeover does, without waiting for the Lease to expire. It returns the
// new holder's acquisition.
//
// When Supersede returns, the Lease is no longer h's:
//   - h's Done fires when h notices: at once with a Watcher in h's
//     kubeadapter.Config, otherwise at h's next renewal (RetryPeriod).
//     Supersede does not wait for it.
//   - Kubernetes objects are fenced per object: a fenced write of h's to an
//     object that the returned holder has written (through
//     kubeadapter.NewClient) fails with token.ErrStale, and so does any write
//     carrying h's stamp where the admission policy is installed. An object
//     the new holder has not touched can still be written with h's token
//     until h notices; after that h's fenced writes fail with
//     token.ErrNotHeld.
//
// Supersede fails t if cfg's user may not read or update the Lease, or if
// the Lease no longer carries h's acquisition (its leaseTransitions moved).
func Supersede(t fencertest.TB, cfg *rest.Config, h kubeadapter.Holder) *Taken {
	t.Helper()
	tok := h.Token()
	namespace, name, ok := strings.Cut(tok.Lease, "/")
	if !ok {
		t.Fatalf("kubefencertest: supersede %s: not a Kubernetes Lease", tok)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatalf("kubefencertest: client: %v", err)
	}
	leases := cs.CoordinationV1().Leases(namespace)
	taken := &Taken{identity: Superseder + "_" + nonce()}
	ctx, cancel := context.WithTimeout(context.Background(), fencertest.Timeout)
	defer cancel()
	var stale bool
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		l, err := leases.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		transitions := int32(0)
		if l.Spec.LeaseTransitions != nil {
			transitions = *l.Spec.LeaseTransitions
		}
		if uint64(transitions) != tok.Epoch {
			stale = true
			return nil
		}
		now := metav1.NewMicroTime(time.Now())
		transitions++
		l.Spec.HolderIdentity = &taken.identity
		l.Spec.LeaseTransitions = &transitions
		l.Spec.AcquireTime, l.Spec.RenewTime = &now, &now
		got, err := leases.Update(ctx, l, metav1.UpdateOptions{})
		if err != nil {
			return err
		}
		taken.tok, err = kubeadapter.TokenOf(got)
		return err
	})
	switch {
	case err != nil:
		t.Fatalf("kubefencertest: supersede %s: %v", tok, err)
	case stale:
		t.Fatalf("kubefencertest: supersede %s: the Lease no longer carries that acquisition", tok)
	}
	return taken
}

// nonce returns 8 random hex digits.
func nonce() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return hex.EncodeToString(b)
}
