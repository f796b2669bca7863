package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/fencer-dev/fencer/client"
	"github.com/fencer-dev/fencer/etcdstore"
	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
)

// The scale benchmarks measure how fencer serve's costs grow with the
// work it holds, through the binary: each point starts the built fencer
// serve on an embedded etcd, drives it with the Go client, and reads the
// server process's RSS (/proc/<pid>/status VmRSS), CPU (/proc/<pid>/stat)
// and its Prometheus metrics (go_goroutines, fencer_server_keepalives_total).
// It also reads etcd's own lease-renewal counter on the embedded member's
// unix socket. Each point runs beside its baseline, on a fresh server of its own: the
// same work done with etcd's own client straight on that server's embedded
// etcd. They print Markdown tables with a least-squares growth rate, and,
// with FENCER_SCALE_DOCS set to a directory, draw each curve there as an
// SVG (make bench draws docs/scale-*.svg). FENCER_SCALE_MAX caps the
// leases (or streams) of a point measured (for a quick look). Use -benchtime 1x: an iteration is a
// whole curve, and the largest points take minutes.

// scaleTTL is the sessions' TTL: the default, renewed every third of it.
const scaleTTL = 10 * time.Second

// scaleWorkers is how many goroutines acquire, in every arm.
const scaleWorkers = 32

// scaleMax is FENCER_SCALE_MAX, or no cap.
func scaleMax(b *testing.B) int {
	v := os.Getenv("FENCER_SCALE_MAX")
	if v == "" {
		return math.MaxInt
	}
	n, err := strconv.Atoi(v)
	require.NoError(b, err, "FENCER_SCALE_MAX")
	return n
}

// scaleServer is a fencer serve process on an embedded etcd, with its
// metrics served.
type scaleServer struct {
	b       *testing.B
	cmd     *exec.Cmd
	exited  chan error
	log     *safeBuffer
	addr    string
	metrics string
	etcd    string // the embedded member's client endpoint
	conns   []*grpc.ClientConn
}

func freeTCPAddr(b *testing.B) string {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(b, err)
	defer lis.Close()
	return lis.Addr().String()
}

var etcdEndpointRE = regexp.MustCompile(`msg="embedded etcd".* endpoint=(\S+)`)

// startScaleServer starts fencer serve and returns once it serves.
func startScaleServer(b *testing.B) *scaleServer {
	b.Helper()
	s := &scaleServer{b: b, log: &safeBuffer{}, addr: freeTCPAddr(b), metrics: freeTCPAddr(b), exited: make(chan error, 1)}
	s.cmd = exec.Command(fencerBinary(b), "serve", "--listen", s.addr, "--metrics-listen", s.metrics,
		"--data-dir", b.TempDir(), "--shutdown-grace", "2s")
	s.cmd.Env = cleanEnv()
	s.cmd.Stdout, s.cmd.Stderr = s.log, s.log
	require.NoError(b, s.cmd.Start())
	go func() { s.exited <- s.cmd.Wait() }()
	require.Eventually(b, func() bool {
		return strings.Contains(s.log.String(), `msg="etcd reachable: serving"`)
	}, 60*time.Second, 20*time.Millisecond, "fencer serve did not start: %s", s.log)
	m := etcdEndpointRE.FindStringSubmatch(s.log.String())
	require.NotNil(b, m, "fencer serve logged no embedded etcd endpoint: %s", s.log)
	s.etcd = strings.Trim(m[1], `"`)
	return s
}

// stop closes the server's client connections and stops it with SIGTERM.
func (s *scaleServer) stop() {
	for _, cc := range s.conns {
		_ = cc.Close()
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(30 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.exited
		s.b.Errorf("fencer serve ignored SIGTERM")
	}
}

// clients returns n Go clients of the server, each on a connection of
// its own, as n client processes would have.
func (s *scaleServer) clients(n int) []*client.Client {
	cs := make([]*client.Client, n)
	for i := range cs {
		cc, err := grpc.NewClient(s.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		require.NoError(s.b, err)
		s.conns = append(s.conns, cc)
		cs[i] = client.New(cc)
	}
	return cs
}

// etcdClient returns an etcd client of the server's embedded member,
// closed when the benchmark ends.
func (s *scaleServer) etcdClient() *clientv3.Client {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{s.etcd}, DialTimeout: 10 * time.Second, Logger: zap.NewNop()})
	require.NoError(s.b, err)
	return cli
}

