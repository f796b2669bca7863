package server

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
)

// ErrNoCertificates means a CA bundle file holds no PEM certificate.
var ErrNoCertificates = errors.New("server: no certificates in CA bundle")

// CAFile is a CA bundle (PEM) that it reloads while Start runs, like
// TokenFile: a replaced bundle (a rename, a Kubernetes Secret's symlink
// swap) is in force from its reload on, and one that does not load is
// logged and ignored, keeping the bundle last loaded.
//
// It verifies client certificates through ServerConfig. Connections
// already established are not revisited: a client admitted by a CA that
// is later removed keeps its connection until it closes.
type CAFile struct {
	*followedFile
	pool atomic.Pointer[x509.CertPool]
}

// NewCAFile loads the CA bundle at path. log receives reload records; nil
// discards them. Call Start to follow the file's changes.
func NewCAFile(path string, log *slog.Logger) (*CAFile, error) {
	f := &CAFile{}
	f.followedFile = newFollowedFile(path, "client CA", log, func(raw []byte) ([]any, error) {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(raw) {
			return nil, fmt.Errorf("%w: %s", ErrNoCertificates, path)
		}
		f.pool.Store(pool)
		return nil, nil
	})
	if _, err := f.Reload(); err != nil {
		return nil, err
	}
	return f, nil
}

// Pool returns the bundle last loaded.
func (f *CAFile) Pool() *x509.CertPool { return f.pool.Load() }

// ServerConfig makes base verify client certificates against the bundle
// in force at each handshake: base.ClientCAs is set to it, and
// base.GetConfigForClient returns a copy of base with the current bundle.
// base.ClientAuth is left as it is (set it, e.g. to
// tls.RequireAndVerifyClientCert). base must not already use
// GetConfigForClient.
func (f *CAFile) ServerConfig(base *tls.Config) {
	base.ClientCAs = f.Pool()
	base.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		c := base.Clone()
		c.GetConfigForClient = nil
		c.ClientCAs = f.Pool()
		return c, nil
	}
}
