package etcdproc

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/etcdmain"
	"go.uber.org/zap"

	"github.com/fencer-dev/fencer/internal/freeport"
	"github.com/fencer-dev/fencer/internal/testkit/faultproxy"
	"github.com/fencer-dev/fencer/internal/testkit/testca"
)

// MemberEnv marks a process started as a member; its value is the
// member's name. A test binary whose TestMain calls RunIfMember is an etcd
// binary for any child it starts with MemberEnv set, such as the etcd of
// controller-runtime's envtest.
const MemberEnv = "FENCER_ETCDPROC_MEMBER"

// RunIfMember runs etcd and exits if this process was started by Start as
// a cluster member, with the process's arguments as etcd's flags. Otherwise
// it returns at once. Call it before anything else in TestMain.
func RunIfMember() {
	if os.Getenv(MemberEnv) == "" {
		return
	}
	etcdmain.Main(os.Args)
	os.Exit(0)
}

// Cluster is a running etcd cluster of member processes.
type Cluster struct {
	exe     string
	initial string // --initial-cluster
	members []*member
	admin   *clientv3.Client
	tls     *clientTLS // nil: plaintext clients
}

// Option configures Start.
type Option func(*options)

type options struct {
	ca *testca.CA
}

// WithClientTLS makes the members serve clients over TLS only, with
// serving certificates issued by ca for 127.0.0.1, and accept only client
// certificates issued by ca (etcd's --client-cert-auth). Endpoints then
// returns https:// URLs. Raft traffic between members stays plaintext.
// The cluster's own client presents a certificate for the user "root", so
// it keeps working after EnableAuth.
func WithClientTLS(ca *testca.CA) Option { return func(o *options) { o.ca = ca } }

// clientTLS holds the files of a cluster started WithClientTLS.
type clientTLS struct {
	ca                *testca.CA
	caFile            string
	certFile, keyFile string // the members' serving key pair
	admin             *tls.Config
}

type member struct {
	name                 string
	dir                  string
	clientPort, peerPort int
	peer                 *faultproxy.Proxy // the advertised peer URL
	id                   uint64

	mu     sync.Mutex
	proc   *os.Process // nil while stopped
	exited chan struct{}
	log    *os.File
}

// TB is the part of testing.TB that Start uses, so that fencertest.TB
// serves as well.
type TB interface {
	Helper()
	Cleanup(f func())
	Fatalf(format string, args ...any)
	TempDir() string
}

