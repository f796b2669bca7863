package certreload_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/fencer-dev/fencer/internal/certreload"
	"github.com/fencer-dev/fencer/internal/testkit/testca"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// noPoll is a poll interval no test outlives: a change seen within a test
// was seen by the watch.
const noPoll = time.Hour

// pair is a certificate and its key as PEM, and the certificate's DER.
type pair struct{ cert, key, der []byte }

// newPair issues a server certificate from ca.
func newPair(t *testing.T, ca *testca.CA) pair {
	t.Helper()
	c := ca.ServerCert(t)
	certFile, keyFile := testca.WriteKeyPair(t, t.TempDir(), "p", c)
	certPEM, err := os.ReadFile(certFile)
	require.NoError(t, err)
	keyPEM, err := os.ReadFile(keyFile)
	require.NoError(t, err)
	return pair{cert: certPEM, key: keyPEM, der: c.Certificate[0]}
}

// logBuffer collects a Reloader's log records, safe for concurrent use.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// count returns how many records hold s.
func (b *logBuffer) count(s string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.Count(b.buf.String(), s)
}

// String returns every record so far.
func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (b *logBuffer) logger() *slog.Logger { return slog.New(slog.NewTextHandler(b, nil)) }

// start runs r.Start until the test ends, and then checks that it
// returned nil.
func start(t *testing.T, r *certreload.Reloader) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
}

// served returns the DER of the certificate r has in force, through both
// accessors, which must agree.
func served(t *testing.T, r *certreload.Reloader) []byte {
	t.Helper()
	c, err := r.GetCertificate(nil)
	require.NoError(t, err)
	cc, err := r.GetClientCertificate(nil)
	require.NoError(t, err)
	require.Same(t, c, cc)
	return c.Certificate[0]
}

// servesSoon waits for r to have der in force: well within the poll
// interval, so the watch saw the change.
func servesSoon(t *testing.T, r *certreload.Reloader, der []byte) {
	t.Helper()
	require.Eventually(t, func() bool { return bytes.Equal(served(t, r), der) }, 5*time.Second, 10*time.Millisecond)
}

func write(t *testing.T, path string, data []byte) {
	t.Helper()
	require.NoError(t, os.WriteFile(path, data, 0o600))
}

// renameOver puts data at path the way most rotations do: a new file
// renamed over the old.
func renameOver(t *testing.T, path string, data []byte) {
	t.Helper()
	write(t, path+".tmp", data)
	require.NoError(t, os.Rename(path+".tmp", path))
}

// secretDir lays out p the way the kubelet mounts a Secret: dir/tls.crt
// and dir/tls.key are symlinks through dir/..data to a timestamped
// directory, and a rotation swaps ..data to a new one (by a rename of a
// symlink over it) and removes the old directory. It returns the paths
// and the rotation.
func secretDir(t *testing.T, p pair) (certFile, keyFile string, swap func(pair)) {
	t.Helper()
	dir := t.TempDir()
	n := 0
	version := func(p pair) string {
		n++
		name := "..v" + string(rune('0'+n))
		require.NoError(t, os.Mkdir(filepath.Join(dir, name), 0o700))
		write(t, filepath.Join(dir, name, "tls.crt"), p.cert)
		write(t, filepath.Join(dir, name, "tls.key"), p.key)
		return name
	}
	current := version(p)
	require.NoError(t, os.Symlink(current, filepath.Join(dir, "..data")))
	for _, f := range []string{"tls.crt", "tls.key"} {
		require.NoError(t, os.Symlink(filepath.Join("..data", f), filepath.Join(dir, f)))
	}
	swap = func(p pair) {
		next := version(p)
		require.NoError(t, os.Symlink(next, filepath.Join(dir, "..data_tmp")))
		require.NoError(t, os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")))
		require.NoError(t, os.RemoveAll(filepath.Join(dir, current)))
		current = next
	}
	return filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), swap
}

