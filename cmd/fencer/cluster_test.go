package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/fencer-dev/fencer/client"
	"github.com/fencer-dev/fencer/etcdstore"
	"github.com/fencer-dev/fencer/internal/testkit/etcdproc"
	"github.com/fencer-dev/fencer/internal/testkit/testca"
	"github.com/fencer-dev/fencer/token"
)

var clusterLong = flag.Bool("etcdcluster.long", false, "run TestServeEtcdCluster's faults for many rounds instead of one")

// etcdUser is the etcd user fencer serve logs in as in the cluster test;
// its role may use only fencer's default prefix.
const etcdUser, etcdPassword = "fencer", "fencer-etcd-password"

// replica is one fencer serve process.
type replica struct {
	addr   string
	stderr *safeBuffer
	cli    *client.Client
}

// buildFencer builds the fencer binary into dir and returns its path.
func buildFencer(t *testing.T, dir string) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	require.NoError(t, err)
	bin := filepath.Join(dir, "fencer")
	out, err := exec.Command(goBin, "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	return bin
}

// startReplica runs bin as fencer serve in front of cluster c, over TLS
// with a client certificate and as etcdUser, until the test ends, and
// returns once it answers.
func startReplica(t *testing.T, bin string, c *etcdproc.Cluster, certFile, keyFile, passwordFile string) *replica {
	t.Helper()
	r := &replica{addr: freeAddr(t), stderr: &safeBuffer{}}
	cmd := exec.Command(bin, "serve",
		"--listen", r.addr, "--metrics-listen", "",
		"--etcd-endpoints", strings.Join(c.Endpoints(), ","),
		"--etcd-ca-file", c.CAFile(), "--etcd-cert-file", certFile, "--etcd-key-file", keyFile,
		"--etcd-username", etcdUser, "--etcd-password-file", passwordFile,
		"--shutdown-grace", "2s")
	cmd.Stdout, cmd.Stderr = r.stderr, r.stderr
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-exited:
			require.NoError(t, err, "fencer serve did not stop cleanly: %s", r.stderr)
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
			t.Errorf("fencer serve ignored SIGTERM: %s", r.stderr)
		}
	})
	cc, err := grpc.NewClient(r.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { cc.Close() })
	r.cli = client.New(cc)
	require.Eventually(t, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := r.cli.List(ctx)
		return err == nil
	}, 30*time.Second, 50*time.Millisecond, "fencer serve does not answer: %s", r.stderr)
	return r
}

// session opens a session through r that the test closes.
func session(t *testing.T, r *replica) *client.Session {
	t.Helper()
	s, err := r.cli.NewSession()
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = s.Close(ctx)
	})
	return s
}

// refused reports whether err is the service refusing a write as fenced:
// a stale token, a lease not held, or a key of another lease.
func refused(err error) bool {
	return errors.Is(err, token.ErrStale) || errors.Is(err, token.ErrNotHeld) || errors.Is(err, token.ErrForeignLease)
}

