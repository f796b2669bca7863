package server

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"

	"github.com/fsnotify/fsnotify"
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
	path string
	log  *slog.Logger
	cur  atomic.Pointer[BearerTokens]

	mu   sync.Mutex // serializes reloads
	hash [sha256.Size]byte
}

var _ Authenticator = (*TokenFile)(nil)

// NewTokenFile loads the token file at path. log receives reload records;
// nil discards them. Call Start to follow the file's changes.
func NewTokenFile(path string, log *slog.Logger) (*TokenFile, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	f := &TokenFile{path: path, log: log}
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

// Reload reads the file again and, if it loads and differs from the
// tokens in force, puts its tokens in force. It reports whether they
// changed. On an error the tokens in force stay.
func (f *TokenFile) Reload() (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	raw, err := os.ReadFile(f.path)
	if err != nil {
		return false, fmt.Errorf("server: token file: %w", err)
	}
	h := sha256.Sum256(raw)
	if f.cur.Load() != nil && h == f.hash {
		return false, nil
	}
	b, err := parseTokenFile(f.path, bytes.NewReader(raw))
	if err != nil {
		return false, err
	}
	f.cur.Store(b)
	f.hash = h
	return true, nil
}

// Start follows the file until ctx ends, reloading it on every change in
// its directory, and returns nil then. It fails if the directory cannot
// be watched.
func (f *TokenFile) Start(ctx context.Context) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("server: token file: watch: %w", err)
	}
	defer w.Close()
	if err := w.Add(filepath.Dir(f.path)); err != nil {
		return fmt.Errorf("server: token file: watch: %w", err)
	}
	// A change between NewTokenFile and Add would otherwise be missed.
	f.reload()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-w.Events:
			f.reload()
		case err := <-w.Errors:
			f.log.Warn("token file: watch error", "path", f.path, "err", err)
		}
	}
}

func (f *TokenFile) reload() {
	changed, err := f.Reload()
	switch {
	case err != nil:
		f.log.Error("token file: reload failed; the previous tokens stay in force", "path", f.path, "err", err)
	case changed:
		f.log.Info("token file: reloaded", "path", f.path, "tokens", len(f.cur.Load().principals))
	}
}
