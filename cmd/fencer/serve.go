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
	"sync"
	"time"

	"github.com/go-logr/logr"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"sigs.k8s.io/controller-runtime/pkg/certwatcher"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

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
	logLevel, logFormat                                   string
	etcdQuota                                             int64
	etcdRetention                                         time.Duration
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
	fs.StringVar(&f.logLevel, "log-level", "info", "least level logged: debug, info, warn or error")
	fs.StringVar(&f.logFormat, "log-format", "text", "log format on standard error: text or json")
	fs.Int64Var(&f.etcdQuota, "etcd-quota-bytes", embedetcd.DefaultQuotaBytes, "backend quota of the embedded etcd member; past it, writes fail until it is compacted and defragmented")
	fs.DurationVar(&f.etcdRetention, "etcd-compaction-retention", embedetcd.DefaultCompactionRetention, "history the embedded etcd member keeps; watches that reconnect within it resume")
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
	if _, err := f.logger(stderr); err != nil {
		fmt.Fprintln(stderr, "fencer serve:", err)
		return 2
	}
	if err := serve(ctx, f, stderr); err != nil {
		fmt.Fprintln(stderr, "fencer serve:", err)
		return 1
	}
	return 0
}

func serve(ctx context.Context, f serveFlags, stderr io.Writer) error {
	log, err := f.logger(stderr)
	if err != nil {
		return err
	}
	ctrllog.SetLogger(logr.FromSlogHandler(log.Handler())) // certwatcher's logs
	tlsCfg, auth, watchers, err := f.security(log)
	if err != nil {
		return err
	}
	if tlsCfg != nil {
		w, err := f.watchCertificate(tlsCfg)
		if err != nil {
			return err
		}
		watchers = append(watchers, w)
	}
	ctx, stopWatchers := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stopWatchers()
	watchErrs := make(chan error, len(watchers))
	for _, w := range watchers {
		wg.Go(func() {
			if err := w(ctx); err != nil {
				watchErrs <- err
			}
		})
	}
	var authz *server.Authorization
	if f.authzFile != "" {
		if authz, err = server.LoadAuthorization(f.authzFile); err != nil {
			return err
		}
	}
	endpoints := splitList(f.etcdEndpoints)
	if len(endpoints) == 0 {
		member, err := f.startEmbedded(ctx, log)
		if err != nil {
			return err
		}
		defer member.Close()
		endpoints = []string{member.Endpoint()}
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
		mux.Handle("/healthz", srv.HealthHandler())
		mux.Handle("/readyz", srv.HealthHandler())
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
	case err = <-watchErrs:
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

// logger builds the server's logger from --log-level and --log-format.
func (f serveFlags) logger(w io.Writer) (*slog.Logger, error) {
	var level slog.Level // info, also for an unset flag
	if f.logLevel != "" {
		if err := level.UnmarshalText([]byte(f.logLevel)); err != nil {
			return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", f.logLevel)
		}
	}
	opts := &slog.HandlerOptions{Level: level}
	switch f.logFormat {
	case "", "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", f.logFormat)
}

// startEmbedded starts the embedded etcd member in --data-dir, reachable
// only through the unix socket in that directory, and logs its endpoint.
func (f serveFlags) startEmbedded(ctx context.Context, log *slog.Logger) (*embedetcd.Server, error) {
	member, err := embedetcd.Start(ctx, embedetcd.Member{Name: "fencer", Dir: f.dataDir, Socket: true},
		embedetcd.WithLogger(log), embedetcd.WithQuota(f.etcdQuota), embedetcd.WithCompactionRetention(f.etcdRetention))
	if err != nil {
		return nil, fmt.Errorf("start embedded etcd in %s: %w", f.dataDir, err)
	}
	log.Info("embedded etcd", "data_dir", f.dataDir, "endpoint", member.Endpoint(),
		"quota_bytes", f.etcdQuota, "compaction_retention", f.etcdRetention.String())
	return member, nil
}

// watchCertificate makes tlsCfg serve --tls-cert and --tls-key as they
// are now, reloading them when they change (controller-runtime's
// certwatcher: file events, and a poll every 10 seconds), and returns the
// watcher to run.
func (f serveFlags) watchCertificate(tlsCfg *tls.Config) (func(context.Context) error, error) {
	cw, err := certwatcher.New(f.tlsCert, f.tlsKey)
	if err != nil {
		return nil, fmt.Errorf("tls: %w", err)
	}
	tlsCfg.Certificates, tlsCfg.GetCertificate = nil, cw.GetCertificate
	return cw.Start, nil
}

// security builds the TLS configuration and authenticator from the flags,
// refusing plaintext or anonymous service off loopback unless --insecure,
// and the watcher that reloads the token file when it changes (it runs
// until its context ends).
func (f serveFlags) security(log *slog.Logger) (*tls.Config, server.Authenticator, []func(context.Context) error, error) {
	var tlsCfg *tls.Config
	var watchers []func(context.Context) error
	if f.tlsCert != "" || f.tlsKey != "" {
		cert, err := tls.LoadX509KeyPair(f.tlsCert, f.tlsKey)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("tls: %w", err)
		}
		tlsCfg = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	if f.tlsClientCA != "" {
		if tlsCfg == nil {
			return nil, nil, nil, errors.New("--tls-client-ca needs --tls-cert and --tls-key")
		}
		pem, err := os.ReadFile(f.tlsClientCA)
		if err != nil {
			return nil, nil, nil, err
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, nil, nil, fmt.Errorf("no certificates in %s", f.tlsClientCA)
		}
		tlsCfg.ClientCAs, tlsCfg.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	var auth server.Authenticator
	switch {
	case f.tokenFile != "":
		tf, err := server.NewTokenFile(f.tokenFile, log)
		if err != nil {
			return nil, nil, nil, err
		}
		watchers = append(watchers, tf.Start)
		auth = tf
	case f.tlsClientCA != "":
		auth = server.ClientCertificates{}
	default:
		auth = server.Anonymous("anonymous")
	}
	if !f.insecure && !isLoopback(f.listen) {
		if tlsCfg == nil {
			return nil, nil, nil, errors.New("refusing plaintext on a non-loopback address: set --tls-cert/--tls-key, or --insecure")
		}
		if f.tokenFile == "" && f.tlsClientCA == "" {
			return nil, nil, nil, errors.New("refusing unauthenticated service on a non-loopback address: set --token-file or --tls-client-ca, or --insecure")
		}
	}
	return tlsCfg, auth, watchers, nil
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