// rssMB is the server's resident set, in MB.
func (s *scaleServer) rssMB() float64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", s.cmd.Process.Pid))
	require.NoError(s.b, err)
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			require.NoError(s.b, err)
			return kb / 1024
		}
	}
	s.b.Fatal("no VmRSS")
	return 0
}

// cpu is the CPU time, user and system, the server has used.
func (s *scaleServer) cpu() time.Duration {
	t := processCPU(s.cmd.Process.Pid)
	require.GreaterOrEqual(s.b, t, time.Duration(0), "no CPU time of the server in /proc")
	return t
}

// metric is the value of an unlabelled metric on the server's /metrics.
func (s *scaleServer) metric(name string) float64 {
	return scrape(s.b, &http.Transport{DisableKeepAlives: true}, "http://"+s.metrics+"/metrics", name)
}

// etcdMetric is the value of an unlabelled metric of the embedded etcd,
// which serves /metrics on its unix socket.
func (s *scaleServer) etcdMetric(name string) float64 {
	sock, ok := strings.CutPrefix(s.etcd, "unix://")
	require.True(s.b, ok, "embedded etcd endpoint %q is not a unix socket", s.etcd)
	tr := &http.Transport{DisableKeepAlives: true, DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}
	return scrape(s.b, tr, "http://etcd/metrics", name)
}

// scrape reads the unlabelled metric name from the Prometheus text at url.
func scrape(b *testing.B, tr *http.Transport, url, name string) float64 {
	m, err := readMetrics(&http.Client{Timeout: 30 * time.Second, Transport: tr}, url)
	require.NoError(b, err)
	v, ok := m[name]
	if !ok {
		b.Fatalf("no metric %s at %s", name, url)
	}
	return v
}

// readMetrics reads the unlabelled metrics of the Prometheus text at url,
// by name.
func readMetrics(hc *http.Client, url string) (map[string]float64, error) {
	resp, err := hc.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	m := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 || strings.HasPrefix(f[0], "#") || strings.Contains(f[0], "{") {
			continue
		}
		v, err := strconv.ParseFloat(f[1], 64)
		if err != nil {
			return nil, fmt.Errorf("GET %s: metric %s: %w", url, f[0], err)
		}
		m[f[0]] = v
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("GET %s: %w", url, err)
	}
	return m, nil
}

// settle lets the server's allocations and goroutines settle before RSS is
// read.
func settle() { time.Sleep(2 * time.Second) }

// parallel runs f(i) for i in [0, n) on scaleWorkers goroutines and
// returns the first error.
func parallel(n int, f func(i int) error) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	for w := 0; w < min(scaleWorkers, n); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				if err := f(i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	return first
}

// p99 is the 99th percentile of d, in ms.
func p99(d []time.Duration) float64 {
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	i := int(math.Ceil(0.99*float64(len(d)))) - 1
	return float64(d[max(i, 0)].Microseconds()) / 1000
}

// scalePuts is how many guarded puts a point times for its p99.
const scalePuts = 300

// sessionPoint is what one arm measured at one number of sessions.
type sessionPoint struct {
	sessions, leases int
	each             bool // a connection per session
	idleMB, rssMB    float64
	goroutines       float64
	keepalivesPerSec float64
	etcdRenewsPerSec float64 // etcd_debugging_lease_renewed_total's rate
	putP99ms         float64
	acquire          time.Duration
	lostSessions     int
}

// etcdRenewed is etcd's own count of lease renewals.
const etcdRenewed = "etcd_debugging_lease_renewed_total"

// keepaliveWindow is how long keepalive writes are counted: three renewal
// intervals.
const keepaliveWindow = scaleTTL

// sessionConns is how many client connections carry n sessions: one per
// 500, as a few processes each holding many sessions would; or, with
// each, one per session, as n processes of one session each would.
func sessionConns(n int, each bool) int {
	if each {
		return n
	}
	return n/500 + 1
}

