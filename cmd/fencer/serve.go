package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/fencer-dev/fencer/embedetcd"
	"github.com/fencer-dev/fencer/etcdstore"
	"github.com/fencer-dev/fencer/internal/certreload"
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
	insecure, authzAllowAll, pprof                        bool
	grace                                                 time.Duration
	batch                                                 int
	logLevel, logFormat                                   string
	etcdQuota                                             int64
	etcdRetention, etcdRequestTimeout                     time.Duration
	etcd                                                  etcdFlags
}

func (a *app) serveCmd() *cobra.Command {
	var f serveFlags
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "serve the gRPC API (embedded etcd unless --etcd-endpoints)",
		Long: `Serves fencer's gRPC API on --listen, over an embedded etcd member in
--data-dir, or over an existing etcd cluster with --etcd-endpoints. It
refuses plaintext or unauthenticated service off loopback unless
--insecure. With authentication (--token-file or --tls-client-ca) it
needs --authz-file, the names each principal may use, or
--authz-allow-all, which lets every principal use every name. SIGINT,
SIGTERM and SIGHUP shut it down gracefully; it then logs "stopped" and
exits 0. See docs/operations.md.`,
		Args: nArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if f.batch < 0 || f.batch > etcdstore.MaxBatch {
				return usagef("--batch %d: must be between 0 and %d", f.batch, etcdstore.MaxBatch)
			}
			if f.etcdRequestTimeout <= 0 {
				return usagef("--etcd-request-timeout %s: must be positive", f.etcdRequestTimeout)
			}
			if f.pprof && f.metricsListen == "" {
				return usagef("--enable-pprof serves on --metrics-listen, which is disabled")
			}
			if _, err := f.logger(a.stderr); err != nil {
				return usagef("%v", err)
			}
			return serve(cmd.Context(), f, a.stderr)
		},
	}
	f.register(cmd.Flags())
	return cmd
}

// register adds fencer serve's flags to fs, each setting its field of f.
func (f *serveFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&f.listen, "listen", defaultListen, "gRPC listen address")
	fs.StringVar(&f.metricsListen, "metrics-listen", defaultMetricsListen, `Prometheus /metrics listen address ("" disables)`)
	fs.BoolVar(&f.pprof, "enable-pprof", false, "also serve Go's profiles under /debug/pprof/ on --metrics-listen (unauthenticated, like /metrics)")
	fs.StringVar(&f.dataDir, "data-dir", defaultDataDir, "data directory of the embedded etcd member (ignored with --etcd-endpoints)")
	fs.StringVar(&f.etcdEndpoints, "etcd-endpoints", "", "comma-separated endpoints of an existing etcd cluster, instead of the embedded member")
	fs.StringVar(&f.prefix, "prefix", etcdstore.DefaultPrefix, "etcd key prefix")
	fs.StringVar(&f.tlsCert, "tls-cert", "", "server certificate (PEM); enables TLS")
	fs.StringVar(&f.tlsKey, "tls-key", "", "server private key (PEM)")
	fs.StringVar(&f.tlsClientCA, "tls-client-ca", "", "CA bundle (PEM) for client certificates; enables mutual TLS")
	fs.StringVar(&f.tokenFile, "token-file", "", `bearer token file: "<token> <principal>" per line`)
	fs.StringVar(&f.authzFile, "authz-file", "", "authorization file (YAML): the lease names, data keys and resources each principal may use (see docs/service.md); required with --token-file or --tls-client-ca unless --authz-allow-all")
	fs.BoolVar(&f.authzAllowAll, "authz-allow-all", false, "let every principal that --token-file or --tls-client-ca authenticates use every lease name, data key and resource, instead of --authz-file")
	fs.BoolVar(&f.insecure, "insecure", false, "allow plaintext or unauthenticated service on a non-loopback address")
	fs.DurationVar(&f.grace, "shutdown-grace", 10*time.Second, "how long shutdown waits for calls in flight")
	fs.IntVar(&f.batch, "batch", etcdstore.DefaultBatch, "most concurrent writes that share one etcd Txn, each still guarded on its own (0 sends every write alone)")
	fs.StringVar(&f.logLevel, "log-level", "info", "least level logged: debug, info, warn or error")
	fs.StringVar(&f.logFormat, "log-format", "text", "log format on standard error: text or json")
	fs.Int64Var(&f.etcdQuota, "etcd-quota-bytes", embedetcd.DefaultQuotaBytes, "backend quota of the embedded etcd member; its history is kept under a quarter of it, and past it (NOSPACE) the member compacts, defragments and accepts writes again by itself")
	fs.DurationVar(&f.etcdRetention, "etcd-compaction-retention", embedetcd.DefaultCompactionRetention, "most history the embedded etcd member keeps (less if it outgrows a quarter of --etcd-quota-bytes); watches that reconnect within it resume")
	fs.DurationVar(&f.etcdRequestTimeout, "etcd-request-timeout", server.DefaultEtcdRequestTimeout, "longest one etcd request waits for an answer; past it the call fails with UNAVAILABLE (cause etcd_unreachable)")
	f.etcd.register(fs)
}