// TestRotation replaces the pair of a started Reloader in each way
// certificates are rotated, and checks that the new certificate is in
// force within a few seconds, so seen by the watch, not the poll.
func TestRotation(t *testing.T) {
	ca := testca.New(t, "certreload CA")
	plain := func(t *testing.T, p pair) (string, string) {
		dir := t.TempDir()
		certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
		write(t, certFile, p.cert)
		write(t, keyFile, p.key)
		return certFile, keyFile
	}
	for _, tc := range []struct {
		name   string
		layout func(t *testing.T, p pair) (certFile, keyFile string, rotate func(pair))
	}{
		{"rewrite in place", func(t *testing.T, p pair) (string, string, func(pair)) {
			certFile, keyFile := plain(t, p)
			return certFile, keyFile, func(p pair) {
				write(t, keyFile, p.key)
				write(t, certFile, p.cert)
			}
		}},
		{"rename over", func(t *testing.T, p pair) (string, string, func(pair)) {
			certFile, keyFile := plain(t, p)
			return certFile, keyFile, func(p pair) {
				renameOver(t, keyFile, p.key)
				renameOver(t, certFile, p.cert)
			}
		}},
		{"Secret symlink swap", secretDir},
	} {
		t.Run(tc.name, func(t *testing.T) {
			first, second, third := newPair(t, ca), newPair(t, ca), newPair(t, ca)
			certFile, keyFile, rotate := tc.layout(t, first)
			var logs logBuffer
			r, err := certreload.New(certFile, keyFile, logs.logger())
			require.NoError(t, err)
			require.Equal(t, first.der, served(t, r))
			certreload.SetPoll(r, noPoll)
			start(t, r)
			rotate(second)
			servesSoon(t, r, second.der)
			rotate(third)
			servesSoon(t, r, third.der)
			require.Equal(t, 2, logs.count("certificate reloaded"), logs.String())
		})
	}
}

// TestBadPairKeepsTheCertificate writes pairs that do not load over a
// started Reloader's files: the certificate in force stays, each failure
// is logged once however many polls read it again, and a good pair
// written after them is put in force.
func TestBadPairKeepsTheCertificate(t *testing.T) {
	ca := testca.New(t, "certreload CA")
	good, other, next := newPair(t, ca), newPair(t, ca), newPair(t, ca)
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	write(t, certFile, good.cert)
	write(t, keyFile, good.key)
	var logs logBuffer
	r, err := certreload.New(certFile, keyFile, logs.logger())
	require.NoError(t, err)
	const poll = 20 * time.Millisecond
	certreload.SetPoll(r, poll)
	start(t, r)

	failures := 0
	for _, bad := range []struct {
		name      string
		cert, key []byte
	}{
		{"mismatched key", good.cert, other.key},
		{"half-written certificate", next.cert[:len(next.cert)/2], other.key},
		{"empty key", next.cert, nil},
	} {
		renameOver(t, certFile, bad.cert)
		renameOver(t, keyFile, bad.key)
		failures++
		require.Eventually(t, func() bool { return logs.count("level=ERROR") >= failures }, 5*time.Second, 10*time.Millisecond, bad.name)
		require.Equal(t, good.der, served(t, r), bad.name)
		time.Sleep(10 * poll) // polls that read it again, and must not log it again
	}
	renameOver(t, keyFile, next.key)
	servesSoon(t, r, next.der)
	// A read between the two renames of a bad pair may fail on its own,
	// hence at most two records per pair.
	require.LessOrEqual(t, logs.count("level=ERROR"), 2*failures, logs.String())
	require.Equal(t, 1, logs.count("certificate reloaded"), logs.String())
}

// TestPairReplacedFileByFileIsReadOnce: the key and then the certificate
// are renamed over a started Reloader's files a few milliseconds apart,
// as a rotation script does; the Reloader waits for the events to settle
// and reads the new pair once, whole, so it logs no failure for the
// mismatched pair between the two renames.
func TestPairReplacedFileByFileIsReadOnce(t *testing.T) {
	ca := testca.New(t, "certreload CA")
	first, second := newPair(t, ca), newPair(t, ca)
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	write(t, certFile, first.cert)
	write(t, keyFile, first.key)
	var logs logBuffer
	r, err := certreload.New(certFile, keyFile, logs.logger())
	require.NoError(t, err)
	certreload.SetPoll(r, noPoll)
	// Far longer than the 10 ms between the renames, however loaded the
	// machine: each event restarts the wait, and a read before both (on
	// Start's first wait) finds the first pair whole.
	certreload.SetSettle(r, time.Second)
	start(t, r)
	renameOver(t, keyFile, second.key)
	time.Sleep(10 * time.Millisecond)
	renameOver(t, certFile, second.cert)
	servesSoon(t, r, second.der)
	require.Equal(t, 0, logs.count("level=ERROR"), logs.String())
}

