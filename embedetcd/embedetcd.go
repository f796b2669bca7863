package embedetcd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3client"

	"github.com/fencer-dev/fencer/internal/freeport"
)

// ErrConfig reports an invalid member or option.
var ErrConfig = errors.New("embedetcd: invalid config")

// ErrLocked means a data directory is in use by another member, in this
// process or another. LockedError wraps it.
var ErrLocked = errors.New("embedetcd: data directory in use")

// LockedError names the data directory another member holds.
type LockedError struct {
	// Dir is the data directory.
	Dir string
}

func (e *LockedError) Error() string {
	return fmt.Sprintf("embedetcd: data directory %s is in use by another etcd member (another fencer serve?)", e.Dir)
}

// Unwrap returns ErrLocked.
func (e *LockedError) Unwrap() error { return ErrLocked }

// File names inside a member's data directory.
const (
	lockFile   = "fencer.lock"
	clientSock = "etcd.sock"
	peerSock   = "peer.sock"
)

// maxSocketPath is the longest unix socket path every unix accepts.
const maxSocketPath = 103

// Member describes one etcd member: its name, data directory and where it
// listens. A zero port is replaced by a free loopback port when the member
// starts, and the chosen port is recorded so that a restart on the same
// Member reuses it.
type Member struct {
	// Name identifies the member within its cluster. Required.
	Name string
	// Dir is the data directory, created 0700 if missing. Required. A
	// restart on the same Dir keeps every key, revision and lease the
	// member had.
	Dir string
	// ClientPort and PeerPort are loopback ports; zero picks a free one.
	// They are unused with Socket.
	ClientPort, PeerPort int
	// Socket serves clients on the unix socket Dir/etcd.sock and peers on
	// Dir/peer.sock, both 0600, instead of loopback ports: only the
	// directory's owner can reach the member. The client endpoint is
	// stable across restarts. Only for a single-member cluster; Dir's
	// absolute path must leave room for the socket names (about 90 bytes).
	Socket bool
}

// Server is one running etcd member.
type Server struct {
	member Member
	etcd   *embed.Etcd
	lock   *os.File
	once   sync.Once
	// logs sets the levels of etcd's logs of this member.
	logs *memberLog
	// space counts what the member's compactor did.
	space spaceCounters
	// stopCompactor ends the compactor and waits for it; nil until it runs.
	stopCompactor func()
}

// Start starts a single-member cluster described by m and waits until it
// serves requests or ctx ends. If ctx ends first, the member is stopped and
// ctx's error is returned. If another member holds m.Dir, it fails at once
// with a *LockedError.
func Start(ctx context.Context, m Member, opts ...Option) (*Server, error) {
	servers, err := StartCluster(ctx, []Member{m}, opts...)
	if err != nil {
		return nil, err
	}
	return servers[0], nil
}