// serve runs fencer serve until ctx ends (a signal), then shuts down and
// returns nil, having logged "stopped" once everything it started has
// stopped: also when ctx ends while the embedded etcd starts.
func serve(ctx context.Context, f serveFlags, stderr io.Writer) (err error) {
	if err := f.checkAuthz(); err != nil {
		return err
	}
	log, err := f.logger(stderr)
	if err != nil {
		return err
	}
	stopped := ctx
	defer func() {
		if err == nil || stopped.Err() != nil && errors.Is(err, stopped.Err()) {
			err = nil
			log.Info("stopped")
		}
	}()
	tlsCfg, auth, watchers, err := f.security(log)
	if err != nil {
		return err
	}
	ctx, stopWatchers := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stopWatchers()
	watchErrs := make(chan error, len(watchers)+2)
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
	etcdCfg, watchEtcdCert, err := f.etcd.clientConfig(endpoints, f.insecure, log)
	if err != nil {
		return err
	}
	if watchEtcdCert != nil {
		wg.Go(func() {
			if err := watchEtcdCert(ctx); err != nil {
				watchErrs <- err
			}
		})
	}
	// The listeners are bound before etcd starts, so that a busy port
	// fails the start before the data directory is made or etcd runs.
	lis, err := listen("--listen", f.listen)
	if err != nil {
		return err
	}
	defer lis.Close()
	var mlis net.Listener
	if f.metricsListen != "" {
		if mlis, err = listen("--metrics-listen", f.metricsListen); err != nil {
			return err
		}
		defer mlis.Close()
	}
	var cli *clientv3.Client
	var collectors []prometheus.Collector
	if len(endpoints) == 0 {
		member, err := f.startEmbedded(ctx, log)
		if err != nil {
			return err
		}
		defer member.Close()
		collectors = memberMetrics(member)
		endpoints = []string{member.Endpoint()}
		// In process: one gRPC hop per request (the caller's), not two.
		// The member's socket still serves etcdctl and backups.
		cli = member.Client()
	} else {
		// The etcd client's warnings and errors, as the embedded member's.
		etcdCfg.Logger = embedetcd.ZapLogger(log.With(slog.String("component", "etcd-client")))
		if cli, err = clientv3.New(etcdCfg); err != nil {
			return fmt.Errorf("etcd client: %w", err)
		}
	}
	defer cli.Close()
	if f.etcdRequestTimeout == 0 {
		f.etcdRequestTimeout = server.DefaultEtcdRequestTimeout
	}
	server.BoundRequests(cli, f.etcdRequestTimeout)
	store, err := etcdstore.New(cli, etcdstore.WithPrefix(f.prefix), etcdstore.WithBatching(f.batch))
	if err != nil {
		return err
	}
	if answered, err := checkPrefix(ctx, cli, f.prefix); answered && err != nil {
		return err
	} else if !answered {
		log.Warn("could not check --prefix yet; checking again until etcd answers", "prefix", f.prefix, "error", err)
		wg.Go(func() {
			if err := recheckPrefix(ctx, cli, f.prefix); err != nil {
				watchErrs <- err
			}
		})
	}
	srv, err := server.New(server.Config{Store: store, Authenticator: auth, Authorization: authz, TLS: tlsCfg, Logger: log, Collectors: collectors})
	if err != nil {
		return err
	}
	errs := make(chan error, 2)
	go func() { errs <- srv.Serve(lis) }()
	var metrics *http.Server
	if mlis != nil {
		mux := http.NewServeMux()
		mux.Handle("/metrics", srv.MetricsHandler())
		mux.Handle("/healthz", srv.HealthHandler())
		mux.Handle("/readyz", srv.HealthHandler())
		if f.pprof {
			mux.HandleFunc("/debug/pprof/", pprof.Index)
			mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
			mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
			mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
			mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		}
		metrics = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go func() {
			if err := metrics.Serve(mlis); !errors.Is(err, http.ErrServerClosed) {
				errs <- err
			}
		}()
		log.Info("metrics", "listen", mlis.Addr().String())
	}
	// The server logs "etcd reachable: serving" once its first check of
	// etcd passes, and "etcd unreachable: not serving" if it fails.
	log.Info("listening", "listen", lis.Addr().String(), "tls", tlsCfg != nil, "authorization", f.authzMode(), "etcd", strings.Join(endpoints, ","))
	select {
	case <-ctx.Done():
	case err = <-errs:
	case err = <-watchErrs:
	}
	log.Info("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), f.grace)
	defer cancel()
	switch serr := srv.Shutdown(sctx); {
	case errors.Is(serr, context.DeadlineExceeded):
		// The bound on a shutdown, not a failure of it: what still ran
		// (a call to etcd that has not answered, a stream whose client
		// reads nothing and so cannot receive its SHUTTING_DOWN) was cut.
		log.Warn("shutdown grace passed: the calls still open were cut", "grace", f.grace.String())
	case err == nil:
		err = serr
	}
	if metrics != nil {
		_ = metrics.Shutdown(sctx)
	}
	return err
}

// listen binds addr, the value of flag, and names the flag in its error
// (which names the address).
func listen(flag, addr string) (net.Listener, error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	return lis, nil
}

// prefixCheckTimeout bounds the check of --prefix at start, so that an
// unreachable etcd delays the start by no more than this.
const prefixCheckTimeout = 2 * time.Second

// checkPrefix checks that prefix is not inside another deployment's key
// space (whose data writes could then forge this one's leases and tokens),
// within prefixCheckTimeout. It reports whether etcd answered, with nil or
// the *etcdstore.NestedPrefixError; if not, err is why.
func checkPrefix(ctx context.Context, cli *clientv3.Client, prefix string) (answered bool, err error) {
	cctx, cancel := context.WithTimeout(ctx, prefixCheckTimeout)
	defer cancel()
	err = etcdstore.CheckPrefix(cctx, cli, prefix)
	var nested *etcdstore.NestedPrefixError
	return err == nil || errors.As(err, &nested), err
}

// recheckPrefix checks prefix every second until etcd answers, and
// returns the *etcdstore.NestedPrefixError if the answer is a refusal, or
// nil. Until it answers, the server may serve calls (which fail while etcd
// is unreachable).
func recheckPrefix(ctx context.Context, cli *clientv3.Client, prefix string) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Second):
		}
		if answered, err := checkPrefix(ctx, cli, prefix); answered {
			return err
		}
	}
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

