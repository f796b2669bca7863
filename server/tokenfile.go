package server

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
)

// TokenFile authenticates calls by bearer token, like BearerTokens, from a
// token file (see LoadTokenFile) that it reloads while Start runs: a
// rotated file takes effect without a restart, so the old tokens are
// refused and the new ones accepted from the reload on. It watches the
// file's directory, so a file replaced by a rename or by a Kubernetes
// Secret's symlink swap is seen too. A file that no longer loads (a
// half-written edit, a bad line) is logged and ignored: the tokens last
// loaded stay in force until a good file arrives.
//
// A server's streams authenticated by a token (KeepAlive, WatchLease) are
// checked again on every reload: one whose token the new file no longer
// holds, or gives to another principal, ends with UNAUTHENTICATED, so a
// session renewed only by it expires after its TTL. Finished calls are not
// revisited: a session opened with a token that is later removed stays its
// principal's, and a new token of that principal may renew it.
type TokenFile struct {
	*followedFile
	cur atomic.Pointer[tokenGeneration]
}

// tokenGeneration is one load of the token file; replaced is closed when
// the next load takes its place.
type tokenGeneration struct {
	tokens   *BearerTokens
	replaced chan struct{}
}

var _ Authenticator = (*TokenFile)(nil)

// NewTokenFile loads the token file at path. log receives reload records;
// nil discards them. Call Start to follow the file's changes; Reload
// reads it again at once.
func NewTokenFile(path string, log *slog.Logger) (*TokenFile, error) {
	f := &TokenFile{}
	f.followedFile = newFollowedFile(path, "token file", log, func(raw []byte) ([]any, error) {
		b, err := parseTokenFile(path, bytes.NewReader(raw))
		if err != nil {
			return nil, err
		}
		if old := f.cur.Swap(&tokenGeneration{tokens: b, replaced: make(chan struct{})}); old != nil {
			close(old.replaced)
		}
		return []any{"tokens", len(b.principals)}, nil
	})
	if _, err := f.Reload(); err != nil {
		return nil, err
	}
	return f, nil
}

// Authenticate returns the principal of the call's bearer token in the
// tokens last loaded.
func (f *TokenFile) Authenticate(ctx context.Context) (string, error) {
	return f.cur.Load().tokens.Authenticate(ctx)
}

// whileValid returns ctx until a reload leaves the call's token no longer
// principal's: then it is cancelled with an ErrUnauthenticated cause. Call
// stop when the call ends.
func (f *TokenFile) whileValid(ctx context.Context, principal string) (valid context.Context, stop func()) {
	valid, cancel := context.WithCancelCause(ctx)
	go func() {
		for {
			g := f.cur.Load()
			if p, err := g.tokens.Authenticate(valid); err != nil || p != principal {
				cancel(fmt.Errorf("%w: the bearer token was removed from the token file", ErrUnauthenticated))
				return
			}
			select {
			case <-valid.Done():
				return
			case <-g.replaced:
			}
		}
	}()
	return valid, func() { cancel(context.Canceled) }
}