// StartCluster starts every member of a new or existing cluster, with
// opts, and waits until all of them serve requests or ctx ends. On any
// error, members that had started are stopped. A member whose data
// directory another member holds fails at once with a *LockedError.
func StartCluster(ctx context.Context, members []Member, opts ...Option) ([]*Server, error) {
	o := defaultOptions()
	for _, opt := range opts {
		opt(&o)
	}
	if err := o.validate(); err != nil {
		return nil, err
	}
	if len(members) == 0 {
		return nil, fmt.Errorf("%w: no members", ErrConfig)
	}
	members = append([]Member(nil), members...)
	var initial []string
	var unset []*int
	for i := range members {
		m := &members[i]
		if m.Name == "" || m.Dir == "" {
			return nil, fmt.Errorf("%w: member %d needs a name and a data directory", ErrConfig, i)
		}
		if strings.ContainsAny(m.Name, "=,") {
			return nil, fmt.Errorf("%w: member name %q contains '=' or ','", ErrConfig, m.Name)
		}
		if m.Socket {
			if len(members) > 1 {
				return nil, fmt.Errorf("%w: Socket is only for a single-member cluster", ErrConfig)
			}
			dir, err := filepath.Abs(m.Dir)
			if err != nil {
				return nil, fmt.Errorf("%w: data directory %s: %v", ErrConfig, m.Dir, err)
			}
			if len(filepath.Join(dir, clientSock)) > maxSocketPath {
				return nil, fmt.Errorf("%w: data directory %s: path too long for a unix socket inside it", ErrConfig, dir)
			}
			m.Dir = dir
			continue
		}
		for _, p := range []*int{&m.ClientPort, &m.PeerPort} {
			if *p == 0 {
				unset = append(unset, p)
			}
		}
	}
	if err := pickFreePorts(unset); err != nil {
		return nil, err
	}
	for _, m := range members {
		initial = append(initial, m.Name+"="+m.peerURL().String())
	}
	servers := make([]*Server, 0, len(members))
	stopAll := func() {
		for _, s := range servers {
			s.Close()
		}
	}
	for _, m := range members {
		srv, err := startMember(m, strings.Join(initial, ","), o)
		if err != nil {
			stopAll()
			return nil, err
		}
		servers = append(servers, srv)
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
	for _, s := range servers {
		if err := s.chmodSockets(); err != nil {
			stopAll()
			return nil, err
		}
	}
	for _, s := range servers {
		s.startCompactor(o)
	}
	return servers, nil
}

func (o options) validate() error {
	switch {
	case o.retention < time.Second:
		return fmt.Errorf("%w: compaction retention %s is under a second", ErrConfig, o.retention)
	case o.quota <= 0:
		return fmt.Errorf("%w: quota %d bytes is not positive", ErrConfig, o.quota)
	}
	return nil
}

// soloCatchUpEntries is how many applied raft entries a single member
// keeps in memory after a raft snapshot (etcd's --snapshot-catchup-entries),
// where a cluster's members keep etcd's default for their followers. The
// entries are the writes' requests as etcd applied them, a few hundred
// bytes each for fencer's acquisitions and guarded writes.
const soloCatchUpEntries = 100

// startMember locks m's data directory and starts its etcd, without
// waiting for it to serve.
func startMember(m Member, initialCluster string, o options) (*Server, error) {
	// etcd warns about, but keeps, a data directory others can read.
	if err := os.MkdirAll(m.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("embedetcd: member %s: %w", m.Name, err)
	}
	if err := os.Chmod(m.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("embedetcd: member %s: %w", m.Name, err)
	}
	lock, err := lockDir(m.Dir)
	if err != nil {
		return nil, err
	}
	cfg := embed.NewConfig()
	cfg.Name = m.Name
	cfg.Dir = m.Dir
	cfg.WalDir = filepath.Join(m.Dir, "wal")
	cu, pu := m.clientURL(), m.peerURL()
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	if m.Socket {
		// etcd listens on a unix peer URL's Host and ignores its Path,
		// but compares the advertised URL with --initial-cluster as
		// text, where an absolute path must be the Path.
		cfg.ListenPeerUrls = []url.URL{{Scheme: "unix", Host: pu.Path}}
	}
	cfg.InitialCluster = initialCluster
	cfg.InitialClusterToken = "fencer"
	// etcd's own compactor is off ("0"): the member's compactor
	// (compactor.go) bounds the history by age and by size.
	cfg.AutoCompactionMode = embed.CompactorModePeriodic
	cfg.AutoCompactionRetention = "0"
	cfg.QuotaBackendBytes = o.quota
	cfg.MaxTxnOps = MaxTxnOps
	if o.maxRequestBytes > 0 {
		cfg.MaxRequestBytes = o.maxRequestBytes
	}
	logs := new(memberLog)
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(newZapLogger(o.log.With(slog.String("component", "etcd")), logs))
	cfg.TickMs = 50
	cfg.ElectionMs = 500
	if !strings.Contains(initialCluster, ",") {
		// A single member has no follower to catch up: after each raft
		// snapshot it keeps soloCatchUpEntries applied entries in memory,
		// not etcd's 5,000.
		cfg.SnapshotCatchUpEntries = soloCatchUpEntries
	}
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		lock.Close()
		return nil, fmt.Errorf("embedetcd: start member %s: %w", m.Name, err)
	}
	return &Server{member: m, etcd: e, lock: lock, logs: logs}, nil
}