// TestPollSeesWhatTheWatchCannot: a certificate file that is a symlink
// into another directory changes there, where no event reaches the
// Reloader; the poll puts the new pair in force.
func TestPollSeesWhatTheWatchCannot(t *testing.T) {
	ca := testca.New(t, "certreload CA")
	first, second := newPair(t, ca), newPair(t, ca)
	elsewhere, dir := t.TempDir(), t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	for path, data := range map[string][]byte{"tls.crt": first.cert, "tls.key": first.key} {
		write(t, filepath.Join(elsewhere, path), data)
		require.NoError(t, os.Symlink(filepath.Join(elsewhere, path), filepath.Join(dir, path)))
	}
	r, err := certreload.New(certFile, keyFile, nil)
	require.NoError(t, err)
	certreload.SetPoll(r, 50*time.Millisecond)
	start(t, r)
	renameOver(t, filepath.Join(elsewhere, "tls.key"), second.key)
	renameOver(t, filepath.Join(elsewhere, "tls.crt"), second.cert)
	servesSoon(t, r, second.der)
}

// TestHandshakes presents the certificate in force on both sides of a
// TLS handshake, through GetCertificate and GetClientCertificate.
func TestHandshakes(t *testing.T) {
	ca := testca.New(t, "certreload CA")
	srv, cli := newPair(t, ca), newPair(t, ca)
	load := func(p pair) *certreload.Reloader {
		dir := t.TempDir()
		write(t, filepath.Join(dir, "c"), p.cert)
		write(t, filepath.Join(dir, "k"), p.key)
		r, err := certreload.New(filepath.Join(dir, "c"), filepath.Join(dir, "k"), nil)
		require.NoError(t, err)
		return r
	}
	s, c := load(srv), load(cli)
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	var peer []byte
	done := make(chan error, 1)
	go func() {
		conn := tls.Server(a, &tls.Config{GetCertificate: s.GetCertificate, ClientAuth: tls.RequireAnyClientCert, MinVersion: tls.VersionTLS12})
		err := conn.Handshake()
		if err == nil {
			peer = conn.ConnectionState().PeerCertificates[0].Raw
		}
		done <- err
	}()
	conn := tls.Client(b, &tls.Config{GetClientCertificate: c.GetClientCertificate, RootCAs: ca.Pool(), ServerName: "localhost", MinVersion: tls.VersionTLS12})
	require.NoError(t, conn.Handshake())
	require.NoError(t, <-done)
	require.Equal(t, srv.der, conn.ConnectionState().PeerCertificates[0].Raw)
	require.Equal(t, cli.der, peer)
}

// TestNewAndStartFail: New refuses a pair that does not load, and Start
// fails when a file's directory cannot be watched.
func TestNewAndStartFail(t *testing.T) {
	ca := testca.New(t, "certreload CA")
	p, other := newPair(t, ca), newPair(t, ca)
	dir := t.TempDir()
	certFile, keyFile, otherKey := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), filepath.Join(dir, "other.key")
	write(t, certFile, p.cert)
	write(t, keyFile, p.key)
	write(t, otherKey, other.key)
	for _, tc := range []struct{ name, cert, key, err string }{
		{"missing certificate", certFile + ".missing", keyFile, "no such file"},
		{"missing key", certFile, "", "no such file"},
		{"mismatched key", certFile, otherKey, "private key does not match"},
	} {
		_, err := certreload.New(tc.cert, tc.key, nil)
		require.ErrorContains(t, err, tc.err, tc.name)
		require.ErrorContains(t, err, "certreload: ", tc.name)
	}

	r, err := certreload.New(certFile, keyFile, nil)
	require.NoError(t, err)
	require.NoError(t, os.RemoveAll(dir))
	require.ErrorContains(t, r.Start(context.Background()), "certreload: watch "+dir)
	require.Equal(t, p.der, served(t, r), "the pair loaded stays in force")
}

// TestStartEndsWithItsContext: Start returns nil soon after its context
// ends, and leaves no goroutine behind.
func TestStartEndsWithItsContext(t *testing.T) {
	p := newPair(t, testca.New(t, "certreload CA"))
	dir := t.TempDir()
	write(t, filepath.Join(dir, "c"), p.cert)
	write(t, filepath.Join(dir, "k"), p.key)
	r, err := certreload.New(filepath.Join(dir, "c"), filepath.Join(dir, "k"), nil)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Start(ctx) }()
	write(t, filepath.Join(dir, "unrelated"), nil) // an event while it runs
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("Start did not return after its context ended")
	}
	goleak.VerifyNone(t)
}
