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
// was last loaded stays in force. A failure is logged once per change of
// the file: events that leave it as it was (another file written in the
// directory, such as the server's own log) read it again but neither
// parse nor log it again.
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
	// failedOn is what the last reload failed on, if it failed since the
	// last load: the content's digest, or the read error's text; failErr
	// is its error.
	failedOn string
	failErr  error
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
	changed, _, _, err := f.reload()
	return changed, err
}

// reload is Reload that also returns the reload's log attributes, and
// whether its error repeats the last reload's for a file that has not
// changed since.
func (f *followedFile) reload() (changed bool, attrs []any, repeated bool, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	raw, err := os.ReadFile(f.path)
	if err != nil {
		err = fmt.Errorf("%s: %w", f.what, err)
		return false, nil, f.failed(err.Error(), err), err
	}
	h := sha256.Sum256(raw)
	if f.loaded && h == f.hash {
		f.failedOn, f.failErr = "", nil
		return false, nil, false, nil
	}
	if f.failErr != nil && f.failedOn == string(h[:]) {
		return false, nil, true, f.failErr
	}
	if attrs, err = f.load(raw); err != nil {
		return false, nil, f.failed(string(h[:]), err), err
	}
	f.hash, f.loaded = h, true
	f.failedOn, f.failErr = "", nil
	return true, attrs, false, nil
}

// failed records that a reload failed on what (see failedOn) with err,
// and reports whether the last one failed on it too.
func (f *followedFile) failed(what string, err error) bool {
	repeated := f.failErr != nil && f.failedOn == what
	f.failedOn, f.failErr = what, err
	return repeated
}

// Start follows the file until ctx ends, reloading it on every change in
// its directory, and returns nil then. It fails if the directory cannot
// be watched.
func (f *followedFile) Start(ctx context.Context) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("%s: watch: %w", f.what, err)
	}
	defer w.Close()
	if err := w.Add(filepath.Dir(f.path)); err != nil {
		return fmt.Errorf("%s: watch: %w", f.what, err)
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
	changed, attrs, repeated, err := f.reload()
	switch {
	case repeated:
	case err != nil:
		f.log.Error(f.what+": reload failed; the previous one stays in force", "path", f.path, "err", err)
	case changed:
		f.log.Info(f.what+": reloaded", append([]any{"path", f.path}, attrs...)...)
	}
}
