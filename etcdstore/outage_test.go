package etcdstore_test

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

	"github.com/fencer-dev/fencer/etcdstore"
	"github.com/fencer-dev/fencer/fencertest"
	"github.com/fencer-dev/fencer/internal/holderkey"
	"github.com/fencer-dev/fencer/internal/testkit/rpcfault"
)

var (
	outageSessions = flag.Int("outage.sessions", 100, "sessions in TestOutageRequestsAreBounded")
	outageFor      = flag.Duration("outage.duration", 5*time.Second, "how long etcd is out in TestOutageRequestsAreBounded")
	outageFixed    = flag.Bool("outage.fixed", false, "TestOutageRequestsAreBounded with a fixed 50 ms retry, as before backoff (it fails)")
)

// errOutage is what etcd answers every call with during the tests'
// outages: the error of an etcd member that sheds load. Neither the etcd
// client nor the store retries it by itself, so each failure reaches the
// session's own retry loop at once, as when the member a client talks to
// has lost its leader while others answer.
var errOutage = rpctypes.ErrGRPCRequestTooManyRequests

// outageResult is what n sessions sent to etcd during an outage and until
// every one of them was watching again.
type outageResult struct {
	sessions int
	calls    map[string]int
	total    int
	recovery time.Duration // from the end of the outage until every session was watching again
}

func (r outageResult) String() string {
	return fmt.Sprintf("%d sessions: %d requests (%.1f per session) until all watched again %s after the outage: %s",
		r.sessions, r.total, float64(r.total)/float64(r.sessions), r.recovery.Round(time.Millisecond), rpcfault.Summary(r.calls))
}

// runOutage opens n sessions of TTL ttl, each holding a lease, on an etcd client that
// fails every call during an outage of length d (breaking every watch),
// and counts the client's requests from the outage's start until every
// session has read the holder keys again and watches. retry, if not nil,
// replaces the sessions' watch recovery backoff. It then checks that every
// lease is still held and that a loss is still seen.
func runOutage(tb testing.TB, n int, d, ttl time.Duration, retry func() backoff.BackOff) outageResult {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute) // 1,000 sessions take a while to open
	tb.Cleanup(cancel)
	in := rpcfault.New()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{fencertest.SharedEtcd(tb)}, DialTimeout: 5 * time.Second, Logger: zap.NewNop(), DialOptions: in.DialOptions()})
	require.NoError(tb, err)
	tb.Cleanup(func() { cli.Close() })
	st, err := etcdstore.New(cli, etcdstore.WithPrefix(fmt.Sprintf("/outage-%d/", time.Now().UnixNano())))
	require.NoError(tb, err)

	var outageOver atomic.Bool         // set once the outage has ended
	reread := make([]chan struct{}, n) // closed when session i has read the holder keys after the outage
	sessions := make([]*etcdstore.Session, n)
	leases := make([]*etcdstore.Lease, n)
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	for i := range n {
		var once sync.Once
		reread[i] = make(chan struct{})
		opts := []etcdstore.SessionOption{etcdstore.WithTTL(ttl), etcdstore.WithHooks(etcdstore.SessionHooks{
			Reread: func(int64) {
				if outageOver.Load() {
					once.Do(func() { close(reread[i]) })
				}
			},
		})}
		if retry != nil {
			opts = append(opts, etcdstore.WithRetry(retry))
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			s, err := st.NewSession(ctx, opts...)
			if err != nil {
				tb.Error(err)
				return
			}
			sessions[i] = s
			if leases[i], err = s.Acquire(ctx, fmt.Sprintf("l%d", i)); err != nil {
				tb.Error(err)
			}
		}()
	}
	wg.Wait()
	tb.Cleanup(func() {
		for _, s := range sessions {
			if s != nil {
				cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_ = s.Close(cctx)
				cancel()
			}
		}
	})
	require.False(tb, tb.Failed())

	in.Count()
	in.Start(errOutage)
	time.Sleep(d) // the outage
	outageOver.Store(true)
	in.Stop()
	end := time.Now()
	for i, s := range sessions {
		select {
		case <-reread[i]:
		case <-s.Done():
			tb.Fatalf("session %d ended in the outage: %v", i, s.Err())
		case <-ctx.Done():
			tb.Fatalf("session %d never read the holder keys again after the outage", i)
		}
	}
	res := outageResult{sessions: n, calls: in.Calls(), total: in.Total(), recovery: time.Since(end)}

	for i, l := range leases {
		require.NoError(tb, l.Err(), "lease %d ended in the outage", i)
	}
	_, err = cli.Delete(ctx, holderkey.Key(st.Prefix(), "l0"))
	require.NoError(tb, err)
	fencertest.WaitClosed(tb, leases[0].Done(), 10*time.Second, "Done of a lease deleted after the outage")
	return res
}

