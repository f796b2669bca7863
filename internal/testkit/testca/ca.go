package testca

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// TB is what the CA needs of a test: testing.TB implements it.
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
}

// CA is a root certificate authority that issues server and client
// certificates. Its methods fail the test on error.
type CA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

// New returns a new self-signed root CA whose subject common name is name.
// Two CAs never trust each other's certificates.
func New(tb TB, name string) *CA {
	tb.Helper()
	key := newKey(tb)
	tmpl := template(tb, name)
	tmpl.IsCA = true
	tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageCRLSign
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		tb.Fatalf("testca: create CA certificate: %v", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		tb.Fatalf("testca: parse CA certificate: %v", err)
	}
	return &CA{cert: cert, key: key}
}

// Pool returns a certificate pool that holds only the CA's certificate,
// for a tls.Config's RootCAs or ClientCAs.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}

// CertPEM returns the CA's certificate, PEM encoded.
func (ca *CA) CertPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.cert.Raw})
}

// ServerCert issues a serving certificate for 127.0.0.1, ::1 and
// localhost.
func (ca *CA) ServerCert(tb TB) tls.Certificate {
	tb.Helper()
	tmpl := template(tb, "fencer test server")
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
	tmpl.DNSNames = []string{"localhost"}
	return ca.issue(tb, tmpl)
}

// ClientCert issues a client certificate whose subject common name is
// commonName. It does not check that commonName is a valid principal, so
// that tests can present invalid ones.
func (ca *CA) ClientCert(tb TB, commonName string) tls.Certificate {
	tb.Helper()
	tmpl := template(tb, commonName)
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	return ca.issue(tb, tmpl)
}

func (ca *CA) issue(tb TB, tmpl *x509.Certificate) tls.Certificate {
	tb.Helper()
	key := newKey(tb)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		tb.Fatalf("testca: issue certificate for %q: %v", tmpl.Subject.CommonName, err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// WriteCA writes the CA's certificate as PEM to dir/name and returns the
// path.
func (ca *CA) WriteCA(tb TB, dir, name string) string {
	tb.Helper()
	path := filepath.Join(dir, name)
	write(tb, path, ca.CertPEM())
	return path
}

// WriteKeyPair writes cert and its private key as PEM to dir/name.crt and
// dir/name.key, the form tls.LoadX509KeyPair reads, and returns both paths.
func WriteKeyPair(tb TB, dir, name string, cert tls.Certificate) (certFile, keyFile string) {
	tb.Helper()
	var certPEM []byte
	for _, der := range cert.Certificate {
		certPEM = append(certPEM, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})...)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
	if err != nil {
		tb.Fatalf("testca: encode key: %v", err)
	}
	certFile, keyFile = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	write(tb, certFile, certPEM)
	write(tb, keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}))
	return certFile, keyFile
}

func write(tb TB, path string, data []byte) {
	tb.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		tb.Fatalf("testca: %v", err)
	}
}

func newKey(tb TB) *ecdsa.PrivateKey {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatalf("testca: generate key: %v", err)
	}
	return key
}

// template returns a certificate template for commonName with a random
// serial number, valid from an hour ago for one day.
func template(tb TB, commonName string) *x509.Certificate {
	tb.Helper()
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		tb.Fatalf("testca: serial: %v", err)
	}
	now := time.Now()
	return &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: commonName},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(23 * time.Hour),
		BasicConstraintsValid: true,
	}
}