// TestServeEtcdCluster runs two fencer serve processes in front of a
// 3-member etcd cluster of separate processes that serves clients only
// over TLS with client certificates and with etcd authentication on.
// Both replicas serve the same leases; the leader and a follower are
// killed during guarded writes and handovers, and no acknowledged write is
// lost and no stale write accepted; without a quorum, writes and
// acquisitions fail with UNAVAILABLE, and the service recovers with it.
func TestServeEtcdCluster(t *testing.T) {
	dir := t.TempDir()
	bin := buildFencer(t, dir)
	ca := testca.New(t, "etcd CA")
	c := etcdproc.Start(t, 3, etcdproc.WithClientTLS(ca))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute) // the setup, and the first subtest
	defer cancel()
	require.NoError(t, c.EnableAuth(ctx, etcdUser, etcdPassword, etcdstore.DefaultPrefix))
	certFile, keyFile := c.ClientCert(t, dir, "fencer-serve")
	pwFile := filepath.Join(dir, "etcd-password")
	require.NoError(t, os.WriteFile(pwFile, []byte(etcdPassword+"\n"), 0o600))
	r := []*replica{
		startReplica(t, bin, c, certFile, keyFile, pwFile),
		startReplica(t, bin, c, certFile, keyFile, pwFile),
	}

	t.Run("replicas serve the same leases", func(t *testing.T) {
		a, b := session(t, r[0]), session(t, r[1])
		la, err := a.Acquire(ctx, "shared")
		require.NoError(t, err)
		leases, err := r[1].cli.List(ctx)
		require.NoError(t, err)
		require.Len(t, leases, 1)
		require.Equal(t, la.Token(), leases[0].Token, "the lease held through one replica is not seen held through the other")
		_, err = b.TryAcquire(ctx, "shared")
		var held *token.HeldError
		require.ErrorAs(t, err, &held)
		_, err = r[1].cli.Put(ctx, la.Token(), "shared-key", []byte("a"))
		require.NoError(t, err, "a token from one replica is refused by the other")

		require.NoError(t, la.Release(ctx))
		lb, err := b.Acquire(ctx, "shared")
		require.NoError(t, err)
		order, err := lb.Token().Compare(la.Token())
		require.NoError(t, err)
		require.Equal(t, 1, order, "the token did not grow across replicas")
		_, err = r[0].cli.Put(ctx, lb.Token(), "shared-key", []byte("b"))
		require.NoError(t, err)
		for i := range r {
			_, err = r[i].cli.Put(ctx, la.Token(), "shared-key", []byte("stale"))
			require.ErrorIs(t, err, token.ErrStale, "replica %d accepted a stale write", i)
			v, _, err := r[i].cli.Get(ctx, "shared-key")
			require.NoError(t, err)
			require.Equal(t, "b", string(v.Data))
		}
	})

	// The fault phase (the two subtests below) is bounded on its own, not
	// counting etcd's startup: 2 minutes a round. A run takes 30 to 40 s.
	rounds := 1
	if *clusterLong {
		rounds = 10
	}
	faultBound := time.Duration(rounds) * 2 * time.Minute
	faults, cancelFaults := context.WithTimeout(context.Background(), faultBound)
	defer cancelFaults()
	faultStart := time.Now()
	inBound := func(t *testing.T) {
		t.Helper()
		require.NoError(t, faults.Err(), "the fault phase took longer than %s", faultBound)
	}

	t.Run("leader and follower killed during writes and handovers", func(t *testing.T) {
		ctx := faults
		w := startWorkload(ctx, t, r, 3)
		for round := range rounds {
			leader, err := c.Leader(ctx)
			require.NoError(t, err)
			follower := (leader + 1) % c.Len()
			for _, m := range []int{leader, follower} {
				t.Logf("round %d: kill %s", round, c.Name(m))
				c.Kill(m)
				w.waitProgress(ctx, t)
				require.NoError(t, c.Restart(ctx, m))
				w.waitProgress(ctx, t)
			}
		}
		w.stop(t)
		inBound(t)
		w.check(ctx, t)
	})

	t.Run("no quorum", func(t *testing.T) {
		ctx := faults
		s := session(t, r[0])
		l, err := s.Acquire(ctx, "quorum")
		require.NoError(t, err)
		_, err = r[0].cli.Put(ctx, l.Token(), "quorum-key", []byte("before"))
		require.NoError(t, err)
		leader, err := c.Leader(ctx)
		require.NoError(t, err)
		follower := (leader + 1) % c.Len()
		c.Kill(leader)
		c.Kill(follower)
		for i := range r {
			cctx, ccancel := context.WithTimeout(ctx, 30*time.Second)
			_, err := r[i].cli.Put(cctx, l.Token(), "quorum-key", []byte("during"))
			require.Equal(t, codes.Unavailable, status.Code(err), "replica %d: guarded put without quorum: %v", i, err)
			_, _, err = r[i].cli.Get(cctx, "quorum-key")
			require.Equal(t, codes.Unavailable, status.Code(err), "replica %d: read without quorum: %v", i, err)
			o, err := r[i].cli.NewSession()
			require.NoError(t, err)
			_, err = o.TryAcquire(cctx, fmt.Sprintf("quorum-%d", i))
			require.Equal(t, codes.Unavailable, status.Code(err), "replica %d: acquire without quorum: %v", i, err)
			require.NoError(t, o.Close(cctx))
			ccancel()
		}
		require.NoError(t, c.Restart(ctx, leader))
		require.NoError(t, c.Restart(ctx, follower))
		_, err = c.Leader(ctx)
		require.NoError(t, err)
		for i := range r {
			require.Eventually(t, func() bool {
				cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
				defer ccancel()
				v, _, err := r[i].cli.Get(cctx, "quorum-key")
				// "during" may have committed: etcd's timeout does not
				// say the proposal failed.
				return err == nil && (string(v.Data) == "before" || string(v.Data) == "during")
			}, time.Minute, 100*time.Millisecond, "replica %d does not serve again", i)
		}
		inBound(t)
	})
	t.Logf("fault phase: %s of its %s bound", time.Since(faultStart).Round(time.Second), faultBound)
}

