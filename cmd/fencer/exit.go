package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"syscall"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/fencer-dev/fencer/client"
	"github.com/fencer-dev/fencer/etcdstore"
	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
	"github.com/fencer-dev/fencer/token"
)

// Exit codes of fencer. docs/cli.md lists the same table, and
// exitCodesHelp shows it in "fencer --help".
const (
	exitOK           = 0
	exitError        = 1 // anything not classified below
	exitUsage        = 2
	exitNotFound     = 3
	exitStale        = 4
	exitHeld         = 5
	exitDenied       = 6
	exitUnavailable  = 7
	exitForeign      = 8
	exitLeaseLost    = 9
	exitWatchdogLost = 10 // acquire: the watchdog died while CMD ran
	exitCannotExec   = 126
	exitNoCommand    = 127
)

const exitCodesHelp = `Exit codes:
  0    success
  1    any other error
  2    usage: bad flags, arguments, input or token
  3    not found: no such key (get), the session is gone (watch, acquire),
       no such ring (ring)
  4    stale: the token is no longer current (check, put, delete, txn, advance)
  5    held: another holder holds the lease (acquire --wait=false, --wait-timeout)
       as the server said when the wait ended; a ring with other shards, or a
       member name taken (ring)
  6    permission denied: credentials refused, or not allowed to use the name
  7    unavailable: the server (or its etcd) could not be reached in time,
       or for --reconnect-timeout (acquire, watch); a write may or may not
       have committed, unless its etcd was out of space (NOSPACE): then
       nothing was written
  8    foreign lease: the key or resource belongs to another lease (see --take-over)
  9    lease lost while CMD ran (acquire), or membership lost (ring join):
       CMD was stopped
  10   the watchdog died while CMD ran (acquire): CMD was killed, the lease released
  126  CMD could not be run (acquire, ring join); 127 CMD was not found
  128+N  interrupted by signal N (130 for SIGINT), e.g. while acquire waits
  Otherwise acquire exits with CMD's status (128+N if signal N ended it).`

// usageError is a command line fencer cannot run: exit code 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, a ...any) error { return &usageError{msg: fmt.Sprintf(format, a...)} }

// exitStatus ends fencer with code and no message of its own: the status
// of acquire's CMD, or a check that answered "stale".
type exitStatus struct {
	code int
	msg  string // printed on standard error when not empty
}

