package client_test

import (
	"context"
	"flag"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/fencer-dev/fencer/client"
	"github.com/fencer-dev/fencer/client/clienttest"
	"github.com/fencer-dev/fencer/etcdstore"
	"github.com/fencer-dev/fencer/fencertest"
	"github.com/fencer-dev/fencer/internal/holderkey"
	"github.com/fencer-dev/fencer/internal/testkit/rpcfault"
	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
)

var (
	outageSessions = flag.Int("outage.sessions", 100, "sessions in TestOutageRequestsAreBounded")
	outageFor      = flag.Duration("outage.duration", 5*time.Second, "how long etcd is out in TestOutageRequestsAreBounded")
	outageFixed    = flag.Bool("outage.fixed", false, "TestOutageRequestsAreBounded with a fixed 200 ms retry, as before backoff (it fails)")
)

// outageResult is what n client sessions sent to their server, and the
// server to etcd, during an outage of etcd and until every session was
// watching again.
type outageResult struct {
	sessions    int
	calls, etcd map[string]int
	total       int // calls to the server
	etcdTotal   int
	recovery    time.Duration // from the end of the outage until every session was watching again
}

func (r outageResult) String() string {
	return fmt.Sprintf("%d sessions: %d calls to the server (%.1f per session; %s), %d requests from it to etcd (%s), until all watched again %s after the outage",
		r.sessions, r.total, float64(r.total)/float64(r.sessions), rpcfault.Summary(r.calls), r.etcdTotal, rpcfault.Summary(r.etcd), r.recovery.Round(time.Millisecond))
}

// runOutage opens n client sessions of TTL ttl through one server, each
// holding a lease, waits until each watches, and then fails every request of the server to etcd for d (as an
// etcd that sheds load does, breaking every watch). It counts the calls
// the sessions make to the server, and the server's requests to etcd,
// from the outage's start until every session's lease watch has been
// synced again. retry, if not nil, replaces the sessions' backoff. It then
// checks that every lease is still held and that a loss is still
// reported.
func runOutage(tb testing.TB, n int, d, ttl time.Duration, retry func(time.Duration) backoff.BackOff) outageResult {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute) // 1,000 sessions take a while to open
	tb.Cleanup(cancel)
	ein := rpcfault.New()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{fencertest.SharedEtcd(tb)}, DialTimeout: 5 * time.Second, Logger: zap.NewNop(), DialOptions: ein.DialOptions()})
	require.NoError(tb, err)
	tb.Cleanup(func() { cli.Close() })
	st, err := etcdstore.New(cli, etcdstore.WithPrefix(fmt.Sprintf("/outage-%d/", time.Now().UnixNano())))
	require.NoError(tb, err)
	c, cin := serveWithFaults(tb, st)

	var outageOver atomic.Bool
	var synced, recovered sync.WaitGroup
	synced.Add(n)
	recovered.Add(n)
	sessions := make([]*client.Session, n)
	leases := make([]*client.Lease, n)
	watches := make([]atomic.Int64, n) // WatchLease calls since the outage ended
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	for i := range n {
		var first, again sync.Once
		opts := []client.SessionOption{client.WithTTL(ttl), clienttest.WithHooks(clienttest.SessionHooks{
			Watch: func(int64) {
				if outageOver.Load() {
					watches[i].Add(1)
				}
			},
			Received: func(ev *fencerv1.WatchLeaseResponse) {
				if ev.GetType() != fencerv1.WatchLeaseResponse_TYPE_SYNCED {
					return
				}
				first.Do(synced.Done)
				if outageOver.Load() {
					again.Do(recovered.Done)
				}
			},
		})}
		if retry != nil {
			opts = append(opts, clienttest.WithRetry(retry))
		}
		s, err := c.NewSession(opts...)
		require.NoError(tb, err)
		sessions[i] = s
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			var err error
			if leases[i], err = s.Acquire(ctx, fmt.Sprintf("l%d", i)); err != nil {
				tb.Error(err)
			}
		}()
	}
	tb.Cleanup(func() {
		for _, s := range sessions {
			cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = s.Close(cctx)
			cancel()
		}
	})
	wg.Wait()
	require.False(tb, tb.Failed())
	// Every session is watching before the outage starts, so none is
	// midway through opening its first watch when it does.
	waitGroup(tb, ctx, &synced, "every session's first watch to sync")

	cin.Count()
	ein.Count()
	ein.Start(rpctypes.ErrGRPCRequestTooManyRequests)
	time.Sleep(d) // the outage
	outageOver.Store(true)
	ein.Stop()
	end := time.Now()
	for i, s := range sessions {
		require.NoError(tb, s.Err(), "session %d ended in the outage", i)
	}
	// Each session's watch backs off at most retryMax (5 s) between
	// attempts, so a minute is ample even on a loaded machine.
	rctx, rcancel := context.WithTimeout(ctx, time.Minute)
	defer rcancel()
	if !waitGroupCtx(rctx, &recovered) {
		for i, s := range sessions {
			tb.Logf("session %d: ended %v, %d WatchLease calls since the outage", i, s.Err(), watches[i].Load())
		}
		tb.Fatal("not every session watched again after the outage")
	}
	res := outageResult{sessions: n, calls: cin.Calls(), total: cin.Total(), etcd: ein.Calls(), etcdTotal: ein.Total(), recovery: time.Since(end)}

	for i, l := range leases {
		require.NoError(tb, l.Err(), "lease %d ended in the outage", i)
	}
	_, err = cli.Delete(ctx, holderkey.Key(st.Prefix(), "l0"))
	require.NoError(tb, err)
	fencertest.WaitClosed(tb, leases[0].Done(), 10*time.Second, "Done of a lease deleted after the outage")
	return res
}

