// Package embedetcd runs etcd members in-process, on loopback, for fencer's
// server and tests.
//
// A member started here is a real etcd server from
// go.etcd.io/etcd/server/v3/embed: it persists to its data directory, runs
// raft, and serves the ordinary etcd v3 API on a loopback port. It is meant
// for single-machine deployments (fencer serve's default) and for tests. It
// does not configure TLS or authentication, so it listens on 127.0.0.1 only.
package embedetcd

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// ErrConfig reports an invalid Config.
var ErrConfig = errors.New("embedetcd: invalid config")

// Member describes one etcd member: its name, data directory and ports. A
// zero port is replaced by a free loopback port when the member starts, and
// the chosen port is recorded so that a restart on the same Member reuses it.
type Member struct {
	// Name identifies the member within its cluster. Required.
	Name string
	// Dir is the data directory. Required. A restart on the same Dir keeps
	// every key, revision and lease the member had.
	Dir string
	// ClientPort and PeerPort are loopback ports; zero picks a free one.
	ClientPort, PeerPort int
}

// Server is one running etcd member.
type Server struct {
	member Member
	etcd   *embed.Etcd
	once   sync.Once
}

// Start starts a single-member cluster described by m and waits until it
// serves requests or ctx ends. If ctx ends first, the member is stopped and
// ctx's error is returned.
func Start(ctx context.Context, m Member) (*Server, error) {
	servers, err := StartCluster(ctx, []Member{m})
	if err != nil {
		return nil, err
	}
	return servers[0], nil
}

// StartCluster starts every member of a new or existing cluster and waits
// until all of them serve requests or ctx ends. On any error, members that
// had started are stopped.
func StartCluster(ctx context.Context, members []Member) ([]*Server, error) {
	if len(members) == 0 {
		return nil, fmt.Errorf("%w: no members", ErrConfig)
	}
	members = append([]Member(nil), members...)
	var initial []string
	for i := range members {
		m := &members[i]
		if m.Name == "" || m.Dir == "" {
			return nil, fmt.Errorf("%w: member %d needs a name and a data directory", ErrConfig, i)
		}
		if strings.ContainsAny(m.Name, "=,") {
			return nil, fmt.Errorf("%w: member name %q contains '=' or ','", ErrConfig, m.Name)
		}
		for _, p := range []*int{&m.ClientPort, &m.PeerPort} {
			if *p == 0 {
				port, err := freePort()
				if err != nil {
					return nil, err
				}
				*p = port
			}
		}
		initial = append(initial, m.Name+"="+loopbackURL(m.PeerPort).String())
	}
	servers := make([]*Server, 0, len(members))
	stopAll := func() {
		for _, s := range servers {
			s.Close()
		}
	}
	for _, m := range members {
		cfg := embed.NewConfig()
		cfg.Name = m.Name
		cfg.Dir = m.Dir
		cfg.WalDir = filepath.Join(m.Dir, "wal")
		cu, pu := loopbackURL(m.ClientPort), loopbackURL(m.PeerPort)
		cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
		cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
		cfg.InitialCluster = strings.Join(initial, ",")
		cfg.InitialClusterToken = "fencer"
		// etcd logs through zap; fencer reports errors through Err and
		// StartCluster instead.
		cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
		cfg.TickMs = 50
		cfg.ElectionMs = 500
		e, err := embed.StartEtcd(cfg)
		if err != nil {
			stopAll()
			return nil, fmt.Errorf("embedetcd: start member %s: %w", m.Name, err)
		}
		servers = append(servers, &Server{member: m, etcd: e})
	}
	for _, s := range servers {
		select {
		case <-s.etcd.Server.ReadyNotify():
		case err := <-s.etcd.Err():
			stopAll()
			return nil, fmt.Errorf("embedetcd: member %s: %w", s.member.Name, err)
		case <-ctx.Done():
			stopAll()
			return nil, ctx.Err()
		}
	}
	return servers, nil
}

// Member returns the member description with its ports filled in, so that
// the same member can be started again with Start or StartCluster.
func (s *Server) Member() Member { return s.member }

// Endpoint returns the member's client URL, such as "http://127.0.0.1:2379".
func (s *Server) Endpoint() string { return loopbackURL(s.member.ClientPort).String() }

// IsLeader reports whether this member is currently the raft leader.
func (s *Server) IsLeader() bool {
	return s.etcd.Server.Leader() == s.etcd.Server.MemberID()
}

// Close stops the member and waits for it to release its ports and data
// directory. It is safe to call more than once.
func (s *Server) Close() {
	s.once.Do(func() {
		s.etcd.Close()
		select {
		case <-s.etcd.Server.StopNotify():
		case <-time.After(10 * time.Second):
		}
	})
}

// Endpoints returns the client URLs of servers.
func Endpoints(servers []*Server) []string {
	eps := make([]string, len(servers))
	for i, s := range servers {
		eps[i] = s.Endpoint()
	}
	return eps
}

func loopbackURL(port int) *url.URL {
	return &url.URL{Scheme: "http", Host: net.JoinHostPort("127.0.0.1", fmt.Sprint(port))}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("embedetcd: pick a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