// fencerSessions opens n sessions through fencer serve, k leases each,
// from sessionConns(n, each) client connections, and measures the server.
func fencerSessions(b *testing.B, n, k int, each bool) sessionPoint {
	ctx := context.Background()
	srv := startScaleServer(b)
	defer srv.stop()
	p := sessionPoint{sessions: n, leases: k, each: each, idleMB: srv.rssMB()}
	cs := srv.clients(sessionConns(n, each))
	sessions := make([]*client.Session, n)
	leases := make([]*client.Lease, n)
	for i := range sessions {
		s, err := cs[i%len(cs)].NewSession(client.WithTTL(scaleTTL))
		require.NoError(b, err)
		sessions[i] = s
	}
	defer func() {
		_ = parallel(n, func(i int) error {
			cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			_ = sessions[i].Close(cctx)
			return nil
		})
	}()
	start := time.Now()
	require.NoError(b, parallel(n, func(i int) error {
		for j := 0; j < k; j++ {
			l, err := sessions[i].Acquire(ctx, fmt.Sprintf("s%d-l%d", i, j))
			if err != nil {
				return fmt.Errorf("session %d lease %d: %w", i, j, err)
			}
			if j == 0 {
				leases[i] = l
			}
		}
		return nil
	}))
	p.acquire = time.Since(start)
	settle()
	k0, e0, t0 := srv.metric("fencer_server_keepalives_total"), srv.etcdMetric(etcdRenewed), time.Now()
	time.Sleep(keepaliveWindow)
	p.keepalivesPerSec = (srv.metric("fencer_server_keepalives_total") - k0) / time.Since(t0).Seconds()
	p.etcdRenewsPerSec = (srv.etcdMetric(etcdRenewed) - e0) / time.Since(t0).Seconds()
	p.rssMB, p.goroutines = srv.rssMB(), srv.metric("go_goroutines")
	p.putP99ms = timePuts(b, func() error {
		_, err := cs[0].Put(ctx, leases[0].Token(), "scale/put", []byte("value"))
		return err
	})
	for _, s := range sessions {
		select {
		case <-s.Done():
			p.lostSessions++
		default:
		}
	}
	return p
}

// timePuts runs put scalePuts times, one at a time, and returns the p99.
func timePuts(b *testing.B, put func() error) float64 {
	d := make([]time.Duration, scalePuts)
	for i := range d {
		t0 := time.Now()
		require.NoError(b, put())
		d[i] = time.Since(t0)
	}
	return p99(d)
}

// directSessions is fencerSessions' baseline: n etcd concurrency.Sessions
// (an etcd lease each, kept alive by the etcd client) holding k
// concurrency.Mutex locks each, straight on the server's embedded etcd,
// from sessionConns(n, each) etcd clients; its guarded put is a Txn under the first
// lock's IsOwner compare. The server's process hosts the etcd and serves
// nothing else. Keepalive writes are counted as the renewals the etcd
// client receives.
func directSessions(b *testing.B, n, k int, each bool) sessionPoint {
	ctx := context.Background()
	srv := startScaleServer(b)
	defer srv.stop()
	p := sessionPoint{sessions: n, leases: k, each: each, idleMB: srv.rssMB()}
	clis := make([]*clientv3.Client, sessionConns(n, each))
	for i := range clis {
		clis[i] = srv.etcdClient()
	}
	defer func() {
		for _, cli := range clis {
			_ = cli.Close()
		}
	}()
	kctx, stopKeep := context.WithCancel(ctx)
	var renewals atomic.Int64
	var drains sync.WaitGroup
	defer func() {
		stopKeep()
		drains.Wait()
	}()
	sessions := make([]*concurrency.Session, n)
	first := make([]*concurrency.Mutex, n)
	start := time.Now()
	require.NoError(b, parallel(n, func(i int) error {
		cli := clis[i%len(clis)]
		g, err := cli.Grant(ctx, int64(scaleTTL/time.Second))
		if err != nil {
			return err
		}
		ch, err := cli.KeepAlive(kctx, g.ID) // shares the session's renewals: one per lease and interval
		if err != nil {
			return err
		}
		drains.Add(1)
		go func() {
			defer drains.Done()
			for range ch {
				renewals.Add(1)
			}
		}()
		s, err := concurrency.NewSession(cli, concurrency.WithLease(g.ID), concurrency.WithContext(kctx))
		if err != nil {
			return err
		}
		sessions[i] = s
		for j := 0; j < k; j++ {
			m := concurrency.NewMutex(s, fmt.Sprintf("/scale/direct/s%d-l%d", i, j))
			if err := m.Lock(ctx); err != nil {
				return err
			}
			if j == 0 {
				first[i] = m
			}
		}
		return nil
	}))
	p.acquire = time.Since(start)
	settle()
	r0, e0, t0 := renewals.Load(), srv.etcdMetric(etcdRenewed), time.Now()
	time.Sleep(keepaliveWindow)
	p.keepalivesPerSec = float64(renewals.Load()-r0) / time.Since(t0).Seconds()
	p.etcdRenewsPerSec = (srv.etcdMetric(etcdRenewed) - e0) / time.Since(t0).Seconds()
	p.rssMB, p.goroutines = srv.rssMB(), srv.metric("go_goroutines")
	p.putP99ms = timePuts(b, func() error {
		r, err := clis[0].Txn(ctx).If(first[0].IsOwner()).Then(clientv3.OpPut("/scale/put", "value")).Commit()
		if err == nil && !r.Succeeded {
			err = errors.New("guarded put failed: lock lost")
		}
		return err
	})
	for _, s := range sessions {
		select {
		case <-s.Done():
			p.lostSessions++
		default:
		}
	}
	return p
}