// waitGroupCtx waits for wg, and reports false if ctx ends first.
func waitGroupCtx(ctx context.Context, wg *sync.WaitGroup) bool {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
		return true
	case <-ctx.Done():
		return false
	}
}

// waitGroup waits for wg, failing tb with what it waited for if ctx ends
// first.
func waitGroup(tb testing.TB, ctx context.Context, wg *sync.WaitGroup, what string) {
	tb.Helper()
	if !waitGroupCtx(ctx, wg) {
		tb.Fatalf("timed out waiting for %s", what)
	}
}

// fixedRetry is the reconnect pacing before backoff: every 200 ms.
func fixedRetry(time.Duration) backoff.BackOff {
	return backoff.NewConstantBackOff(200 * time.Millisecond)
}

// TestOutageRequestsAreBounded: when etcd is unavailable, the server ends
// every session's lease watch and fails its keepalives; each session
// reconnects both with backoff, so the calls over an outage grow with its
// length only logarithmically.
//
// The sessions' TTL is 30 s, so that no session can expire: with the
// default 10 s, one whose last renewal came 3.3 s before the outage had
// its next success due at most 0.7 s before its deadline, and on a loaded
// machine it sometimes came too late. The benchmark keeps the default.
//
// Per session over a 5 s outage: the watch's waits are at least 100, 200,
// 400, ... ms (half the nominal 200 ms doubling), so at most 6 watch calls
// fit, the last after the outage; keepalive's are capped at TTL/10 (3 s,
// at least 1.5 s), so at most about 4, and renewals come every 10 s, so
// most sessions renew once or not at all. The test allows 15; about 6 is
// typical. Reconnecting every 200 ms, as before backoff (-args
// -outage.fixed), each session makes about 24 and the test fails; go test
// -bench BenchmarkOutageRequests measures both at the default TTL.
func TestOutageRequestsAreBounded(t *testing.T) {
	var retry func(time.Duration) backoff.BackOff
	if *outageFixed {
		retry = fixedRetry
	}
	res := runOutage(t, *outageSessions, *outageFor, 30*time.Second, retry)
	t.Log(res)
	require.LessOrEqual(t, res.total, 15*res.sessions, "calls to the server over a %s outage", *outageFor)
}

// BenchmarkOutageRequests measures the calls that 1,000 client sessions
// make to their server, and the server's requests to etcd, over a 5 s
// outage of etcd and until they all watch again, with the sessions'
// backoff and with a fixed 200 ms retry (the behaviour before backoff),
// side by side. Run it with -benchtime 1x.
func BenchmarkOutageRequests(b *testing.B) {
	for _, policy := range []struct {
		name  string
		retry func(time.Duration) backoff.BackOff
	}{{"fixed200ms", fixedRetry}, {"backoff", nil}} {
		b.Run(policy.name, func(b *testing.B) {
			for range b.N {
				res := runOutage(b, 1000, 5*time.Second, etcdstore.DefaultTTL, policy.retry)
				b.Log(res)
				b.ReportMetric(float64(res.total), "calls")
				b.ReportMetric(float64(res.total)/float64(res.sessions), "calls/session")
				b.ReportMetric(float64(res.etcdTotal), "etcd-requests")
				b.ReportMetric(res.recovery.Seconds(), "recovery-s")
			}
		})
	}
}