// memberMetrics are the embedded member's space metrics: its database
// size and what its compactor did (embedetcd.SpaceStats), read at each
// scrape.
func memberMetrics(member *embedetcd.Server) []prometheus.Collector {
	type stat = func(embedetcd.SpaceStats) int64
	read := func(v stat) func() float64 { return func() float64 { return float64(v(member.SpaceStats())) } }
	gauges := []struct {
		opts prometheus.GaugeOpts
		v    stat
	}{
		{prometheus.GaugeOpts{Name: "fencer_embedded_etcd_db_size_bytes", Help: "Size of the embedded etcd member's database file, which etcd holds against --etcd-quota-bytes."}, func(s embedetcd.SpaceStats) int64 { return s.DBSize }},
		{prometheus.GaugeOpts{Name: "fencer_embedded_etcd_db_size_in_use_bytes", Help: "Part of the embedded etcd member's database file in use; the rest is free pages that writes reuse."}, func(s embedetcd.SpaceStats) int64 { return s.DBSizeInUse }},
	}
	counters := []struct {
		opts prometheus.CounterOpts
		v    stat
	}{
		{prometheus.CounterOpts{Name: "fencer_embedded_etcd_compactions_total", Help: "Compactions the embedded etcd member's compactor made."}, func(s embedetcd.SpaceStats) int64 { return s.Compactions }},
		{prometheus.CounterOpts{Name: "fencer_embedded_etcd_size_compactions_total", Help: "Compactions made because the database's in-use size passed a quarter of the quota, before the retention: each shortened the history lease watches resume from."}, func(s embedetcd.SpaceStats) int64 { return s.SizeCompactions }},
		{prometheus.CounterOpts{Name: "fencer_embedded_etcd_nospace_alarms_total", Help: "Times the embedded etcd member's NOSPACE alarm was found raised (writes refused for space)."}, func(s embedetcd.SpaceStats) int64 { return s.NoSpaceAlarms }},
		{prometheus.CounterOpts{Name: "fencer_embedded_etcd_nospace_recoveries_total", Help: "NOSPACE alarms cleared by the member itself: history compacted, member defragmented, alarm disarmed."}, func(s embedetcd.SpaceStats) int64 { return s.Recoveries }},
		{prometheus.CounterOpts{Name: "fencer_embedded_etcd_nospace_recovery_failures_total", Help: "NOSPACE recoveries that failed at a step; retried a second later."}, func(s embedetcd.SpaceStats) int64 { return s.RecoveryFailures }},
	}
	var cs []prometheus.Collector
	for _, g := range gauges {
		cs = append(cs, prometheus.NewGaugeFunc(g.opts, read(g.v)))
	}
	for _, c := range counters {
		cs = append(cs, prometheus.NewCounterFunc(c.opts, read(c.v)))
	}
	return cs
}

