package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/fencer-dev/fencer/embedetcd"
	"github.com/fencer-dev/fencer/etcdstore"
	"github.com/fencer-dev/fencer/server"
)

// Defaults of fencer serve, also used by the client commands.
const (
	defaultListen        = "127.0.0.1:7890"
	defaultMetricsListen = "127.0.0.1:7891"
	defaultDataDir       = "./data"
)

type serveFlags struct {
	listen, metricsListen, dataDir, etcdEndpoints, prefix string
	tlsCert, tlsKey, tlsClientCA, tokenFile, authzFile    string
	insecure                                              bool
	grace                                                 time.Duration
	batch                                                 int
}

// runServe runs fencer's gRPC service until interrupted.
func runServe(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("fencer serve", flag.ContinueOnError)
	var f serveFlags
	fs.StringVar(&f.listen, "listen", defaultListen, "gRPC listen address")
	fs.StringVar(&f.metricsListen, "metrics-listen", defaultMetricsListen, `Prometheus /metrics listen address ("" disables)`)
	fs.StringVar(&f.dataDir, "data-dir", defaultDataDir, "data directory of the embedded etcd member (ignored with --etcd-endpoints)")
	fs.StringVar(&f.etcdEndpoints, "etcd-endpoints", "", "comma-separated endpoints of an existing etcd cluster, instead of the embedded member")
	fs.StringVar(&f.prefix, "prefix", etcdstore.DefaultPrefix, "etcd key prefix")
	fs.StringVar(&f.tlsCert, "tls-cert", "", "server certificate (PEM); enables TLS")
	fs.StringVar(&f.tlsKey, "tls-key", "", "server private key (PEM)")
	fs.StringVar(&f.tlsClientCA, "tls-client-ca", "", "CA bundle (PEM) for client certificates; enables mutual TLS")
	fs.StringVar(&f.tokenFile, "token-file", "", `bearer token file: "<token> <principal>" per line`)
	fs.StringVar(&f.authzFile, "authz-file", "", "authorization file (YAML): the lease names, data keys and resources each principal may use (see docs/service.md); unset lets every principal use every name")
	fs.BoolVar(&f.insecure, "insecure", false, "allow plaintext or unauthenticated service on a non-loopback address")
	fs.DurationVar(&f.grace, "shutdown-grace", 10*time.Second, "how long shutdown waits for calls in flight")
	fs.IntVar(&f.batch, "batch", etcdstore.DefaultBatch, "most concurrent writes that share one etcd Txn, each still guarded on its own (0 sends every write alone)")
	if code := parseFlags(fs, args, stderr); code >= 0 {
		return code
	}
	if fs.NArg() != 0 {
		fmt.Fprintln(stderr, "fencer serve: unexpected arguments:", fs.Args())
		return 2
	}
	if f.batch < 0 || f.batch > etcdstore.MaxBatch {
		fmt.Fprintf(stderr, "fencer serve: --batch %d: must be between 0 and %d\n", f.batch, etcdstore.MaxBatch)
		return 2
	}
	if err := serve(ctx, f, stderr); err != nil {
		fmt.Fprintln(stderr, "fencer serve:", err)
		return 1
	}
	return 0
}

func serve(ctx context.Context, f serveFlags, stderr io.Writer) error {
	log := slog.New(slog.NewTextHandler(stderr, nil))
	tlsCfg, auth, err := f.security()
	if err != nil {
		return err
	}
	var authz *server.Authorization
	if f.authzFile != "" {
		if authz, err = server.LoadAuthorization(f.authzFile); err != nil {
			return err
		}
	}
	endpoints := splitList(f.etcdEndpoints)
	if len(endpoints) == 0 {
		if err := os.MkdirAll(f.dataDir, 0o700); err != nil {
			return err
		}
		member, err := embedetcd.Start(ctx, embedetcd.Member{Name: "fencer", Dir: f.dataDir})
		if err != nil {
			return fmt.Errorf("start embedded etcd in %s: %w", f.dataDir, err)
		}
		defer member.Close()
		endpoints = []string{member.Endpoint()}
		log.Info("embedded etcd", "data_dir", f.dataDir, "endpoint", member.Endpoint())
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return fmt.Errorf("etcd client: %w", err)
	}
	defer cli.Close()
	store, err := etcdstore.New(cli, etcdstore.WithPrefix(f.prefix), etcdstore.WithBatching(f.batch))
	if err != nil {
		return err
	}
	srv, err := server.New(server.Config{Store: store, Authenticator: auth, Authorization: authz, TLS: tlsCfg, Logger: log})
	if err != nil {
		return err
	}
	lis, err := net.Listen("tcp", f.listen)
	if err != nil {
		return err
	}
	errs := make(chan error, 2)
	go func() { errs <- srv.Serve(lis) }()
	var metrics *http.Server
	if f.metricsListen != "" {
		mux := http.NewServeMux()
		mux.Handle("/metrics", srv.MetricsHandler())
		mlis, err := net.Listen("tcp", f.metricsListen)
		if err != nil {
			_ = srv.Shutdown(ctx)
			return err
		}
		metrics = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go func() {
			if err := metrics.Serve(mlis); !errors.Is(err, http.ErrServerClosed) {
				errs <- err
			}
		}()
		log.Info("metrics", "listen", mlis.Addr().String())
	}
	log.Info("serving", "listen", lis.Addr().String(), "tls", tlsCfg != nil, "etcd", strings.Join(endpoints, ","))
	select {
	case <-ctx.Done():
	case err = <-errs:
	}
	log.Info("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), f.grace)
	defer cancel()
	if serr := srv.Shutdown(sctx); err == nil {
		err = serr
	}
	if metrics != nil {
		_ = metrics.Shutdown(sctx)
	}
	return err
}

// security builds the TLS configuration and authenticator from the flags,
// refusing plaintext or anonymous service off loopback unless --insecure.
func (f serveFlags) security() (*tls.Config, server.Authenticator, error) {
	var tlsCfg *tls.Config
	if f.tlsCert != "" || f.tlsKey != "" {
		cert, err := tls.LoadX509KeyPair(f.tlsCert, f.tlsKey)
		if err != nil {
			return nil, nil, fmt.Errorf("tls: %w", err)
		}
		tlsCfg = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	if f.tlsClientCA != "" {
		if tlsCfg == nil {
			return nil, nil, errors.New("--tls-client-ca needs --tls-cert and --tls-key")
		}
		pem, err := os.ReadFile(f.tlsClientCA)
		if err != nil {
			return nil, nil, err
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, nil, fmt.Errorf("no certificates in %s", f.tlsClientCA)
		}
		tlsCfg.ClientCAs, tlsCfg.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	var auth server.Authenticator
	switch {
	case f.tokenFile != "":
		b, err := server.LoadTokenFile(f.tokenFile)
		if err != nil {
			return nil, nil, err
		}
		auth = b
	case f.tlsClientCA != "":
		auth = server.ClientCertificates{}
	default:
		auth = server.Anonymous("anonymous")
	}
	if !f.insecure && !isLoopback(f.listen) {
		if tlsCfg == nil {
			return nil, nil, errors.New("refusing plaintext on a non-loopback address: set --tls-cert/--tls-key, or --insecure")
		}
		if f.tokenFile == "" && f.tlsClientCA == "" {
			return nil, nil, errors.New("refusing unauthenticated service on a non-loopback address: set --token-file or --tls-client-ca, or --insecure")
		}
	}
	return tlsCfg, auth, nil
}

func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