// Start starts an n-member cluster in temporary directories of tb, waits
// until every member serves and a leader is elected, and stops it when tb
// ends. A failure to start calls tb.Fatalf.
func Start(tb TB, n int, opts ...Option) *Cluster {
	tb.Helper()
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	exe, err := os.Executable()
	if err != nil {
		tb.Fatalf("etcdproc: %v", err)
	}
	c := &Cluster{exe: exe}
	dir := tb.TempDir()
	tb.Cleanup(c.stop) // before the directory is removed
	if o.ca != nil {
		c.tls = newClientTLS(tb, o.ca, dir)
	}
	// Every member exists before the first proxy, whose sourceOf reads them.
	ports, release, err := freeport.Take(2 * n)
	if err != nil {
		tb.Fatalf("etcdproc: %v", err)
	}
	for i := range n {
		m := &member{name: fmt.Sprintf("m%d", i+1), dir: filepath.Join(dir, fmt.Sprintf("m%d", i+1))}
		m.clientPort, m.peerPort = ports[2*i], ports[2*i+1]
		if err := os.MkdirAll(m.dir, 0o700); err != nil {
			tb.Fatalf("etcdproc: %v", err)
		}
		c.members = append(c.members, m)
	}
	var initial []string
	for _, m := range c.members {
		m.peer = faultproxy.New(tb, hostPort(m.peerPort), faultproxy.WithSource(c.sourceOf))
		initial = append(initial, m.name+"="+m.peer.Endpoint())
	}
	// The proxies listen while the members' ports are still held, so that
	// none of them can take a member's port.
	release()
	c.initial = strings.Join(initial, ",")
	for _, m := range c.members {
		if err := c.spawn(m); err != nil {
			tb.Fatalf("etcdproc: %v", err)
		}
	}
	if c.admin, err = c.client(c.Endpoints()); err != nil {
		tb.Fatalf("etcdproc: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, m := range c.members {
		if err := c.waitServing(ctx, m); err != nil {
			log, _ := os.ReadFile(m.log.Name())
			tb.Fatalf("etcdproc: member %s did not start: %v; its log:\n%s", m.name, err, log)
		}
	}
	if _, err := c.Leader(ctx); err != nil {
		tb.Fatalf("etcdproc: %v", err)
	}
	return c
}

// spawn starts m's process. etcd ignores the initial cluster flags when
// m's data directory already holds a member.
func (c *Cluster) spawn(m *member) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.proc != nil {
		return fmt.Errorf("etcdproc: member %s is running", m.name)
	}
	if m.log == nil {
		f, err := os.Create(filepath.Join(m.dir, "..", m.name+".log"))
		if err != nil {
			return err
		}
		m.log = f
	}
	cu := c.endpoint(m)
	args := []string{
		"--name=" + m.name,
		"--data-dir=" + filepath.Join(m.dir, "data"),
		"--listen-client-urls=" + cu,
		"--advertise-client-urls=" + cu,
		"--listen-peer-urls=http://" + hostPort(m.peerPort),
		"--initial-advertise-peer-urls=" + m.peer.Endpoint(),
		"--initial-cluster=" + c.initial,
		"--initial-cluster-state=new",
		"--initial-cluster-token=fencer-chaos",
		// embedetcd's timing, so that elections are quick on loopback.
		"--heartbeat-interval=50",
		"--election-timeout=500",
		"--logger=zap",
		"--log-level=warn",
		"--log-outputs=stderr",
		// The least bcrypt cost etcd takes, so that EnableAuth's users
		// authenticate quickly.
		"--bcrypt-cost=4",
		// What docs/operations.md asks of an external etcd, so that
		// Txns at the service's documented limits commit
		// (embedetcd.MaxTxnOps).
		"--max-txn-ops=258",
	}
	if c.tls != nil {
		args = append(args,
			"--cert-file="+c.tls.certFile,
			"--key-file="+c.tls.keyFile,
			"--trusted-ca-file="+c.tls.caFile,
			"--client-cert-auth",
		)
	}
	cmd := exec.Command(c.exe, args...)
	cmd.Env = append(os.Environ(), MemberEnv+"="+m.name)
	cmd.Stdout, cmd.Stderr = m.log, m.log
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("etcdproc: start member %s: %w", m.name, err)
	}
	m.proc = cmd.Process
	m.exited = make(chan struct{})
	go func(exited chan struct{}) {
		_ = cmd.Wait()
		close(exited)
	}(m.exited)
	return nil
}

