package etcdproc

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/fencer-dev/fencer/internal/testkit/testca"
)

// ErrNoClientTLS is returned by EnableAuth on a cluster started without
// WithClientTLS, whose own client could not authenticate afterwards.
var ErrNoClientTLS = errors.New("etcdproc: the cluster has no client TLS")

// newClientTLS writes ca's certificate, the members' serving key pair and
// the root user's client key pair into dir.
func newClientTLS(tb TB, ca *testca.CA, dir string) *clientTLS {
	tb.Helper()
	t := &clientTLS{ca: ca, caFile: ca.WriteCA(tb, dir, "etcd-ca.crt")}
	t.certFile, t.keyFile = testca.WriteKeyPair(tb, dir, "etcd-server", ca.ServerCert(tb))
	t.admin = &tls.Config{
		RootCAs:      ca.Pool(),
		Certificates: []tls.Certificate{ca.ClientCert(tb, "root")},
		MinVersion:   tls.VersionTLS12,
	}
	return t
}

// EnableAuth turns on etcd's authentication: it adds the user "root" with
// the root role (it authenticates by its client certificate, with no
// password), and user with password and a role of its name that may read
// and write the keys under prefix, and nothing else; then it enables
// authentication. The cluster must have been started WithClientTLS.
func (c *Cluster) EnableAuth(ctx context.Context, user, password, prefix string) error {
	if c.tls == nil {
		return ErrNoClientTLS
	}
	steps := []struct {
		what string
		do   func() error
	}{
		{"add root", func() error {
			_, err := c.admin.UserAddWithOptions(ctx, "root", "", &clientv3.UserAddOptions{NoPassword: true})
			return err
		}},
		{"grant root", func() error { _, err := c.admin.UserGrantRole(ctx, "root", "root"); return err }},
		{"add role " + user, func() error { _, err := c.admin.RoleAdd(ctx, user); return err }},
		{"grant " + prefix + " to role " + user, func() error {
			_, err := c.admin.RoleGrantPermission(ctx, user, prefix, clientv3.GetPrefixRangeEnd(prefix), clientv3.PermissionType(clientv3.PermReadWrite))
			return err
		}},
		{"add user " + user, func() error { _, err := c.admin.UserAdd(ctx, user, password); return err }},
		{"grant role " + user, func() error { _, err := c.admin.UserGrantRole(ctx, user, user); return err }},
		{"enable", func() error { _, err := c.admin.AuthEnable(ctx); return err }},
	}
	for _, s := range steps {
		if err := s.do(); err != nil {
			return fmt.Errorf("etcdproc: auth: %s: %w", s.what, err)
		}
	}
	return nil
}

// ClientCert issues a client certificate for commonName from the
// cluster's CA and writes it into dir, for a client of a cluster started
// WithClientTLS; it returns the certificate and key files.
func (c *Cluster) ClientCert(tb testing.TB, dir, commonName string) (certFile, keyFile string) {
	tb.Helper()
	if c.tls == nil {
		tb.Fatal(ErrNoClientTLS)
	}
	return testca.WriteKeyPair(tb, dir, commonName, c.tls.ca.ClientCert(tb, commonName))
}
