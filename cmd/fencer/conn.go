package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"

	"github.com/fencer-dev/fencer/client"
)

// connFlags are the flags of every command that talks to a fencer server.
type connFlags struct {
	server, authTokenFile, tlsCA, tlsCert, tlsKey string
	timeout                                       time.Duration
	insecure                                      bool
}

func (c *connFlags) register(fs *pflag.FlagSet) {
	c.server = defaultListen
	fs.Var(&checkedString{p: &c.server, want: "host:port, http://host:port or https://host:port (several comma-separated, all in one form)", example: defaultListen, check: func(s string) error {
		_, _, err := parseServers(s)
		return err
	}}, "server", "fencer server address; several comma-separated addresses are used round-robin")
	fs.StringVar(&c.authTokenFile, "auth-token-file", "", "file holding the bearer token to send (or the token itself in $FENCER_AUTH_TOKEN)")
	fs.StringVar(&c.tlsCA, "tls-ca", "", "CA bundle (PEM) to verify the server; enables TLS (without it, TLS verifies against the system's roots)")
	fs.StringVar(&c.tlsCert, "tls-cert", "", "client certificate (PEM) for mutual TLS, with --tls-key; enables TLS")
	fs.StringVar(&c.tlsKey, "tls-key", "", "client private key (PEM) for mutual TLS, with --tls-cert; enables TLS")
	fs.DurationVar(&c.timeout, "timeout", 10*time.Second, "timeout of each call")
	fs.BoolVar(&c.insecure, "insecure", false, "allow sending the bearer token in plaintext to a server that is not on loopback")
	for flag, env := range connEnv {
		envFlag(fs, flag, env)
	}
	aliasFlag(fs, "endpoints", "", "server")
}

// aliasFlag adds flag name (with shorthand, if not empty) as another name
// of flag of, the way etcdctl names it: setting it sets of, so that of
// counts as given on the command line and wins over its variable.
func aliasFlag(fs *pflag.FlagSet, name, shorthand, of string) {
	fs.VarP(alias{fs: fs, of: of}, name, shorthand, "etcdctl's name for --"+of)
}

// alias is the value of a flag that sets another flag.
type alias struct {
	fs *pflag.FlagSet
	of string
}

func (a alias) Set(s string) error { return a.fs.Set(a.of, s) }
func (a alias) String() string     { return a.fs.Lookup(a.of).Value.String() }
func (a alias) Type() string       { return a.fs.Lookup(a.of).Value.Type() }

// connEnv names the environment variable of each connection flag; a flag
// on the command line wins over its variable.
var connEnv = map[string]string{
	"server":          "FENCER_SERVER",
	"auth-token-file": "FENCER_AUTH_TOKEN_FILE",
	"tls-ca":          "FENCER_TLS_CA",
	"tls-cert":        "FENCER_TLS_CERT",
	"tls-key":         "FENCER_TLS_KEY",
	"timeout":         "FENCER_TIMEOUT",
	"insecure":        "FENCER_INSECURE",
}

// childEnv returns the connection settings as environment variables, for
// a command that acquire runs: its own fencer calls then reach the server
// that issued its token, however acquire was pointed at it. A bearer token
// given in $FENCER_AUTH_TOKEN is already in the environment.
func (c *connFlags) childEnv() []string {
	env := []string{"FENCER_SERVER=" + c.server, "FENCER_TIMEOUT=" + c.timeout.String()}
	for _, kv := range []struct{ key, value string }{
		{"FENCER_AUTH_TOKEN_FILE", c.authTokenFile},
		{"FENCER_TLS_CA", c.tlsCA},
		{"FENCER_TLS_CERT", c.tlsCert},
		{"FENCER_TLS_KEY", c.tlsKey},
	} {
		if kv.value != "" {
			env = append(env, kv.key+"="+kv.value)
		}
	}
	if c.insecure {
		env = append(env, "FENCER_INSECURE=true")
	}
	return env
}

// envAnnotation is the pflag annotation that names a flag's environment
// variable; see envFlag and applyEnv.
const envAnnotation = "fencer_env"

// envFlag makes $env the default of fs's flag name, and says so in its
// usage. applyEnv reads the variables before the command runs.
func envFlag(fs *pflag.FlagSet, name, env string) {
	f := fs.Lookup(name)
	f.Usage += " [$" + env + "]"
	_ = fs.SetAnnotation(name, envAnnotation, []string{env})
}

// applyEnv sets each flag of fs that was not given on the command line
// from its environment variable, if that is set and not empty. A value
// that does not parse is a usage error naming the variable.
func applyEnv(fs *pflag.FlagSet) error {
	var err error
	fs.VisitAll(func(f *pflag.Flag) {
		envs := f.Annotations[envAnnotation]
		if err != nil || f.Changed || len(envs) == 0 {
			return
		}
		v := os.Getenv(envs[0])
		if v == "" {
			return
		}
		if serr := fs.Set(f.Name, v); serr != nil {
			err = envValueError(envs[0], v, serr)
		}
	})
	return err
}