// startCompactor runs the member's compactor until Close.
func (s *Server) startCompactor(o options) {
	c := &compactor{
		srv: s.etcd.Server, retention: o.retention, quota: o.quota, sizeBound: !o.noSizeBound,
		log: o.log.With(slog.String("component", "embedetcd"), slog.String("member", s.member.Name)), stats: &s.space,
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.run(ctx)
	}()
	s.stopCompactor = func() {
		cancel()
		<-done
	}
}

// SpaceStats returns the member's database size and what its compactor
// did since the member started: compactions, NOSPACE alarms found and
// cleared. The figures are read one by one, not at one instant.
func (s *Server) SpaceStats() SpaceStats {
	st := s.space.snapshot()
	be := s.etcd.Server.Backend()
	st.DBSize, st.DBSizeInUse = be.Size(), be.SizeInUse()
	return st
}

// lockDir takes an exclusive lock on a file in dir and returns the open
// file that holds it; closing the file releases it. If another member
// holds it, lockDir fails at once with a *LockedError.
func lockDir(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, lockFile), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("embedetcd: lock data directory: %w", err)
	}
	locked, err := tryLock(f)
	switch {
	case err != nil:
		f.Close()
		return nil, fmt.Errorf("embedetcd: lock data directory %s: %w", dir, err)
	case locked:
		f.Close()
		return nil, &LockedError{Dir: dir}
	}
	return f, nil
}

// chmodSockets makes a Socket member's sockets 0600. Until then the data
// directory's 0700 keeps other users out.
func (s *Server) chmodSockets() error {
	if !s.member.Socket {
		return nil
	}
	for _, name := range []string{clientSock, peerSock} {
		if err := os.Chmod(filepath.Join(s.member.Dir, name), 0o600); err != nil {
			return fmt.Errorf("embedetcd: member %s: %w", s.member.Name, err)
		}
	}
	return nil
}

func (m Member) clientURL() *url.URL {
	if m.Socket {
		return &url.URL{Scheme: "unix", Path: filepath.Join(m.Dir, clientSock)}
	}
	return loopbackURL(m.ClientPort)
}

func (m Member) peerURL() *url.URL {
	if m.Socket {
		return &url.URL{Scheme: "unix", Path: filepath.Join(m.Dir, peerSock)}
	}
	return loopbackURL(m.PeerPort)
}

// Member returns the member description with its ports filled in, so that
// the same member can be started again with Start or StartCluster.
func (s *Server) Member() Member { return s.member }

// Endpoint returns the member's client URL, such as
// "http://127.0.0.1:2379" or, with Member.Socket,
// "unix:///var/lib/fencer/etcd.sock".
func (s *Server) Endpoint() string { return s.member.clientURL().String() }

// Client returns a client of this member that calls its gRPC services in
// process (etcd's v3client): no socket, no second serialization. It serves
// the KV, Lease, Watch, Maintenance, Cluster and Auth APIs as a client over
// the member's endpoint does, with the same errors and the same quota
// (NOSPACE) checks, but it bypasses the gRPC server's interceptors and
// authentication: it acts as the member's root. It has no endpoints, and
// works only while the member runs; close it before the member.
func (s *Server) Client() *clientv3.Client { return v3client.New(s.etcd.Server) }

// IsLeader reports whether this member is currently the raft leader.
func (s *Server) IsLeader() bool {
	return s.etcd.Server.Leader() == s.etcd.Server.MemberID()
}

// Close stops the member and waits for it to release its ports and data
// directory. It is safe to call more than once.
func (s *Server) Close() {
	s.once.Do(func() {
		if s.stopCompactor != nil {
			s.stopCompactor()
		}
		s.logs.closing.Store(true)
		s.etcd.Close()
		select {
		case <-s.etcd.Server.StopNotify():
		case <-time.After(10 * time.Second):
		}
		s.lock.Close()
	})
}

// Err reports a fatal error of the running member, such as a failure to
// serve a listener; it is never closed otherwise.
func (s *Server) Err() <-chan error { return s.etcd.Err() }

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

// pickFreePorts sets each of ports to a distinct free loopback port.
func pickFreePorts(ports []*int) error {
	free, release, err := freeport.Take(len(ports))
	if err != nil {
		return fmt.Errorf("embedetcd: %w", err)
	}
	release()
	for i, p := range ports {
		*p = free[i]
	}
	return nil
}