// checkAuthz refuses, with a usage error, flags that leave open what
// authenticated principals may do: --token-file or --tls-client-ca
// without --authz-file or --authz-allow-all. Authentication is there to
// tell principals apart, so fencer serve does not guess that each may use
// every name (as etcd's RBAC and a Kubernetes API server's authorizers do
// not); it asks at start, where a deny-all server would instead look
// broken at the first call. It also refuses --authz-allow-all with
// --authz-file, and --authz-allow-all without authentication, where the
// only principal, "anonymous", may use every name already. It reads no
// file: it runs before serve reads, binds or starts anything.
func (f serveFlags) checkAuthz() error {
	authn := ""
	switch {
	case f.tokenFile != "":
		authn = "--token-file"
	case f.tlsClientCA != "":
		authn = "--tls-client-ca"
	}
	switch {
	case f.authzAllowAll && f.authzFile != "":
		return usagef("--authz-allow-all and --authz-file exclude each other: give --authz-file to grant each principal its names, or --authz-allow-all to grant every principal every name")
	case f.authzAllowAll && authn == "":
		return usagef("--authz-allow-all needs --token-file or --tls-client-ca: without them every call is the one principal %q, which may use every name unless --authz-file says otherwise", "anonymous")
	case authn != "" && f.authzFile == "" && !f.authzAllowAll:
		return usagef("%s authenticates principals but no --authz-file says what each may do: give --authz-file, or --authz-allow-all to let every authenticated principal use every name, key and resource", authn)
	}
	return nil
}

// authzMode names how the server authorizes calls, for its start log:
// "file" (--authz-file), "allow-all" (--authz-allow-all) or "anonymous"
// (no authentication: every call is the principal "anonymous").
func (f serveFlags) authzMode() string {
	switch {
	case f.authzFile != "":
		return "file"
	case f.authzAllowAll:
		return "allow-all"
	}
	return "anonymous"
}

