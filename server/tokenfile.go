package server

import (
	"bytes"
	"context"
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
// Calls already authenticated are not revisited: a session opened with a
// token that is later removed stays its principal's.
type TokenFile struct {
	*followedFile
	cur atomic.Pointer[BearerTokens]
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
		f.cur.Store(b)
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
	return f.cur.Load().Authenticate(ctx)
}
