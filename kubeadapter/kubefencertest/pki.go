package kubefencertest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// Users of an APIServer, as the API server's static token file names them.
const (
	adminUser   = "fencer-admin"
	limitedUser = "fencer-limited"
)

// credentials are the secrets of one APIServer: the serving certificate that
// clients trust, and the bearer tokens of its two users.
type credentials struct {
	caPEM        []byte
	adminToken   string
	limitedToken string
}

// credentialFiles are the paths of the files written by writeCredentials,
// in the form kube-apiserver's flags take them.
type credentialFiles struct {
	servingCert, servingKey string
	saPublic, saPrivate     string
	tokens                  string
}

// writeCredentials creates fresh credentials and writes them to dir: a
// self-signed ECDSA serving certificate for 127.0.0.1, an RSA key pair for
// signing service-account tokens, and a static token file with an admin in
// system:masters and an unprivileged limited user.
func writeCredentials(dir string) (credentials, credentialFiles, error) {
	files := credentialFiles{
		servingCert: filepath.Join(dir, "serving.crt"),
		servingKey:  filepath.Join(dir, "serving.key"),
		saPublic:    filepath.Join(dir, "service-account.pub"),
		saPrivate:   filepath.Join(dir, "service-account.key"),
		tokens:      filepath.Join(dir, "tokens.csv"),
	}
	var creds credentials
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return creds, files, fmt.Errorf("kubefencertest: %w", err)
	}

	certPEM, keyPEM, err := servingCertificate()
	if err != nil {
		return creds, files, err
	}
	creds.caPEM = certPEM

	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return creds, files, fmt.Errorf("kubefencertest: generate service-account key: %w", err)
	}
	saPub, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return creds, files, fmt.Errorf("kubefencertest: encode service-account key: %w", err)
	}

	creds.adminToken, creds.limitedToken = rand.Text(), rand.Text()
	// Format: token,user,uid,"group,..." (see kube-apiserver --token-auth-file).
	tokens := fmt.Sprintf("%s,%s,%s,\"system:masters\"\n%s,%s,%s\n",
		creds.adminToken, adminUser, adminUser,
		creds.limitedToken, limitedUser, limitedUser)

	for path, data := range map[string][]byte{
		files.servingCert: certPEM,
		files.servingKey:  keyPEM,
		files.saPublic:    pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: saPub}),
		files.saPrivate:   pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(saKey)}),
		files.tokens:      []byte(tokens),
	} {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			return creds, files, fmt.Errorf("kubefencertest: %w", err)
		}
	}
	return creds, files, nil
}

// servingCertificate returns a self-signed certificate and its key, PEM
// encoded, valid for 127.0.0.1 and localhost for one day. The certificate is
// its own CA, so clients trust it by taking it as their root.
func servingCertificate() (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("kubefencertest: generate serving key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return nil, nil, fmt.Errorf("kubefencertest: generate serial: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "fencer kubetest apiserver"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:              []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, fmt.Errorf("kubefencertest: create serving certificate: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("kubefencertest: encode serving key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), nil
}