// waitServing waits until m answers a Status request.
func (c *Cluster) waitServing(ctx context.Context, m *member) error {
	for {
		sctx, cancel := context.WithTimeout(ctx, time.Second)
		resp, err := c.admin.Status(sctx, c.endpoint(m))
		cancel()
		if err == nil {
			m.id = resp.Header.MemberId
			return nil
		}
		m.mu.Lock()
		exited := m.exited
		m.mu.Unlock()
		select {
		case <-ctx.Done():
			return fmt.Errorf("etcdproc: member %s: %w (last: %v)", m.name, ctx.Err(), err)
		case <-exited:
			return fmt.Errorf("etcdproc: member %s exited", m.name)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Len returns the number of members.
func (c *Cluster) Len() int { return len(c.members) }

// Name returns the name of member i.
func (c *Cluster) Name(i int) string { return c.members[i].name }

// Endpoints returns the members' client URLs, for clients that connect
// directly.
func (c *Cluster) Endpoints() []string {
	eps := make([]string, len(c.members))
	for i, m := range c.members {
		eps[i] = c.endpoint(m)
	}
	return eps
}

// CAFile returns the file of the CA certificate that verifies the
// members, or "" for a plaintext cluster.
func (c *Cluster) CAFile() string {
	if c.tls == nil {
		return ""
	}
	return c.tls.caFile
}

// ClientAddr returns member i's client "host:port", for a proxy in front
// of it. It stays the same across restarts.
func (c *Cluster) ClientAddr(i int) string { return hostPort(c.members[i].clientPort) }

func (c *Cluster) endpoint(m *member) string {
	if c.tls != nil {
		return "https://" + hostPort(m.clientPort)
	}
	return "http://" + hostPort(m.clientPort)
}

// client returns a client of endpoints that presents the cluster's root
// certificate when the cluster has client TLS.
func (c *Cluster) client(endpoints []string) (*clientv3.Client, error) {
	cfg := clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()}
	if c.tls != nil {
		cfg.TLS = c.tls.admin.Clone()
	}
	return clientv3.New(cfg)
}

// Kill kills member i's process with SIGKILL and waits for it to exit.
// Killing a stopped member does nothing.
func (c *Cluster) Kill(i int) {
	m := c.members[i]
	m.mu.Lock()
	proc, exited := m.proc, m.exited
	m.proc = nil
	m.mu.Unlock()
	if proc == nil {
		return
	}
	_ = proc.Signal(syscall.SIGKILL)
	<-exited
}

// Restart starts member i again on its data directory and ports, and
// waits until it serves or ctx ends.
func (c *Cluster) Restart(ctx context.Context, i int) error {
	m := c.members[i]
	if err := c.spawn(m); err != nil {
		return err
	}
	return c.waitServing(ctx, m)
}

// Leader returns the index of the raft leader: the member that a majority
// of the members, itself included, name as leader. It waits while there is
// none until ctx ends.
func (c *Cluster) Leader(ctx context.Context) (int, error) {
	for {
		votes := make(map[uint64]int)
		self := make(map[uint64]bool)
		for _, m := range c.members {
			sctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
			resp, err := c.admin.Status(sctx, c.endpoint(m))
			cancel()
			if err != nil || resp.Leader == 0 {
				continue
			}
			votes[resp.Leader]++
			if resp.Leader == resp.Header.MemberId {
				self[resp.Leader] = true
			}
		}
		for i, m := range c.members {
			if self[m.id] && votes[m.id] > len(c.members)/2 {
				return i, nil
			}
		}
		select {
		case <-ctx.Done():
			return -1, fmt.Errorf("etcdproc: no leader: %w", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// MoveLeader transfers raft leadership to member to, through the current
// leader's maintenance API, and returns when etcd reports it done.
func (c *Cluster) MoveLeader(ctx context.Context, to int) error {
	l, err := c.Leader(ctx)
	if err != nil {
		return err
	}
	if l == to {
		return nil
	}
	cli, err := c.client([]string{c.endpoint(c.members[l])})
	if err != nil {
		return err
	}
	defer cli.Close()
	if _, err := cli.MoveLeader(ctx, c.members[to].id); err != nil {
		return fmt.Errorf("etcdproc: move leader %s -> %s: %w", c.members[l].name, c.members[to].name, err)
	}
	return nil
}

// CanIsolate reports whether Isolate cuts a member off in both directions
// on this system. Where it cannot tell which member opened a connection
// (outside Linux), Isolate cuts only the connections to the member.
const CanIsolate = canIsolate

// Isolate partitions member i from the other members: raft messages stop
// in both directions until Heal. Clients still reach every member.
func (c *Cluster) Isolate(i int) {
	for j, m := range c.members {
		if j == i {
			m.peer.Isolate()
		} else {
			m.peer.Isolate(c.members[i].name)
		}
	}
}

// Heal ends every partition made by Isolate.
func (c *Cluster) Heal() {
	for _, m := range c.members {
		m.peer.Heal()
	}
}

// sourceOf names the member whose process opened conn, an accepted peer
// connection, or "" if none did.
func (c *Cluster) sourceOf(conn net.Conn) string {
	pids := make(map[int]string, len(c.members))
	for _, m := range c.members {
		m.mu.Lock()
		if m.proc != nil {
			pids[m.proc.Pid] = m.name
		}
		m.mu.Unlock()
	}
	return pids[dialer(conn, pids)]
}

// stop kills every member and closes the admin client.
func (c *Cluster) stop() {
	for i := range c.members {
		c.Kill(i)
	}
	for _, m := range c.members {
		if m.log != nil {
			m.log.Close()
		}
	}
	if c.admin != nil {
		c.admin.Close()
	}
}

func hostPort(port int) string {
	return (&url.URL{Host: net.JoinHostPort("127.0.0.1", fmt.Sprint(port))}).Host
}