// workload runs guarded writers and a handover loop against the replicas
// until stop, recording what was acknowledged.
type workload struct {
	r       []*replica
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	acks    atomic.Int64 // acknowledged writes, all writers
	refusal atomic.Int64 // stale writes refused
	mu      sync.Mutex
	acked   map[string]int64   // key -> greatest acknowledged value
	tried   map[string]int64   // key -> greatest value sent
	stale   []string           // stale writes accepted
	errs    map[codes.Code]int // other errors, by gRPC code
}

// startWorkload starts n writers, each holding lease "w<i>" and writing
// increasing values to key "k<i>" through both replicas in turn, and a
// handover loop: two sessions, one per replica, take lease "h" in turn;
// after each handover the previous token's write is tried through both
// replicas and must be refused.
func startWorkload(ctx context.Context, t *testing.T, r []*replica, n int) *workload {
	wctx, cancel := context.WithCancel(ctx)
	w := &workload{r: r, cancel: cancel, acked: map[string]int64{}, tried: map[string]int64{}, errs: map[codes.Code]int{}}
	for i := range n {
		w.wg.Add(1)
		go func() { defer w.wg.Done(); w.writer(wctx, i) }()
	}
	w.wg.Add(1)
	go func() { defer w.wg.Done(); w.handover(wctx) }()
	return w
}

// call bounds one call, so that a call stuck on a dead member ends.
func call(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, 15*time.Second)
}

func (w *workload) writer(ctx context.Context, i int) {
	lease, key := fmt.Sprintf("w%d", i), fmt.Sprintf("k%d", i)
	var next int64 = 1
	for ctx.Err() == nil {
		s, err := w.r[i%len(w.r)].cli.NewSession()
		if err != nil {
			return
		}
		cctx, cancel := call(ctx)
		l, err := s.Acquire(cctx, lease)
		cancel()
		w.record(ctx, err)
		for err == nil && ctx.Err() == nil {
			w.mu.Lock()
			w.tried[key] = next
			w.mu.Unlock()
			cctx, cancel := call(ctx)
			_, err = w.r[int(next)%len(w.r)].cli.Put(cctx, l.Token(), key, []byte(strconv.FormatInt(next, 10)))
			cancel()
			if err == nil {
				w.mu.Lock()
				w.acked[key] = next
				w.mu.Unlock()
				w.acks.Add(1)
			}
			w.record(ctx, err)
			next++
			if err != nil && !refused(err) && !errors.Is(err, etcdstore.ErrSessionExpired) {
				err = nil // unavailable for now: the same token may write again
				select {
				case <-ctx.Done():
				case <-time.After(50 * time.Millisecond):
				}
			}
		}
		cctx, cancel = call(context.Background())
		_ = s.Close(cctx)
		cancel()
	}
}