// writeCharts draws each chart in FENCER_SCALE_DOCS, as scale-<File>.svg,
// if that variable is set.
func writeCharts(b *testing.B, charts ...scaleChart) {
	dir := os.Getenv("FENCER_SCALE_DOCS")
	if dir == "" {
		return
	}
	for _, c := range charts {
		out, err := c.svg()
		require.NoError(b, err)
		file := filepath.Join(dir, "scale-"+c.File+".svg")
		require.NoError(b, os.WriteFile(file, out, 0o644))
		fmt.Printf("scale: drew %s\n", file)
	}
}

func mb(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) }

func ratio(a, b float64) string {
	if b == 0 {
		return "—"
	}
	return strconv.FormatFloat(a/b, 'f', 2, 64)
}

// BenchmarkScaleSessions measures fencer serve with 1, 100, 1,000 and
// 10,000 sessions of 10 leases each, and 100 sessions of 100 leases, beside
// etcd concurrency.Sessions holding as many concurrency.Mutex locks on the
// same embedded etcd. It prints RSS above the idle server's, goroutines,
// keepalive writes reaching etcd per second, the p99 of a guarded put,
// and the growth per session. Target: RSS ≤ 64 MB at 1,000 sessions × 10.
func BenchmarkScaleSessions(b *testing.B) {
	type point struct {
		sessions, leases int
		each             bool
	}
	var points []point
	for _, pt := range []point{{1, 10, false}, {100, 10, false}, {1000, 10, false}, {100, 100, false}, {1000, 10, true}, {10000, 10, false}} {
		// 100 × 100: keepalives grow with sessions, not leases. 1,000 × 10
		// with a connection each: a Sessions stream per session, the
		// most a session costs.
		if pt.sessions*pt.leases <= scaleMax(b) {
			points = append(points, pt)
		}
	}
	if len(points) == 0 {
		b.Skip("FENCER_SCALE_MAX excludes every point")
	}
	for i := 0; i < b.N; i++ {
		var fs, ds []sessionPoint
		for _, pt := range points {
			fs = append(fs, fencerSessions(b, pt.sessions, pt.leases, pt.each))
			ds = append(ds, directSessions(b, pt.sessions, pt.leases, pt.each))
			fmt.Printf("scale: measured fencer %+v, etcd %+v\n", fs[len(fs)-1], ds[len(ds)-1])
		}
		t := scaleTable{Header: []string{"sessions × leases", "fencer RSS MB (idle)", "etcd sessions RSS MB (idle)",
			"fencer goroutines", "etcd sessions goroutines", "fencer keepalives/s", "etcd sessions keepalives/s", "etcd's lease renewals/s (fencer / etcd sessions)",
			"fencer put p99 ms", "etcd guarded Txn p99 ms", "fencer acquire s", "etcd Lock s", "sessions lost (fencer/etcd)", "RSS ≤ 64 MB"}}
		var x, fr, dr, fg, dg, fk, dk, fp, dp []float64
		for j := range fs {
			f, d := fs[j], ds[j]
			target, conns := "", ""
			if f.sessions == 1000 && f.leases == 10 {
				target = map[bool]string{true: "✔", false: "✘"}[f.rssMB <= 64]
			}
			if f.each {
				conns = ", a connection each"
			}
			t.Rows = append(t.Rows, []string{fmt.Sprintf("%d × %d%s", f.sessions, f.leases, conns),
				fmt.Sprintf("%s (%s)", mb(f.rssMB), mb(f.idleMB)), fmt.Sprintf("%s (%s)", mb(d.rssMB), mb(d.idleMB)),
				fmt.Sprintf("%.0f", f.goroutines), fmt.Sprintf("%.0f", d.goroutines),
				fmt.Sprintf("%.1f", f.keepalivesPerSec), fmt.Sprintf("%.1f", d.keepalivesPerSec),
				fmt.Sprintf("%.1f / %.1f", f.etcdRenewsPerSec, d.etcdRenewsPerSec),
				fmt.Sprintf("%.2f", f.putP99ms), fmt.Sprintf("%.2f", d.putP99ms),
				fmt.Sprintf("%.1f", f.acquire.Seconds()), fmt.Sprintf("%.1f", d.acquire.Seconds()),
				fmt.Sprintf("%d/%d", f.lostSessions, d.lostSessions), target})
			if f.leases != 10 || f.each {
				continue
			}
			x = append(x, float64(f.sessions))
			fr, dr = append(fr, max(0, f.rssMB-f.idleMB)), append(dr, max(0, d.rssMB-d.idleMB)) // noise can take a small figure below idle
			fg, dg = append(fg, f.goroutines), append(dg, d.goroutines)
			fk, dk = append(fk, f.keepalivesPerSec), append(dk, d.keepalivesPerSec)
			fp, dp = append(fp, f.putP99ms), append(dp, d.putP99ms)
		}
		fmt.Printf("\nscale: sessions of 10 leases, through fencer serve (embedded etcd, TTL %s), from a client connection per 500 sessions (or per session, where marked) | baseline: etcd concurrency.Session per session with 10 concurrency.Mutex locks, straight on a fresh fencer serve's embedded etcd, from as many etcd clients; RSS is the server process's, its idle figure the zero point\n", scaleTTL)
		t.write(os.Stdout)
		growth := scaleTable{Header: []string{"growth per session (least squares, 10 leases each)", "fencer", "etcd sessions", "ratio"}}
		for _, g := range []struct {
			name string
			f, d []float64
			unit float64
		}{
			{"RSS above idle, KB", fr, dr, 1024}, {"goroutines", fg, dg, 1},
			{"keepalive writes/s", fk, dk, 1}, {"put p99, µs", fp, dp, 1000},
		} {
			sf, sd := slope(x, g.f)*g.unit, slope(x, g.d)*g.unit
			growth.Rows = append(growth.Rows, []string{g.name, fmt.Sprintf("%.3g", sf), fmt.Sprintf("%.3g", sd), ratio(sf, sd)})
		}
		growth.write(os.Stdout)
		const fl, dl = "fencer", "etcd concurrency.Session"
		writeCharts(b,
			scaleChart{File: "sessions-rss", Title: "Server RSS above idle, sessions of 10 leases", XLabel: "sessions", YLabel: "MB", Series: []scaleSeries{{fl, x, fr}, {dl, x, dr}}},
			scaleChart{File: "sessions-goroutines", Title: "Server goroutines, sessions of 10 leases", XLabel: "sessions", YLabel: "goroutines", Series: []scaleSeries{{fl, x, fg}, {dl, x, dg}}},
			scaleChart{File: "sessions-keepalives", Title: "Keepalive writes reaching etcd", XLabel: "sessions", YLabel: "writes/s", Series: []scaleSeries{{fl, x, fk}, {dl, x, dk}}},
			scaleChart{File: "sessions-put-p99", Title: "Guarded put p99", XLabel: "sessions", YLabel: "ms", Series: []scaleSeries{{fl, x, fp}, {dl + " Txn", x, dp}}})
	}
	b.ReportMetric(0, "ns/op")
}

