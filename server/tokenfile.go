package server

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"sync"
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

	mu      sync.Mutex
	streams map[*validStream]bool // the open streams, checked on every reload
}

// tokenGeneration is one load of the token file.
type tokenGeneration struct {
	tokens *BearerTokens
}

// validStream is a stream authenticated as principal: cancel ends its
// context (valid) when its token no longer authenticates principal.
type validStream struct {
	valid     context.Context
	principal string
	cancel    context.CancelCauseFunc
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
		g := &tokenGeneration{tokens: b}
		f.cur.Store(g)
		f.mu.Lock()
		for v := range f.streams {
			v.check(g)
		}
		f.mu.Unlock()
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
// stop when the call ends. It starts no goroutine: each reload checks the
// open streams (reloads are serialized, and each stores its tokens before
// it checks). A stream registers before it checks the tokens in force, so
// a reload either finds it registered or stored its tokens before that
// check.
func (f *TokenFile) whileValid(ctx context.Context, principal string) (valid context.Context, stop func()) {
	valid, cancel := context.WithCancelCause(ctx)
	v := &validStream{valid: valid, principal: principal, cancel: cancel}
	f.mu.Lock()
	if f.streams == nil {
		f.streams = map[*validStream]bool{}
	}
	f.streams[v] = true
	f.mu.Unlock()
	v.check(f.cur.Load())
	return valid, func() {
		f.mu.Lock()
		delete(f.streams, v)
		f.mu.Unlock()
		cancel(context.Canceled)
	}
}

// check ends v's context if g's tokens no longer authenticate its call as
// its principal.
func (v *validStream) check(g *tokenGeneration) {
	if p, err := g.tokens.Authenticate(v.valid); err != nil || p != v.principal {
		v.cancel(fmt.Errorf("%w: the bearer token was removed from the token file", ErrUnauthenticated))
	}
}