func (e *exitStatus) Error() string {
	if e.msg == "" {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.msg
}

// errLeaseLost ends acquire when its lease ended while CMD ran.
var errLeaseLost = errors.New("fencer: lease lost")

// errNotFound is a key or session that does not exist.
var errNotFound = errors.New("fencer: not found")

// interruptedBy reports the signal that ended ctx (see notifyContext),
// when err is the cancellation it caused: the command was interrupted,
// and fencer exits 128+N, like a shell, rather than 1.
func interruptedBy(ctx context.Context, err error) (syscall.Signal, bool) {
	var se *signalError
	if !errors.As(context.Cause(ctx), &se) || !(errors.Is(err, context.Canceled) || status.Code(err) == codes.Canceled) {
		return 0, false
	}
	return se.sig, true
}

// failure is what fencer says about err, and the exit code it ends with.
type failure struct {
	code int
	msg  string
}

// describe is the one place where fencer turns an error into an exit code
// and a message for people: the client's typed errors (token.*Error,
// etcdstore's and client's sentinels) and the gRPC codes of errors that
// carry none. Messages say what to do next and never quote transport
// text. server names the address dialled, tls whether TLS was on.
func describe(err error, server string, tls bool) failure {
	var (
		use       *usageError
		exit      *exitStatus
		stale     *token.StaleError
		held      *token.HeldError
		delay     *token.LockDelayError
		foreign   *token.ForeignLeaseError
		malformed *token.MalformedError
		arg       *etcdstore.ArgumentError
		nested    *etcdstore.NestedPrefixError
	)
	switch {
	case err == nil:
		return failure{code: exitOK}
	case errors.As(err, &use):
		return failure{exitUsage, use.msg}
	case errors.As(err, &exit):
		return failure{exit.code, exit.msg}
	case errors.Is(err, errLeaseLost):
		return failure{exitLeaseLost, err.Error()}
	case errors.Is(err, errNotFound):
		return failure{exitNotFound, err.Error()}
	case errors.As(err, &stale):
		msg := fmt.Sprintf("stale token: %s is no longer current", stale.Token)
		if !stale.Newer.IsZero() {
			msg = fmt.Sprintf("stale token: %s is superseded by %s", stale.Token, stale.Newer)
		}
		return failure{exitStale, msg + "; nothing was written (acquire the lease again for a current token)"}
	case errors.As(err, &held):
		msg := fmt.Sprintf("lease %q is held by another holder", held.Lease)
		if held.Holder != "" {
			msg = fmt.Sprintf("lease %q is held by %s", held.Lease, held.Holder)
		}
		return failure{exitHeld, msg}
	case errors.As(err, &delay):
		return failure{exitHeld, delay.Explain()}
	case errors.As(err, &foreign):
		return failure{exitForeign, fmt.Sprintf("foreign lease: the key belongs to lease %q, not %q; nothing was written (--take-over takes it over)", foreign.Got, foreign.Want)}
	case errors.As(err, &malformed):
		return failure{exitUsage, fmt.Sprintf("malformed token: %s %q: %s (a token looks like v1:EPOCH:REVISION:LEASE)", malformed.Field, malformed.Input, malformed.Reason)}
	case errors.As(err, &arg):
		return failure{exitUsage, fmt.Sprintf("invalid %s %q: %s", arg.Arg, arg.Value, arg.Reason)}
	case errors.As(err, &nested):
		return failure{exitError, fmt.Sprintf("--prefix %q lies inside the key space of the deployment with prefix %q in the same etcd; prefixes of deployments sharing an etcd must not be nested", nested.Prefix, nested.Outer)}
	case errors.Is(err, etcdstore.ErrSessionExpired):
		return failure{exitNotFound, "the session has expired or was closed"}
	case errors.Is(err, token.ErrNotHeld):
		return failure{exitStale, "the lease is not held (acquire it again)"}
	case errors.Is(err, client.ErrRingNotFound):
		return failure{exitNotFound, "ring not found: create it first (fencer ring create NAME --shards N)"}
	case errors.Is(err, client.ErrRingRejoined):
		return failure{exitHeld, "the member joined the ring again through another process or connection with the same session"}
	case errors.Is(err, client.ErrRingConflict):
		return failure{exitHeld, "ring conflict: the ring exists with other shards, or the member name is taken by another session (choose another --member, or wait for its session to end)"}
	case errors.Is(err, client.ErrNotLosing):
		return failure{exitError, "the shard is not being handed off, so it was not released"}
	case errors.Is(err, client.ErrUnauthenticated):
		return failure{exitDenied, fmt.Sprintf("fencer at %s refused the credentials: set --auth-token-file (FENCER_AUTH_TOKEN_FILE, or the token in FENCER_AUTH_TOKEN), or --tls-cert and --tls-key", server)}
	case errors.Is(err, client.ErrPermissionDenied):
		return failure{exitDenied, fmt.Sprintf("permission denied by fencer at %s: these credentials may not use that name (see the server's --authz-file)", server)}
	}
	code := status.Code(err)
	switch {
	case code == codes.Unavailable && client.Reason(err) == fencerv1.ErrorReason_ERROR_REASON_STORE_UNAVAILABLE && client.Cause(err) == "no_space":
		return failure{exitUnavailable, fmt.Sprintf("the etcd of fencer at %s is out of space (NOSPACE) and refuses writes; nothing was written; retry later (an embedded etcd frees space by itself, an external one needs its operator: see \"Out of space\" in docs/operations.md)", server)}
	case code == codes.Unavailable && client.Reason(err) == fencerv1.ErrorReason_ERROR_REASON_STORE_UNAVAILABLE:
		return failure{exitUnavailable, fmt.Sprintf("fencer at %s cannot reach its etcd; retry later (a write that failed so may or may not have committed)", server)}
	case code == codes.Unavailable && client.Reason(err) == fencerv1.ErrorReason_ERROR_REASON_SHUTTING_DOWN:
		return failure{exitUnavailable, fmt.Sprintf("fencer at %s is shutting down; retry, or set --server to another", server)}
	case code == codes.Unavailable:
		hint := "if it serves TLS, set --tls-ca (FENCER_TLS_CA)"
		if tls {
			hint = "check --tls-ca, --tls-cert and --tls-key (FENCER_TLS_CA, FENCER_TLS_CERT, FENCER_TLS_KEY)"
		}
		return failure{exitUnavailable, fmt.Sprintf("cannot reach fencer at %s: is `fencer serve` running? set --server or FENCER_SERVER; %s", server, hint)}
	case code == codes.DeadlineExceeded, errors.Is(err, context.DeadlineExceeded):
		return failure{exitUnavailable, fmt.Sprintf("fencer at %s did not answer in time (raise --timeout or FENCER_TIMEOUT)", server)}
	case code == codes.PermissionDenied:
		return failure{exitDenied, fmt.Sprintf("permission denied by fencer at %s", server)}
	case code == codes.Unauthenticated:
		return failure{exitDenied, fmt.Sprintf("fencer at %s refused the credentials", server)}
	case code == codes.NotFound:
		return failure{exitNotFound, "not found"}
	case code == codes.InvalidArgument:
		return failure{exitUsage, "the server refused the request as invalid"}
	case code == codes.Canceled, errors.Is(err, context.Canceled):
		return failure{exitError, "interrupted"}
	}
	if _, ok := status.FromError(err); ok && code != codes.Unknown {
		return failure{exitError, fmt.Sprintf("fencer at %s failed the call (%s)", server, strings.ToLower(code.String()))}
	}
	return failure{exitError, err.Error()}
}