// leasePoint is what one arm measured holding n leases.
type leasePoint struct {
	leases        int
	idleMB, rssMB float64
	acquire       time.Duration
}

// BenchmarkScaleLeases measures fencer serve holding 10,000 and 100,000
// leases in one session, acquired by 32 goroutines, beside one etcd
// concurrency.Session holding as many concurrency.Mutex locks on the same
// embedded etcd, also by 32 goroutines. It prints the server's RSS, the
// time to acquire them all and the growth per lease.
func BenchmarkScaleLeases(b *testing.B) {
	var sizes []int
	for _, n := range []int{10000, 100000} {
		if n <= scaleMax(b) {
			sizes = append(sizes, n)
		}
	}
	if len(sizes) == 0 {
		b.Skip("FENCER_SCALE_MAX excludes every point")
	}
	ctx := context.Background()
	for i := 0; i < b.N; i++ {
		var fs, ds []leasePoint
		for _, n := range sizes {
			fs = append(fs, func() leasePoint {
				srv := startScaleServer(b)
				defer srv.stop()
				p := leasePoint{leases: n, idleMB: srv.rssMB()}
				s, err := srv.clients(1)[0].NewSession(client.WithTTL(scaleTTL))
				require.NoError(b, err)
				defer func() {
					cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
					defer cancel()
					_ = s.Close(cctx)
				}()
				start := time.Now()
				require.NoError(b, parallel(n, func(j int) error {
					_, err := s.Acquire(ctx, "l"+strconv.Itoa(j))
					return err
				}))
				p.acquire = time.Since(start)
				settle()
				p.rssMB = srv.rssMB()
				return p
			}())
			ds = append(ds, func() leasePoint {
				srv := startScaleServer(b)
				defer srv.stop()
				p := leasePoint{leases: n, idleMB: srv.rssMB()}
				cli := srv.etcdClient()
				defer cli.Close()
				s, err := concurrency.NewSession(cli, concurrency.WithTTL(int(scaleTTL/time.Second)))
				require.NoError(b, err)
				defer s.Close()
				start := time.Now()
				require.NoError(b, parallel(n, func(j int) error {
					return concurrency.NewMutex(s, "/scale/direct/l"+strconv.Itoa(j)).Lock(ctx)
				}))
				p.acquire = time.Since(start)
				settle()
				p.rssMB = srv.rssMB()
				return p
			}())
		}
		t := scaleTable{Header: []string{"leases held", "fencer RSS MB (idle)", "etcd Mutex RSS MB (idle)", "fencer acquire all, s", "etcd Lock all, s", "time ratio"}}
		var x, fr, dr, fa, da []float64
		for j := range fs {
			f, d := fs[j], ds[j]
			t.Rows = append(t.Rows, []string{strconv.Itoa(f.leases), fmt.Sprintf("%s (%s)", mb(f.rssMB), mb(f.idleMB)), fmt.Sprintf("%s (%s)", mb(d.rssMB), mb(d.idleMB)),
				fmt.Sprintf("%.1f", f.acquire.Seconds()), fmt.Sprintf("%.1f", d.acquire.Seconds()), ratio(f.acquire.Seconds(), d.acquire.Seconds())})
			x = append(x, float64(f.leases))
			fr, dr = append(fr, max(0, f.rssMB-f.idleMB)), append(dr, max(0, d.rssMB-d.idleMB)) // noise can take a small figure below idle
			fa, da = append(fa, f.acquire.Seconds()), append(da, d.acquire.Seconds())
		}
		fmt.Printf("\nscale: leases held in one session, acquired by %d goroutines, through fencer serve (embedded etcd) | baseline: one etcd concurrency.Session holding as many concurrency.Mutex locks, %d goroutines, straight on a fresh fencer serve's embedded etcd; RSS is the server process's, its idle figure the zero point\n", scaleWorkers, scaleWorkers)
		t.write(os.Stdout)
		growth := scaleTable{Header: []string{"growth per lease (least squares)", "fencer", "etcd Mutex", "ratio"}}
		for _, g := range []struct {
			name string
			f, d []float64
			unit float64
		}{{"RSS above idle, bytes", fr, dr, 1 << 20}, {"acquire time, µs", fa, da, 1e6}} {
			sf, sd := slope(x, g.f)*g.unit, slope(x, g.d)*g.unit
			growth.Rows = append(growth.Rows, []string{g.name, fmt.Sprintf("%.3g", sf), fmt.Sprintf("%.3g", sd), ratio(sf, sd)})
		}
		growth.write(os.Stdout)
		writeCharts(b,
			scaleChart{File: "leases-rss", Title: "Server RSS above idle, leases held", XLabel: "leases", YLabel: "MB", Series: []scaleSeries{{"fencer", x, fr}, {"etcd concurrency.Mutex", x, dr}}},
			scaleChart{File: "leases-acquire", Title: "Time to acquire all the leases", XLabel: "leases", YLabel: "s", Series: []scaleSeries{{"fencer", x, fa}, {"etcd concurrency.Mutex", x, da}}})
	}
	b.ReportMetric(0, "ns/op")
}

