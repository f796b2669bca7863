package server

import (
	"context"
	"crypto/sha256"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"

	"github.com/fsnotify/fsnotify"
)

// followedFile is a file that is loaded again on every change in its
// directory while Start runs (a rename over it, a Kubernetes Secret's
// symlink swap). A file that does not load is logged and ignored, so what
// was last loaded stays in force.
type followedFile struct {
	path string
	what string // "token file", "client CA", for errors and logs
	log  *slog.Logger
	// load parses raw and puts it in force, or returns an error and
	// changes nothing; it returns attributes for the reload's log record.
	load func(raw []byte) ([]any, error)

	mu     sync.Mutex // serializes reloads
	hash   [sha256.Size]byte
	loaded bool
}

func newFollowedFile(path, what string, log *slog.Logger, load func([]byte) ([]any, error)) *followedFile {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &followedFile{path: path, what: what, log: log, load: load}
}

// Reload reads the file again and, if it differs from what is in force
// and loads, puts it in force. It reports whether it changed. On an
// error what is in force stays.
func (f *followedFile) Reload() (bool, error) {
	changed, _, err := f.reload()
	return changed, err
}

func (f *followedFile) reload() (bool, []any, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	raw, err := os.ReadFile(f.path)
	if err != nil {
		return false, nil, fmt.Errorf("server: %s: %w", f.what, err)
	}
	h := sha256.Sum256(raw)
	if f.loaded && h == f.hash {
		return false, nil, nil
	}
	attrs, err := f.load(raw)
	if err != nil {
		return false, nil, err
	}
	f.hash, f.loaded = h, true
	return true, attrs, nil
}

// Start follows the file until ctx ends, reloading it on every change in
// its directory, and returns nil then. It fails if the directory cannot
// be watched.
func (f *followedFile) Start(ctx context.Context) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("server: %s: watch: %w", f.what, err)
	}
	defer w.Close()
	if err := w.Add(filepath.Dir(f.path)); err != nil {
		return fmt.Errorf("server: %s: watch: %w", f.what, err)
	}
	// A change between the first load and Add would otherwise be missed.
	f.follow()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-w.Events:
			f.follow()
		case err := <-w.Errors:
			f.log.Warn(f.what+": watch error", "path", f.path, "err", err)
		}
	}
}

func (f *followedFile) follow() {
	changed, attrs, err := f.reload()
	switch {
	case err != nil:
		f.log.Error(f.what+": reload failed; the previous one stays in force", "path", f.path, "err", err)
	case changed:
		f.log.Info(f.what+": reloaded", append([]any{"path", f.path}, attrs...)...)
	}
}
