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
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/fencer-dev/fencer/client"
	"github.com/fencer-dev/fencer/client/clienttest"
	"github.com/fencer-dev/fencer/etcdstore"
	"github.com/fencer-dev/fencer/internal/etcdtest"
	"github.com/fencer-dev/fencer/internal/holderkey"
	"github.com/fencer-dev/fencer/internal/rpcfault"
	"github.com/fencer-dev/fencer/internal/servicetest"
	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
	"github.com/fencer-dev/fencer/server"
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

// runOutage opens n client sessions through one server, each holding a
// lease, and then fails every request of the server to etcd for d (as an
// etcd that sheds load does, breaking every watch). It counts the calls
// the sessions make to the server, and the server's requests to etcd,
// from the outage's start until every session's lease watch has been
// synced again. retry, if not nil, replaces the sessions' backoff. It then
// checks that every lease is still held and that a loss is still
// reported.
func runOutage(tb testing.TB, n int, d time.Duration, retry func(time.Duration) backoff.BackOff) outageResult {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute) // 1,000 sessions take a while to open
	tb.Cleanup(cancel)
	ein := rpcfault.New()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{etcdtest.Shared(tb)}, DialTimeout: 5 * time.Second, Logger: zap.NewNop(), DialOptions: ein.DialOptions()})
	require.NoError(tb, err)
	tb.Cleanup(func() { cli.Close() })
	st, err := etcdstore.New(cli, etcdstore.WithPrefix(fmt.Sprintf("/outage-%d/", time.Now().UnixNano())))
	require.NoError(tb, err)
	addr, _ := servicetest.Serve(tb, server.Config{Store: st, Authenticator: server.Anonymous("tester")})
	cin := rpcfault.New()
	cc, err := grpc.NewClient(addr, append(cin.DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	require.NoError(tb, err)
	tb.Cleanup(func() { cc.Close() })
	c := client.New(cc)

	var outageOver atomic.Bool
	var recovered sync.WaitGroup
	recovered.Add(n)
	sessions := make([]*client.Session, n)
	leases := make([]*client.Lease, n)
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	for i := range n {
		var once sync.Once
		opts := []client.SessionOption{clienttest.WithHooks(clienttest.SessionHooks{
			Received: func(ev *fencerv1.WatchLeaseResponse) {
				if ev.GetType() == fencerv1.WatchLeaseResponse_TYPE_SYNCED && outageOver.Load() {
					once.Do(recovered.Done)
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

	cin.Count()
	ein.Count()
	ein.Start(rpctypes.ErrGRPCRequestTooManyRequests)
	time.Sleep(d) // the outage
	outageOver.Store(true)
	ein.Stop()
	end := time.Now()
	waited := make(chan struct{})
	go func() { recovered.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-ctx.Done():
		tb.Fatal("not every session watched again after the outage")
	}
	res := outageResult{sessions: n, calls: cin.Calls(), total: cin.Total(), etcd: ein.Calls(), etcdTotal: ein.Total(), recovery: time.Since(end)}

	for i, l := range leases {
		require.NoError(tb, l.Err(), "lease %d ended in the outage", i)
	}
	_, err = cli.Delete(ctx, holderkey.Key(st.Prefix(), "l0"))
	require.NoError(tb, err)
	etcdtest.WaitClosed(tb, leases[0].Done(), 10*time.Second, "Done of a lease deleted after the outage")
	return res
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
// Per session over a 5 s outage: the watch's waits are at least 100, 200,
// 400, ... ms (half the nominal 200 ms doubling), so at most 6 watch calls
// fit, the last after the outage; keepalive's are capped at TTL/10 (1 s,
// at least 0.5 s), so at most about 12. The test allows 25. Reconnecting
// every 200 ms, as before backoff, each session makes about 50 (go test
// -bench BenchmarkOutageRequests measures both).
func TestOutageRequestsAreBounded(t *testing.T) {
	var retry func(time.Duration) backoff.BackOff
	if *outageFixed {
		retry = fixedRetry
	}
	res := runOutage(t, *outageSessions, *outageFor, retry)
	t.Log(res)
	require.LessOrEqual(t, res.total, 25*res.sessions, "calls to the server over a %s outage", *outageFor)
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
				res := runOutage(b, 1000, 5*time.Second, policy.retry)
				b.Log(res)
				b.ReportMetric(float64(res.total), "calls")
				b.ReportMetric(float64(res.total)/float64(res.sessions), "calls/session")
				b.ReportMetric(float64(res.etcdTotal), "etcd-requests")
				b.ReportMetric(res.recovery.Seconds(), "recovery-s")
			}
		})
	}
}
