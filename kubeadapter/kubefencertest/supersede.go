package kubefencertest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"

	"github.com/fencer-dev/fencer/kubeadapter"
	"github.com/fencer-dev/fencer/token"
)

// Superseder is the configured identity of the holder Supersede installs;
// its holderIdentity is Superseder, "_" and a random nonce, as an
// Elector's would be.
const Superseder = "fencertest-superseder"

// Taken is the acquisition Supersede made. It is a kubeadapter.Holder:
// write with it (fenced.NewClient) to make objects carry the newer
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
//     fenced.NewClient) fails with token.ErrStale, and so does any write
//     carrying h's stamp where the admission policy is installed. An object
//     the new holder has not touched can still be written with h's token
//     until h notices; after that h's fenced writes fail with
//     token.ErrNotHeld.
//
// Supersede fails t, and writes nothing, if h's token is not its lease's
// current token: h reports that it ended (its Err is not nil: released,
// past its renew deadline, or superseded), or the Lease no longer carries
// h's acquisition (its leaseTransitions moved, or it names no holder since
// a release). It also fails t if cfg's user may not read or update the
// Lease. It does not compare holderIdentity with h's: a Holder does not
// expose it, and a new acquisition always moves leaseTransitions.
func Supersede(t TB, cfg *rest.Config, h kubeadapter.Holder) *Taken {
	t.Helper()
	tok := h.Token()
	namespace, name, ok := strings.Cut(tok.Lease, "/")
	if !ok {
		t.Fatalf("kubefencertest: supersede %s: not a Kubernetes Lease", tok)
	}
	cs, closeIdle, err := clientset(cfg)
	if err != nil {
		t.Fatalf("%v", err)
	}
	defer closeIdle()
	if err := h.Err(); err != nil {
		t.Fatalf("kubefencertest: supersede %s: not its lease's current token: %v", tok, err)
	}
	leases := cs.CoordinationV1().Leases(namespace)
	taken := &Taken{identity: Superseder + "_" + nonce()}
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	var notCurrent string
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		l, err := leases.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if notCurrent = acquisitionGone(&l.Spec, tok); notCurrent != "" {
			return nil
		}
		transitions := int32(tok.Epoch) + 1 // acquisitionGone checked it is the Lease's count
		now := metav1.NewMicroTime(time.Now())
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
	case notCurrent != "":
		t.Fatalf("kubefencertest: supersede %s: not its lease's current token: %s", tok, notCurrent)
	}
	return taken
}

// acquisitionGone returns why spec, a Lease as read now, no longer
// carries the acquisition of tok, or "" if it still does. Every
// acquisition of an existing Lease increments leaseTransitions, and a
// release clears holderIdentity but keeps the count, so the acquisition
// is the Lease's as long as both a holder and tok's count are there.
func acquisitionGone(spec *coordinationv1.LeaseSpec, tok token.Token) string {
	var transitions int32
	if spec.LeaseTransitions != nil {
		transitions = *spec.LeaseTransitions
	}
	switch {
	case uint64(transitions) != tok.Epoch:
		return fmt.Sprintf("leaseTransitions is %d, not %d", transitions, tok.Epoch)
	case spec.HolderIdentity == nil || *spec.HolderIdentity == "":
		return "the Lease was released"
	}
	return ""
}

// nonce returns 8 random hex digits.
func nonce() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return hex.EncodeToString(b)
}
