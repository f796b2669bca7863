package fenced

import (
	"context"
	"errors"
	"fmt"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/fencer-dev/fencer/internal/mutant"
	"github.com/fencer-dev/fencer/token"
)

// engine is the one body of every fenced write: Client's Update, Patch,
// Apply and Delete, the status writer's Update and Patch, UpdateFenced
// and DeleteFenced. Each attempt
//
//  1. reads the object itself (read), never trusting the caller's copy,
//     and, when the caller asked for a resourceVersion (want), makes sure
//     the version read is that one;
//  2. checks the stamp of that very version with token.CheckStamp;
//  3. hands the token and the version checked to the path's write, which
//     stamps over the version's protocol annotations (token.Restamp) and
//     writes conditionally on version(cur), its resourceVersion;
//  4. on a Conflict, retries from a fresh live read (retry), unless the
//     write is pinned to the caller's version: then the conflict is
//     returned, or the *token.StaleError a fresh read shows
//     (conflictOrStale).
//
// A path differs from another only in what it reads with, what it sends,
// and what it does with an absent object (an apply creates it).
type engine[T metav1.Object] struct {
	holder Holder
	opts   options
	// read reads the object: through the API reader when live, else
	// through the first reader.
	read func(ctx context.Context, live bool) (T, error)
	// want is the resourceVersion the caller asked for, or "".
	want string
	// pinned says that conflicts are the caller's to handle: they are not
	// retried but classified (conflictOrStale).
	pinned bool
	// caller is the caller's own object, or nil when there is none
	// (UpdateFenced, DeleteFenced). It names the object in a pinned
	// conflict; its stamp and version are never trusted (only the mutant
	// kube-trust-caller-marks does, to show that tests catch it).
	caller runtime.Object
	// absent, when set, is called for an object that is not found, also
	// through the API reader, with the read's error; its result is the
	// attempt's. Without it, not found is an error like any other.
	absent func(ctx context.Context, tok token.Token, err error) (bool, error)
}

// writeFunc is a path's write over cur, the version read and checked with
// tok. retryable says whether a Conflict it returns may be retried (or,
// when pinned, classified); false returns its error as it is.
type writeFunc[T metav1.Object] func(ctx context.Context, tok token.Token, cur T) (retryable bool, err error)

// run runs the fenced write until it succeeds, fails with anything but a
// retryable conflict, the holder stops holding the lease, ctx is done or
// the attempts run out.
func (e *engine[T]) run(ctx context.Context, write writeFunc[T]) error {
	return retry(ctx, e.holder, e.opts.maxAttempts, func(ctx context.Context, first bool) (bool, error) {
		tok, cur, err := e.readChecked(ctx, first)
		if e.absent != nil && apierrors.IsNotFound(err) {
			if first && !e.opts.liveRead {
				tok, cur, err = e.readChecked(ctx, false)
			}
			if apierrors.IsNotFound(err) {
				return e.absent(ctx, tok, err)
			}
		}
		if err != nil {
			return false, err
		}
		retryable, err := write(ctx, tok, cur)
		if retryable && e.pinned && apierrors.IsConflict(err) {
			return false, e.conflictOrStale(ctx, tok, err)
		}
		return retryable, err
	})
}

// readChecked returns the holder's token and the object, read and
// checked: its stamp is one the holder may overwrite. The first attempt
// reads through the first reader, later ones (and every one with
// WithLiveRead) through the API reader. When want is set, the object must
// be at that resourceVersion: a first read at another version is repeated
// live, and if that is not at want either, readChecked fails with a
// Conflict error (or the check's refusal, when the current version carries
// a stamp the holder may not overwrite). An object without a
// resourceVersion is refused, since no write could be conditional on it.
func (e *engine[T]) readChecked(ctx context.Context, first bool) (token.Token, T, error) {
	var zero T
	tok, err := heldToken(e.holder)
	if err != nil {
		return tok, zero, err
	}
	live := !first || e.opts.liveRead
	cur, err := e.read(ctx, live)
	if err == nil && e.want != "" && cur.GetResourceVersion() != e.want && !live {
		cur, err = e.read(ctx, true)
	}
	if err != nil {
		return tok, zero, err
	}
	if mutant.On(mutant.KubeTrustCallerMarks) && e.caller != nil {
		if c, ok := e.caller.DeepCopyObject().(T); ok && c.GetResourceVersion() != "" {
			cur = c
		}
	}
	if cur.GetResourceVersion() == "" {
		return tok, zero, fmt.Errorf("%w: the object read has no resourceVersion to write conditionally on", ErrUnsupported)
	}
	if err := token.CheckStamp(tok, cur.GetAnnotations(), e.opts.takeover); err != nil {
		return tok, zero, err
	}
	if e.want != "" && cur.GetResourceVersion() != e.want {
		return tok, zero, e.pinnedConflict(fmt.Sprintf("resourceVersion %s was asked for, the object is at %s", e.want, cur.GetResourceVersion()))
	}
	return tok, cur, nil
}

// version is the resourceVersion a write over cur is conditional on:
// cur's own, the version checked (or the holder's stamping write after
// it).
func (e *engine[T]) version(cur metav1.Object) string {
	if mutant.On(mutant.KubeTrustCallerVersion) {
		return e.want
	}
	return cur.GetResourceVersion()
}

// restamp returns the annotations a write over cur sends: own's, except
// the protocol keys, which are cur's stamped with tok (token.Restamp), so a
// caller's object can neither lower nor drop a stamp. Neither map is
// written to, so maps shared with the caller or a cache are safe.
func restamp(tok token.Token, own map[string]string, cur metav1.Object) map[string]string {
	return tok.Restamp(own, cur.GetAnnotations())
}

// conflictOrStale classifies a conflict on a write that was conditional on
// the caller's own version: when a fresh live read shows a stamp the
// holder may not overwrite, it returns that refusal (such as a
// *token.StaleError), otherwise the conflict.
func (e *engine[T]) conflictOrStale(ctx context.Context, tok token.Token, conflict error) error {
	cur, err := e.read(ctx, true)
	if err != nil {
		return conflict
	}
	if err := token.CheckStamp(tok, cur.GetAnnotations(), e.opts.takeover); err != nil {
		return err
	}
	return conflict
}

// pinnedConflict is the Conflict error of a write that fencer did not send
// because the object is not at the version the caller asked for.
func (e *engine[T]) pinnedConflict(why string) error {
	var gr schema.GroupResource
	var name string
	if e.caller != nil {
		gvk := e.caller.GetObjectKind().GroupVersionKind()
		gr = schema.GroupResource{Group: gvk.Group, Resource: strings.ToLower(kindOf(e.caller))}
		if m, ok := e.caller.(metav1.Object); ok {
			name = m.GetName()
		}
	}
	return apierrors.NewConflict(gr, name, fmt.Errorf("the object has been modified: %s", why))
}

// heldToken returns h's token, or an error matching token.ErrNotHeld when
// h reports that the lease is not held.
func heldToken(h Holder) (token.Token, error) {
	if err := h.Err(); err != nil {
		if errors.Is(err, token.ErrNotHeld) {
			return token.Token{}, err
		}
		return token.Token{}, fmt.Errorf("fenced: %w: %w", token.ErrNotHeld, err)
	}
	return h.Token(), nil
}

// attemptFunc is one attempt of a fenced write. retryable says whether a
// conflict it returns may be retried after a fresh read.
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
	return fmt.Errorf("fenced: %d attempts: %w", maxAttempts, err)
}