// security builds the TLS configuration and authenticator from the flags,
// refusing plaintext or anonymous service off loopback unless --insecure,
// and the watchers that reload the serving certificate (--tls-cert and
// --tls-key, see certreload), the token file and the client CA bundle
// when they change (they run until their context ends). Until its
// watcher runs, the certificate loaded here is served.
func (f serveFlags) security(log *slog.Logger) (*tls.Config, server.Authenticator, []func(context.Context) error, error) {
	var tlsCfg *tls.Config
	var watchers []func(context.Context) error
	if f.tlsCert != "" || f.tlsKey != "" {
		cert, err := certreload.New(f.tlsCert, f.tlsKey, log)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("tls: %w", err)
		}
		tlsCfg = &tls.Config{GetCertificate: cert.GetCertificate, MinVersion: tls.VersionTLS12}
		watchers = append(watchers, cert.Start)
	}
	if f.tlsClientCA != "" {
		if tlsCfg == nil {
			return nil, nil, nil, errors.New("--tls-client-ca needs --tls-cert and --tls-key")
		}
		cas, err := server.NewCAFile(f.tlsClientCA, log)
		if err != nil {
			return nil, nil, nil, err
		}
		cas.ServerConfig(tlsCfg)
		tlsCfg.ClientAuth = tls.RequireAndVerifyClientCert
		watchers = append(watchers, cas.Start)
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

// errEtcdFlags is wrapped by every refusal of a combination of the
// --etcd-* flags.
var errEtcdFlags = errors.New("etcd flags")

// etcdFlags are the credentials fencer serve presents to an external etcd
// cluster (--etcd-endpoints): a CA bundle to verify the members, a client
// certificate and key, and a username with its password.
type etcdFlags struct {
	caFile, certFile, keyFile, username, passwordFile string
}

// register adds the --etcd-* credential flags to fs. Each defaults to an
// environment variable; the password is read from --etcd-password-file or
// $FENCER_ETCD_PASSWORD, never from the command line, where ps shows it.
func (e *etcdFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&e.caFile, "etcd-ca-file", "", "CA bundle (PEM) that verifies the etcd members; enables TLS to etcd")
	fs.StringVar(&e.certFile, "etcd-cert-file", "", "client certificate (PEM) for etcd, with --etcd-key-file; enables TLS to etcd")
	fs.StringVar(&e.keyFile, "etcd-key-file", "", "client private key (PEM) for etcd, with --etcd-cert-file")
	fs.StringVar(&e.username, "etcd-username", "", "etcd user, with --etcd-password-file or $FENCER_ETCD_PASSWORD")
	fs.StringVar(&e.passwordFile, "etcd-password-file", "", "file holding the etcd user's password")
	for flag, env := range map[string]string{
		"etcd-ca-file": "FENCER_ETCD_CA_FILE", "etcd-cert-file": "FENCER_ETCD_CERT_FILE", "etcd-key-file": "FENCER_ETCD_KEY_FILE",
		"etcd-username": "FENCER_ETCD_USERNAME", "etcd-password-file": "FENCER_ETCD_PASSWORD_FILE",
	} {
		envFlag(fs, flag, env)
	}
}