// fixedRetry is the watch recovery before backoff: a re-read every 50 ms.
func fixedRetry() backoff.BackOff { return backoff.NewConstantBackOff(50 * time.Millisecond) }

// TestOutageRequestsAreBounded: every session's watch breaks when etcd
// becomes unavailable, and each session retries reading the holder keys
// with backoff, so the requests over an outage grow with its length only
// logarithmically.
//
// The sessions' TTL is 30 s, so that no session can expire: with the
// default 10 s, one whose last renewal came just before the outage had its
// next success due shortly before its deadline, and on a loaded machine
// it sometimes came too late (the session then fails closed, as it must).
// The benchmark keeps the default.
//
// Per session over a 5 s outage: the waits before the re-reads are at
// least 25, 50, 100, ... ms (half the nominal 50 ms doubling; the cap's
// half is 2.5 s), so at most 7 re-reads fail and the 8th comes after the
// outage; keepalive retries wait at least 100, 200, 400, ... ms (TTL/10
// capped, 3 s), so at most about 6; the watch streams are shared by all
// sessions. The test allows 25. With a re-read
// every 50 ms, as before backoff, each session sends about 100 (go test
// -bench BenchmarkOutageRequests measures both).
func TestOutageRequestsAreBounded(t *testing.T) {
	var retry func() backoff.BackOff
	if *outageFixed {
		retry = fixedRetry
	}
	res := runOutage(t, *outageSessions, *outageFor, 30*time.Second, retry)
	t.Log(res)
	require.LessOrEqual(t, res.total, 25*res.sessions, "requests over a %s outage", *outageFor)
}

// BenchmarkOutageRequests measures the requests that 1,000 sessions send
// to etcd over a 5 s outage and until they all watch again, with the
// sessions' backoff and with a fixed 50 ms retry (the behaviour before
// backoff), side by side. Run it with -benchtime 1x.
func BenchmarkOutageRequests(b *testing.B) {
	for _, policy := range []struct {
		name  string
		retry func() backoff.BackOff
	}{{"fixed50ms", fixedRetry}, {"backoff", nil}} {
		b.Run(policy.name, func(b *testing.B) {
			for range b.N {
				res := runOutage(b, 1000, 5*time.Second, etcdstore.DefaultTTL, policy.retry)
				b.Log(res)
				b.ReportMetric(float64(res.total), "requests")
				b.ReportMetric(float64(res.total)/float64(res.sessions), "requests/session")
				b.ReportMetric(res.recovery.Seconds(), "recovery-s")
			}
		})
	}
}

// TestWaitingAcquireDoesNotSpinWhileWatchesFail: while etcd answers every
// call but watches (as when a client's member lost its leader and another
// answers), an Acquire waiting for a held lease watches again with backoff,
// from the same revision, instead of trying the acquisition again and
// again; it acquires once the lease is released.
func TestWaitingAcquireDoesNotSpinWhileWatchesFail(t *testing.T) {
	ctx := fencertest.Context(t)
	in := rpcfault.New()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{fencertest.SharedEtcd(t)}, DialTimeout: 5 * time.Second, Logger: zap.NewNop(), DialOptions: in.DialOptions()})
	require.NoError(t, err)
	t.Cleanup(func() { cli.Close() })
	st, err := etcdstore.New(cli, etcdstore.WithPrefix(fmt.Sprintf("/wait-%d/", time.Now().UnixNano())))
	require.NoError(t, err)
	holder, waiter := newSession(t, st), newSession(t, st)
	held, err := holder.Acquire(ctx, "jobs")
	require.NoError(t, err)

	in.Count()
	acquired := make(chan acquisition, 1)
	go func() {
		l, err := waiter.Acquire(ctx, "jobs")
		acquired <- acquisition{l, err}
	}()
	require.Eventually(t, func() bool { return in.Calls()["/etcdserverpb.KV/Txn"] >= 1 }, 10*time.Second, time.Millisecond, "the waiter never tried")
	in.Start(errOutage, "/etcdserverpb.Watch/Watch")
	time.Sleep(2 * time.Second) // the outage
	calls := in.Calls()
	in.Stop()
	t.Log("during 2 s of failing watches:", rpcfault.Summary(calls))
	// The waiter's one try before the outage; re-reads and keepalives of the
	// two sessions are not Txns.
	require.LessOrEqual(t, calls["/etcdserverpb.KV/Txn"], 1, "the waiter kept trying to acquire")
	require.LessOrEqual(t, calls["/etcdserverpb.Watch/Watch"], 30, "watches over 2 s")

	require.NoError(t, held.Release(ctx))
	r := <-acquired
	require.NoError(t, r.err)
	require.NoError(t, r.l.Err())
}
