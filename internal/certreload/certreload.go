package certreload

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"
)

const (
	// pollInterval is how often Start reads the files whatever the watch
	// reports, for changes it cannot see (a file reached through a
	// symlink into another directory, a file system without events).
	pollInterval = 10 * time.Second
	// settle is how long Start waits after the last event before it
	// reads the files, so that a pair replaced one file after the other
	// is read once, whole.
	settle = 100 * time.Millisecond
)

// Reloader holds the certificate of a certificate file and a key file,
// and while Start runs puts each new pair in force as it appears.
//
// A pair that does not load (a file missing or half-written, a key that
// does not match the certificate) is logged and ignored: the certificate
// in force stays, and a later change is tried again. A failure is logged
// once per content of the files, not at every event or poll.
//
// What it does not guarantee: a connection already established keeps the
// certificate it was made with; a handshake that starts while a reload
// runs may present either pair; a pair whose files are replaced more
// than 0.1 s apart is logged as a failure between the two (the
// certificate in force stays). It neither checks expiry nor verifies the
// certificate against any CA.
//
// A Reloader is safe for concurrent use.
type Reloader struct {
	certFile, keyFile string
	log               *slog.Logger
	poll, settle      time.Duration

	cert atomic.Pointer[tls.Certificate]

	mu sync.Mutex // serializes reloads; guards the fields below
	// loaded is the digest of the pair in force.
	loaded [2][sha256.Size]byte
	// failedOn is what the last reload failed on, if it failed since
	// the last load: the pair's digest, or the read error's text.
	failedOn any
}

// New loads the pair from certFile and keyFile, and fails if it does not
// load. log receives the reload records; nil discards them. The pair
// loaded is in force until Start puts a newer one in force.
func New(certFile, keyFile string, log *slog.Logger) (*Reloader, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &Reloader{certFile: certFile, keyFile: keyFile, log: log, poll: pollInterval, settle: settle}
	if _, _, err := r.reload(); err != nil {
		return nil, err
	}
	return r, nil
}

// GetCertificate returns the certificate in force, for
// tls.Config.GetCertificate. It never fails.
func (r *Reloader) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return r.cert.Load(), nil
}

// GetClientCertificate returns the certificate in force, for
// tls.Config.GetClientCertificate. It never fails.
func (r *Reloader) GetClientCertificate(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	return r.cert.Load(), nil
}

// Start follows the files until ctx ends, and returns nil then. It
// watches the directories that hold them, so that a file renamed over
// them or a swapped symlink is seen as well as a rewrite, and reads the
// pair again 0.1 s after the last event on either file (or on the
// "..data" link of a Kubernetes volume), and also every 10 seconds,
// unless events wait to settle then.
// It fails if a directory cannot be watched.
func (r *Reloader) Start(ctx context.Context) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("certreload: watch: %w", err)
	}
	defer w.Close()
	for _, dir := range []string{filepath.Dir(r.certFile), filepath.Dir(r.keyFile)} {
		if err := w.Add(dir); err != nil {
			return fmt.Errorf("certreload: watch %s: %w", dir, err)
		}
	}
	poll := time.NewTicker(r.poll)
	defer poll.Stop()
	quiet := time.NewTimer(r.settle) // a change between New and Add would otherwise wait for the poll
	defer quiet.Stop()
	pending := true // quiet runs: the poll leaves the pair to it
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return nil
			}
			if r.concerns(ev.Name) {
				pending = true
				quiet.Reset(r.settle)
			}
		case <-quiet.C:
			pending = false
			r.follow()
		case <-poll.C:
			if !pending {
				r.follow()
			}
		case err, ok := <-w.Errors:
			if !ok {
				return nil
			}
			r.log.Warn("certificate watch error", "cert", r.certFile, "key", r.keyFile, "err", err)
		}
	}
}

// concerns reports whether an event on the file name, in a watched
// directory, may change the pair: the certificate or key file itself, or
// the "..data" symlink through which a Kubernetes volume swaps a secret's
// files. Events on other files in those directories are left to the poll,
// so that a busy directory cannot hold a reload back.
func (r *Reloader) concerns(name string) bool {
	base := filepath.Base(name)
	return base == filepath.Base(r.certFile) || base == filepath.Base(r.keyFile) || base == "..data"
}

// follow reloads the pair and logs what came of it.
func (r *Reloader) follow() {
	changed, repeated, err := r.reload()
	switch {
	case repeated:
	case err != nil:
		r.log.Error("certificate reload failed; the previous one stays in force", "cert", r.certFile, "key", r.keyFile, "err", err)
	case changed:
		attrs := []any{"cert", r.certFile, "key", r.keyFile}
		if leaf := r.cert.Load().Leaf; leaf != nil {
			attrs = append(attrs, "not_after", leaf.NotAfter)
		}
		r.log.Info("certificate reloaded", attrs...)
	}
}

// reload reads the pair and, if it differs from the pair in force and
// loads, puts it in force. It reports whether it did, and whether its
// error is the last reload's again for files that have not changed
// since. On an error the pair in force stays.
func (r *Reloader) reload() (changed, repeated bool, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	certPEM, err := os.ReadFile(r.certFile)
	if err == nil {
		var keyPEM []byte
		if keyPEM, err = os.ReadFile(r.keyFile); err == nil {
			return r.load(certPEM, keyPEM)
		}
	}
	err = fmt.Errorf("certreload: %w", err)
	return false, r.failed(err.Error()), err
}

// load puts the pair certPEM, keyPEM in force unless it is in force
// already or does not load; r.mu is held.
func (r *Reloader) load(certPEM, keyPEM []byte) (changed, repeated bool, err error) {
	digest := [2][sha256.Size]byte{sha256.Sum256(certPEM), sha256.Sum256(keyPEM)}
	if r.cert.Load() != nil && digest == r.loaded {
		r.failedOn = nil
		return false, false, nil
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		err = fmt.Errorf("certreload: %s and %s: %w", r.certFile, r.keyFile, err)
		return false, r.failed(digest), err
	}
	r.cert.Store(&cert)
	r.loaded, r.failedOn = digest, nil
	return true, false, nil
}

// failed records that a reload failed on what (see failedOn), and
// reports whether the last one failed on it too; r.mu is held.
func (r *Reloader) failed(what any) bool {
	repeated := r.failedOn == what
	r.failedOn = what
	return repeated
}