// dial connects to the server(s). The connection is lazy: errors show on
// the first call. Any of --tls-ca, --tls-cert and --tls-key turns TLS on;
// without --tls-ca the system's roots verify the server. Each server's
// certificate must name the host of its address. A bearer token is sent in
// plaintext only to loopback addresses, or with --insecure.
func (c *connFlags) dial() (*grpc.ClientConn, error) {
	addrs, scheme, err := c.servers()
	if err != nil {
		return nil, err
	}
	if scheme == "http" && c.tlsFlags() {
		return nil, usagef("--server %s is plaintext (http://), but a TLS flag turns TLS on: give https:// or host:port", c.server)
	}
	var opts []grpc.DialOption
	secure := c.secure()
	if secure {
		cfg, err := c.tlsConfig()
		if err != nil {
			return nil, err
		}
		opts = append(opts, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	} else {
		opts = append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))
	}
	tok := os.Getenv("FENCER_AUTH_TOKEN")
	if c.authTokenFile != "" {
		b, err := os.ReadFile(c.authTokenFile)
		if err != nil {
			return nil, err
		}
		tok = strings.TrimSpace(string(b))
	}
	if tok != "" {
		for _, a := range addrs {
			if !secure && !c.insecure && !isLoopback(a) {
				return nil, usagef("refusing to send the bearer token in plaintext to %s: set --tls-ca (or --tls-cert and --tls-key), or --insecure", a)
			}
		}
		opts = append(opts, grpc.WithPerRPCCredentials(client.BearerToken(tok, secure)))
	}
	if len(addrs) == 1 {
		return grpc.NewClient("passthrough:///"+addrs[0], opts...)
	}
	// Several servers: grpc's manual resolver hands out all of them, and
	// round_robin spreads the calls. Each address carries its host as the
	// server name that TLS verifies, since the target names no single
	// server.
	r := manual.NewBuilderWithScheme("fencer")
	state := resolver.State{}
	for _, a := range addrs {
		host, _, err := net.SplitHostPort(a)
		if err != nil {
			host = a
		}
		state.Addresses = append(state.Addresses, resolver.Address{Addr: a, ServerName: host})
	}
	r.InitialState(state)
	opts = append(opts, grpc.WithResolvers(r), grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"round_robin":{}}]}`))
	return grpc.NewClient("fencer:///servers", opts...)
}

// tlsConfig builds the client's TLS configuration from the flags.
func (c *connFlags) tlsConfig() (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.tlsCA != "" {
		pem, err := os.ReadFile(c.tlsCA)
		if err != nil {
			return nil, err
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("no certificates in %s", c.tlsCA)
		}
	}
	if c.tlsCert != "" || c.tlsKey != "" {
		if c.tlsCert == "" || c.tlsKey == "" {
			return nil, usagef("--tls-cert and --tls-key go together")
		}
		cert, err := tls.LoadX509KeyPair(c.tlsCert, c.tlsKey)
		if err != nil {
			return nil, fmt.Errorf("client certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// secure reports whether the flags turn TLS on: a TLS flag, or --server
// given as https:// URLs.
func (c *connFlags) secure() bool {
	_, scheme, _ := c.servers()
	return c.tlsFlags() || scheme == "https"
}

// tlsFlags reports whether a TLS flag is set.
func (c *connFlags) tlsFlags() bool { return c.tlsCA != "" || c.tlsCert != "" || c.tlsKey != "" }

// servers parses --server: comma-separated servers, all in one of the
// forms parseServer takes, and returns their host:port addresses and the
// form's scheme.
func (c *connFlags) servers() (addrs []string, scheme string, err error) {
	return parseServers(c.server)
}

// parseServers parses a --server value: see servers.
func parseServers(server string) (addrs []string, scheme string, err error) {
	for i, s := range splitList(server) {
		addr, sch, err := parseServer(s)
		if err != nil {
			return nil, "", err
		}
		if i > 0 && sch != scheme {
			return nil, "", usagef("--server %q: give every server in the same form (host:port, http:// or https://)", server)
		}
		addrs, scheme = append(addrs, addr), sch
	}
	if len(addrs) == 0 {
		return nil, "", usagef("--server is empty")
	}
	return addrs, scheme, nil
}

// parseServer parses one server: host:port, or, as etcdctl's --endpoints
// takes them, http://host:port (plaintext) or https://host:port (TLS). It
// returns host:port and the URL's scheme ("" for host:port); any other URL
// is a usage error naming the forms.
func parseServer(s string) (addr, scheme string, err error) {
	if !strings.Contains(s, "://") {
		return s, "", nil
	}
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || strings.Trim(u.Path, "/") != "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return "", "", usagef("--server %q: want host:port, or http://host:port or https://host:port", s)
	}
	return u.Host, u.Scheme, nil
}