// streamPoint is what one arm measured with n watch streams open.
type streamPoint struct {
	streams       int
	idleMB, rssMB float64
	cpuPerCycle   time.Duration
}

// scaleCycles is how many acquire+release cycles a stream point times.
const scaleCycles = 300

// cycleCPU runs scaleCycles acquire+release cycles of one lease through
// the server, one at a time, and returns the server's CPU per cycle.
func cycleCPU(b *testing.B, srv *scaleServer, c *client.Client) time.Duration {
	ctx := context.Background()
	s, err := c.NewSession(client.WithTTL(scaleTTL))
	require.NoError(b, err)
	defer func() { _ = s.Close(ctx) }()
	l, err := s.Acquire(ctx, "churn")
	require.NoError(b, err)
	require.NoError(b, l.Release(ctx))
	cpu0 := srv.cpu()
	for i := 0; i < scaleCycles; i++ {
		l, err := s.Acquire(ctx, "churn")
		require.NoError(b, err)
		require.NoError(b, l.Release(ctx))
	}
	return (srv.cpu() - cpu0) / scaleCycles
}

// BenchmarkScaleWatchStreams measures fencer serve with 1, 1,000 and
// 10,000 WatchLease streams open (all on one session, from 1 client
// connection per 1,000 streams), beside as many etcd watches on the
// store's prefix straight on the same embedded etcd (a watch per stream).
// It prints the server's RSS and its CPU per acquire+release cycle of a
// lease, made through the server by another session, and each beside the
// one-stream figure.
func BenchmarkScaleWatchStreams(b *testing.B) {
	var sizes []int
	for _, n := range []int{1, 1000, 10000} {
		if n <= scaleMax(b) {
			sizes = append(sizes, n)
		}
	}
	if len(sizes) == 0 {
		b.Skip("FENCER_SCALE_MAX excludes every point")
	}
	ctx := context.Background()
	for i := 0; i < b.N; i++ {
		var fs, ds []streamPoint
		for _, n := range sizes {
			fs = append(fs, func() streamPoint {
				srv := startScaleServer(b)
				defer srv.stop()
				p := streamPoint{streams: n, idleMB: srv.rssMB()}
				cs := srv.clients(n/1000 + 1)
				s, err := cs[0].NewSession(client.WithTTL(scaleTTL))
				require.NoError(b, err)
				defer func() { _ = s.Close(ctx) }()
				_, err = s.Acquire(ctx, "held")
				require.NoError(b, err)
				sctx, stop := context.WithCancel(ctx)
				defer stop()
				require.NoError(b, parallel(n, func(j int) error {
					st, err := fencerv1.NewFencerServiceClient(srv.conns[j%len(srv.conns)]).WatchLease(sctx, &fencerv1.WatchLeaseRequest{SessionId: s.ID()})
					if err != nil {
						return err
					}
					r, err := st.Recv()
					if err == nil && r.GetType() != fencerv1.WatchLeaseResponse_TYPE_SYNCED {
						err = fmt.Errorf("first WatchLease message %v, want SYNCED", r.GetType())
					}
					return err
				}))
				settle()
				p.rssMB = srv.rssMB()
				p.cpuPerCycle = cycleCPU(b, srv, cs[0])
				return p
			}())
			ds = append(ds, func() streamPoint {
				srv := startScaleServer(b)
				defer srv.stop()
				p := streamPoint{streams: n, idleMB: srv.rssMB()}
				cli := srv.etcdClient()
				defer cli.Close()
				wctx, stop := context.WithCancel(ctx)
				defer stop()
				var watches []clientv3.WatchChan
				for j := 0; j < n; j++ {
					watches = append(watches, cli.Watch(clientv3.WithRequireLeader(wctx), etcdstore.DefaultPrefix, clientv3.WithPrefix(), clientv3.WithCreatedNotify()))
				}
				for _, w := range watches {
					select {
					case r := <-w:
						require.True(b, r.Created, "etcd watch not created: %v", r.Err())
					case <-time.After(60 * time.Second):
						b.Fatal("etcd watch not created within 60s")
					}
				}
				var drains sync.WaitGroup
				for _, w := range watches {
					drains.Add(1)
					go func() {
						defer drains.Done()
						for range w {
						}
					}()
				}
				defer func() {
					stop()
					drains.Wait()
				}()
				settle()
				p.rssMB = srv.rssMB()
				p.cpuPerCycle = cycleCPU(b, srv, srv.clients(1)[0])
				return p
			}())
		}
		t := scaleTable{Header: []string{"streams", "fencer RSS MB (idle)", "etcd watches RSS MB (idle)",
			"fencer CPU µs/cycle (× 1 stream)", "etcd watches CPU µs/cycle (× 1 watch)"}}
		var x, fr, dr, fc, dc []float64
		for j := range fs {
			f, d := fs[j], ds[j]
			us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1000 }
			t.Rows = append(t.Rows, []string{strconv.Itoa(f.streams),
				fmt.Sprintf("%s (%s)", mb(f.rssMB), mb(f.idleMB)), fmt.Sprintf("%s (%s)", mb(d.rssMB), mb(d.idleMB)),
				fmt.Sprintf("%.0f (%s)", us(f.cpuPerCycle), ratio(us(f.cpuPerCycle), us(fs[0].cpuPerCycle))),
				fmt.Sprintf("%.0f (%s)", us(d.cpuPerCycle), ratio(us(d.cpuPerCycle), us(ds[0].cpuPerCycle)))})
			x = append(x, float64(f.streams))
			fr, dr = append(fr, max(0, f.rssMB-f.idleMB)), append(dr, max(0, d.rssMB-d.idleMB)) // noise can take a small figure below idle
			fc, dc = append(fc, us(f.cpuPerCycle)), append(dc, us(d.cpuPerCycle))
		}
		fmt.Printf("\nscale: WatchLease streams on one session through fencer serve (embedded etcd); CPU is the server process's per acquire+release cycle (%d cycles by another session through the server) | baseline: as many etcd watches on the store's prefix straight on a fresh fencer serve's embedded etcd (a watch per stream), the same cycles through the server; RSS is the server process's, its idle figure the zero point\n", scaleCycles)
		t.write(os.Stdout)
		growth := scaleTable{Header: []string{"growth per stream (least squares)", "fencer", "etcd watches", "ratio"}}
		for _, g := range []struct {
			name string
			f, d []float64
			unit float64
		}{{"RSS above idle, KB", fr, dr, 1024}, {"CPU per cycle, µs", fc, dc, 1}} {
			sf, sd := slope(x, g.f)*g.unit, slope(x, g.d)*g.unit
			growth.Rows = append(growth.Rows, []string{g.name, fmt.Sprintf("%.3g", sf), fmt.Sprintf("%.3g", sd), ratio(sf, sd)})
		}
		growth.write(os.Stdout)
		writeCharts(b,
			scaleChart{File: "streams-rss", Title: "Server RSS above idle, watch streams", XLabel: "streams", YLabel: "MB", Series: []scaleSeries{{"fencer WatchLease", x, fr}, {"etcd watch per stream", x, dr}}},
			scaleChart{File: "streams-cpu", Title: "Server CPU per acquire+release cycle", XLabel: "streams", YLabel: "µs", Series: []scaleSeries{{"fencer WatchLease", x, fc}, {"etcd watch per stream", x, dc}}})
	}
	b.ReportMetric(0, "ns/op")
}