func (w *workload) handover(ctx context.Context) {
	var prev token.Token
	for turn := 0; ctx.Err() == nil; turn++ {
		r := w.r[turn%len(w.r)]
		s, err := r.cli.NewSession()
		if err != nil {
			return
		}
		cctx, cancel := call(ctx)
		l, err := s.Acquire(cctx, "h")
		if err == nil {
			_, err = r.cli.Put(cctx, l.Token(), "h", []byte(l.Token().String()))
		}
		cancel()
		w.record(ctx, err)
		if err == nil {
			w.mu.Lock()
			w.acked["h"] = l.Token().Revision
			w.mu.Unlock()
			if !prev.IsZero() {
				w.tryStale(ctx, prev, l.Token())
			}
			prev = l.Token()
		}
		cctx, cancel = call(context.Background())
		_ = s.Close(cctx) // releases h
		cancel()
	}
}

// record counts err by its gRPC code unless it is nil, a fenced refusal,
// an expired session, or the end of the workload.
func (w *workload) record(ctx context.Context, err error) {
	if err == nil || refused(err) || errors.Is(err, etcdstore.ErrSessionExpired) || ctx.Err() != nil {
		return
	}
	w.mu.Lock()
	w.errs[status.Code(err)]++
	w.mu.Unlock()
}

// tryStale writes h with prev, superseded by cur, through every replica:
// the store must refuse each.
func (w *workload) tryStale(ctx context.Context, prev, cur token.Token) {
	for _, r := range w.r {
		cctx, cancel := call(ctx)
		_, err := r.cli.Put(cctx, prev, "h", []byte(prev.String()))
		cancel()
		w.mu.Lock()
		if err == nil {
			w.stale = append(w.stale, fmt.Sprintf("%s after %s", prev, cur))
		} else if refused(err) {
			w.refusal.Add(1)
		}
		w.mu.Unlock()
	}
}

// waitProgress waits until the writers have had 20 more writes
// acknowledged and the handover loop has had a stale write refused through
// each replica.
func (w *workload) waitProgress(ctx context.Context, t *testing.T) {
	t.Helper()
	acks, refusals := w.acks.Load(), w.refusal.Load()
	require.Eventually(t, func() bool {
		return w.acks.Load() >= acks+20 && w.refusal.Load() >= refusals+int64(len(w.r)) || len(w.staleWrites()) > 0 || ctx.Err() != nil
	}, 2*time.Minute, 20*time.Millisecond, "the service makes no progress")
	require.Empty(t, w.staleWrites(), "stale writes accepted")
}

// staleWrites returns the stale writes accepted so far.
func (w *workload) staleWrites() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.stale...)
}

func (w *workload) stop(t *testing.T) {
	t.Helper()
	w.cancel()
	w.wg.Wait()
}

// check reads every key back through each replica: each holds at least its
// greatest acknowledged value and at most the greatest one sent, and no
// stale write was accepted.
func (w *workload) check(ctx context.Context, t *testing.T) {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	require.Empty(t, w.stale, "stale writes accepted")
	require.Positive(t, w.refusal.Load(), "no stale write was tried and refused")
	t.Logf("%d writes acknowledged, %d stale writes refused, other errors by code: %v", w.acks.Load(), w.refusal.Load(), w.errs)
	for code := range w.errs {
		require.Contains(t, []codes.Code{codes.Unavailable}, code, "a fault surfaced as %s, not UNAVAILABLE", code)
	}
	for _, r := range w.r {
		for key, acked := range w.acked {
			v, found, err := r.cli.Get(ctx, key)
			require.NoError(t, err)
			require.True(t, found, key)
			if key == "h" {
				got, err := token.Parse(string(v.Data))
				require.NoError(t, err)
				require.GreaterOrEqual(t, got.Revision, acked, "the last handover's write of h was lost")
				continue
			}
			got, err := strconv.ParseInt(string(v.Data), 10, 64)
			require.NoError(t, err)
			require.GreaterOrEqual(t, got, acked, "%s: an acknowledged write was lost", key)
			require.LessOrEqual(t, got, w.tried[key], "%s: a value never sent", key)
		}
	}
}