// clientConfig returns the etcd client configuration for endpoints, with
// the TLS and user credentials of the flags. Endpoints empty means the
// embedded member, which takes no credentials: any credential flag is then
// refused rather than ignored. TLS is on when an endpoint is https:// or a
// TLS flag is set, and then every endpoint must be https:// or unixs:// (without
// --etcd-ca-file the system's roots verify the members). A password is sent
// in plaintext only to loopback endpoints, or with insecure. It does not
// check that the files hold what etcd will accept: the first request does.
// With a client certificate it also returns the watcher that reloads it
// (see tlsConfig), to run until its context ends, which logs to log (nil
// discards); nil otherwise.
func (e etcdFlags) clientConfig(endpoints []string, insecure bool, log *slog.Logger) (clientv3.Config, func(context.Context) error, error) {
	cfg := clientv3.Config{
		Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(requireLeader)},
	}
	password, hasPassword := os.LookupEnv("FENCER_ETCD_PASSWORD")
	tlsFlags := e.caFile != "" || e.certFile != "" || e.keyFile != ""
	if len(endpoints) == 0 {
		if tlsFlags || e.username != "" || e.passwordFile != "" || hasPassword {
			return cfg, nil, fmt.Errorf("%w: etcd credentials (--etcd-* flags, $FENCER_ETCD_* variables) need --etcd-endpoints; the embedded etcd takes none", errEtcdFlags)
		}
		return cfg, nil, nil
	}
	var https, plain, remote []string // remote: plain and off this machine
	for _, ep := range endpoints {
		u, err := url.Parse(ep)
		switch {
		case err == nil && (u.Scheme == "https" && u.Host != "" || u.Scheme == "unixs"):
			https = append(https, ep)
		case err == nil && u.Scheme == "unix":
			plain = append(plain, ep)
		case err == nil && u.Scheme == "http" && u.Host != "":
			plain = append(plain, ep)
			if !isLoopback(u.Host) {
				remote = append(remote, ep)
			}
		case strings.Contains(ep, "://"):
			return cfg, nil, fmt.Errorf("%w: --etcd-endpoints: %q is not http://, https://, unix:// or unixs://", errEtcdFlags, ep)
		default: // host:port, which the etcd client dials in plaintext
			plain = append(plain, ep)
			if !isLoopback(ep) {
				remote = append(remote, ep)
			}
		}
	}
	secure := tlsFlags || len(https) > 0
	if secure && len(plain) > 0 {
		return cfg, nil, fmt.Errorf("%w: TLS to etcd is on, but %s would be plaintext: give every endpoint as https:// (or unixs://)", errEtcdFlags, strings.Join(plain, ","))
	}
	var watch func(context.Context) error
	if secure {
		tlsCfg, w, err := e.tlsConfig(log)
		if err != nil {
			return cfg, nil, err
		}
		cfg.TLS, watch = tlsCfg, w
	}
	switch {
	case e.passwordFile != "" && hasPassword:
		return cfg, nil, fmt.Errorf("%w: both --etcd-password-file and $FENCER_ETCD_PASSWORD are set; keep one", errEtcdFlags)
	case e.passwordFile != "":
		b, err := os.ReadFile(e.passwordFile)
		if err != nil {
			return cfg, nil, fmt.Errorf("%w: --etcd-password-file: %w", errEtcdFlags, err)
		}
		password, hasPassword = strings.TrimRight(string(b), "\r\n"), true
	}
	switch {
	case e.username == "" && hasPassword:
		return cfg, nil, fmt.Errorf("%w: an etcd password needs --etcd-username", errEtcdFlags)
	case e.username != "" && !hasPassword:
		return cfg, nil, fmt.Errorf("%w: --etcd-username needs --etcd-password-file or $FENCER_ETCD_PASSWORD", errEtcdFlags)
	case e.username != "" && password == "":
		return cfg, nil, fmt.Errorf("%w: the etcd password is empty", errEtcdFlags)
	}
	if e.username != "" && len(remote) > 0 && !insecure {
		return cfg, nil, fmt.Errorf("%w: refusing to send the etcd password in plaintext to %s: use https:// endpoints, or --insecure", errEtcdFlags, strings.Join(remote, ","))
	}
	cfg.Username, cfg.Password = e.username, password
	return cfg, watch, nil
}

// tlsConfig builds the TLS configuration for etcd from the CA, certificate
// and key files. The client certificate is presented through a
// certreload.Reloader: while the returned watcher runs, it reloads the
// pair when its files change (file events, and a poll every 10 s), and
// each new connection to etcd presents the certificate then in force;
// without it, the certificate loaded here. The watcher logs to log (nil
// discards). The CA bundle is read once.
func (e etcdFlags) tlsConfig(log *slog.Logger) (*tls.Config, func(context.Context) error, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if (e.certFile == "") != (e.keyFile == "") {
		return nil, nil, fmt.Errorf("%w: --etcd-cert-file and --etcd-key-file go together", errEtcdFlags)
	}
	var watch func(context.Context) error
	if e.certFile != "" {
		cert, err := certreload.New(e.certFile, e.keyFile, log)
		if err != nil {
			return nil, nil, fmt.Errorf("%w: etcd client certificate: %w", errEtcdFlags, err)
		}
		cfg.GetClientCertificate, watch = cert.GetClientCertificate, cert.Start
	}
	if e.caFile != "" {
		pem, err := os.ReadFile(e.caFile)
		if err != nil {
			return nil, nil, fmt.Errorf("%w: --etcd-ca-file: %w", errEtcdFlags, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, nil, fmt.Errorf("%w: --etcd-ca-file: no certificates in %s", errEtcdFlags, e.caFile)
		}
		cfg.RootCAs = pool
	}
	return cfg, watch, nil
}

// requireLeader marks every unary etcd call as requiring a leader, as
// clientv3.WithRequireLeader does: a member without a leader refuses it at
// once with etcd's "no leader", instead of holding a write until etcd's
// request timeout and a read or lease grant through the client's retries
// of that, which last longer than any caller waits. So while etcd has no
// quorum, fencer's callers get UNAVAILABLE, and a write refused so was not
// proposed. Streams (keep-alives, watches) are left as they are.
func requireLeader(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	return invoker(clientv3.WithRequireLeader(ctx), method, req, reply, cc, opts...)
}
