package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/fencer-dev/fencer/client"
	fencerv1 "github.com/fencer-dev/fencer/proto/fencer/v1"
)

// The space tests run the built fencer serve on its embedded etcd and
// write to it through gRPC, as its users do, while they read the
// member's space metrics on /metrics: the database size, compactions and
// NOSPACE alarms and recoveries (embedetcd's compactor, serve.go's
// memberMetrics).

// The names of fencer serve's space metrics.
const (
	metricDBSize          = "fencer_embedded_etcd_db_size_bytes"
	metricCompactions     = "fencer_embedded_etcd_compactions_total"
	metricSizeCompactions = "fencer_embedded_etcd_size_compactions_total"
	metricNoSpaceAlarms   = "fencer_embedded_etcd_nospace_alarms_total"
	metricRecoveries      = "fencer_embedded_etcd_nospace_recoveries_total"
	metricRecoveryFails   = "fencer_embedded_etcd_nospace_recovery_failures_total"
)

// spaceSampleEvery is how often the space tests sample the database size.
const spaceSampleEvery = 250 * time.Millisecond

// startSpaceServer runs fencer serve on a fresh data directory, with its
// metrics served and extra args, until the test ends, and returns once
// both its gRPC and its metrics listeners answer.
func startSpaceServer(t *testing.T, args ...string) *serveProc {
	t.Helper()
	s := &serveProc{t: t, bin: fencerBinary(t), addr: freeAddr(t), metrics: freeAddr(t), dataDir: t.TempDir(), args: args}
	s.start()
	t.Cleanup(s.stop)
	// The metrics listener may start a moment after the gRPC one answers.
	require.Eventually(t, func() bool {
		_, err := s.spaceMetrics()
		return err == nil
	}, 10*time.Second, 20*time.Millisecond, "fencer serve's /metrics never answered: %s", s.log)
	return s
}

// spaceMetrics reads the unlabelled metrics on s's /metrics.
func (s *serveProc) spaceMetrics() (map[string]float64, error) {
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	m, err := readMetrics(hc, "http://"+s.metrics+"/metrics")
	if err != nil {
		return nil, err
	}
	// A metric renamed or dropped would read as 0 and pass the tests'
	// "no alarm" checks: each must be there.
	for _, name := range []string{metricDBSize, metricCompactions, metricSizeCompactions, metricNoSpaceAlarms, metricRecoveries, metricRecoveryFails} {
		if _, ok := m[name]; !ok {
			return nil, fmt.Errorf("no %s on /metrics", name)
		}
	}
	return m, nil
}

// etcdEndpoint is the embedded member's client endpoint, from s's
// `embedded etcd` log line.
func (s *serveProc) etcdEndpoint() string {
	s.t.Helper()
	m := etcdEndpointRE.FindStringSubmatch(s.log.String())
	require.NotNil(s.t, m, "fencer serve logged no embedded etcd endpoint: %s", s.log)
	return strings.Trim(m[1], `"`)
}

// sampleDBSize reads s's database size every spaceSampleEvery until the
// returned function is called, which returns the largest size read, the
// number of samples, and the first error of a scrape.
func sampleDBSize(s *serveProc) func() (largest float64, samples int, err error) {
	done, stopped := make(chan struct{}), make(chan struct{})
	var (
		largest float64
		samples int
		err     error
	)
	go func() {
		defer close(stopped)
		t := time.NewTicker(spaceSampleEvery)
		defer t.Stop()
		for {
			m, merr := s.spaceMetrics()
			switch v, ok := m[metricDBSize]; {
			case merr != nil:
				err = merr
			case !ok:
				err = fmt.Errorf("no %s on /metrics", metricDBSize)
			default:
				largest = max(largest, v)
				samples++
			}
			if err != nil {
				return
			}
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	}()
	return func() (float64, int, error) {
		close(done)
		<-stopped
		return largest, samples, err
	}
}

// The bounded soak, in make test: soakBoundedQuota is small, so that
// soakBoundedDuration of puts through the binary writes several quotas of
// history even on a loaded machine (about 8,000 puts/s of 1 KiB here,
// 14 quotas in 30 s), and soakBoundedMinQuotas is the least it must write
// to prove that compaction kept up.
const (
	soakBoundedDuration  = 30 * time.Second
	soakBoundedQuota     = 16 << 20
	soakBoundedMinQuotas = 2
	soakQuota            = 256 << 20 // with FENCER_SOAK=1
	soakValueSize        = 1 << 10
	soakClients          = 32
)

// TestServeSoak runs the built fencer bench against the built fencer
// serve, two processes: soakClients clients overwrite their own keys
// with guarded puts of soakValueSize bytes, as fast as the server takes
// them, under a quota and the default compaction policy, while the test
// samples the server's database size on /metrics. It asserts that no put
// failed (a put refused for space is UNAVAILABLE, cause no_space), that
// the NOSPACE alarm never fired, and that the database stayed under the
// quota, and logs the figures as a soak: line.
//
// With FENCER_SOAK=1 (make bench) it runs 10 minutes
// (FENCER_SOAK_DURATION overrides) under a 256 MiB quota; otherwise the
// bounded version runs soakBoundedDuration under soakBoundedQuota and
// must write soakBoundedMinQuotas quotas of values (the 10 minutes write
// about 20).
func TestServeSoak(t *testing.T) {
	d, quota, minQuotas := soakBoundedDuration, int64(soakBoundedQuota), soakBoundedMinQuotas
	if os.Getenv("FENCER_SOAK") == "1" {
		d, quota, minQuotas = 10*time.Minute, soakQuota, 0 // a run shortened on purpose may write less
		if v := os.Getenv("FENCER_SOAK_DURATION"); v != "" {
			var err error
			d, err = time.ParseDuration(v)
			require.NoError(t, err, "FENCER_SOAK_DURATION")
		}
	}
	s := startSpaceServer(t, "--etcd-quota-bytes", strconv.FormatInt(quota, 10))
	stopSampling := sampleDBSize(s)
	bench := s.startFencer(nil, "bench", "--ops", "put", "--clients", strconv.Itoa(soakClients),
		"--duration", d.String(), "--value-size", strconv.Itoa(soakValueSize), "-o", "json")
	code := bench.wait(t, d+2*time.Minute)
	largest, samples, err := stopSampling()
	require.NoError(t, err, "sampling /metrics: %s", s.log)
	require.Zero(t, code, "fencer bench: %s", bench.stderr)
	var results []benchResult
	require.NoError(t, json.Unmarshal([]byte(bench.stdout.String()), &results), bench.stdout.String())
	require.Len(t, results, 1)
	r := results[0]
	m, err := s.spaceMetrics()
	require.NoError(t, err)
	written := int64(r.Ops) * soakValueSize
	t.Logf("soak: fencer serve (embedded etcd) driven by fencer bench --ops put --clients %d --value-size %d, %s: %d puts (%.0f puts/s, %d MiB of values, %.1f quotas); quota %d MiB; largest database file %.1f MiB (%d samples), at the end %.1f MiB; %d puts failed; %.0f compactions (%.0f by size), %.0f NOSPACE alarms, %.0f recoveries",
		soakClients, soakValueSize, d, r.Ops, r.PerSecond, written>>20, float64(written)/float64(quota), quota>>20,
		largest/(1<<20), samples, m[metricDBSize]/(1<<20), r.Errors,
		m[metricCompactions], m[metricSizeCompactions], m[metricNoSpaceAlarms], m[metricRecoveries])
	require.Zero(t, r.Errors, "puts failed (one refused for space is UNAVAILABLE, cause no_space): %s", bench.stderr)
	require.Zero(t, m[metricNoSpaceAlarms], "the NOSPACE alarm fired: %s", s.log)
	require.Less(t, largest, float64(quota), "the database outgrew the quota")
	require.GreaterOrEqual(t, written, int64(minQuotas)*quota,
		"the run wrote less than %d quotas of values: too few to show that compaction keeps up", minQuotas)
}

// noSpaceRecoveryBound is how soon after its NOSPACE alarm is raised
// fencer serve must accept puts again by itself: a compactor tick
// (100 ms), the compaction of noSpaceHistory revisions (etcd deletes them
// 1,000 at a time, 10 ms apart: about a second), a defragmentation of a
// small database and a raft round, with a wide margin for a loaded
// machine.
const noSpaceRecoveryBound = 30 * time.Second

// noSpaceHistory is the history, in revisions, the server holds when
// TestServeNoSpaceRecovers raises its alarm: enough that its recovery's
// compaction takes about a second, so that the writers meet the alarm.
const noSpaceHistory = 100_000

// noSpaceWriters is the number of clients that write through
// TestServeNoSpaceRecovers, each with its own connection, lease and key.
const noSpaceWriters = 8

// isNoSpace reports whether err is a put refused for space:
// UNAVAILABLE, with the cause no_space.
func isNoSpace(err error) bool {
	return status.Code(err) == codes.Unavailable && client.Reason(err) == fencerv1.ErrorReason_ERROR_REASON_STORE_UNAVAILABLE && client.Cause(err) == "no_space"
}

// spaceRecovery is when the writers of TestServeNoSpaceRecovers first
// had a put refused for space, and when a put sent after that was first
// acknowledged (unix nanoseconds; 0: not yet).
type spaceRecovery struct {
	refused, accepted atomic.Int64
}

// spaceWriter is one client of TestServeNoSpaceRecovers: it puts
// 1, 2, 3, ... as the value of its own key, each put one value higher
// than the last it sent.
type spaceWriter struct {
	key     string
	acked   atomic.Int64 // the last value acknowledged
	sent    atomic.Int64 // the last value sent
	puts    atomic.Int64 // puts acknowledged
	refused atomic.Int64 // puts refused for space
}

// run puts until stop is closed or a put fails other than for space,
// which it returns, and records in rec the first refusal and the first
// put acknowledged after it.
func (w *spaceWriter) run(ctx context.Context, c *client.Client, l *client.Lease, rec *spaceRecovery, stop <-chan struct{}) error {
	for {
		select {
		case <-stop:
			return nil
		default:
		}
		n := w.sent.Add(1)
		start := time.Now().UnixNano()
		_, err := c.Put(ctx, l.Token(), w.key, []byte(strconv.FormatInt(n, 10)))
		switch {
		case err == nil:
			w.acked.Store(n)
			w.puts.Add(1)
			// A put sent after a refusal was applied after the alarm:
			// acknowledged, it shows the alarm disarmed.
			if first := rec.refused.Load(); first != 0 && start > first {
				rec.accepted.CompareAndSwap(0, time.Now().UnixNano())
			}
		case isNoSpace(err):
			w.refused.Add(1)
			rec.refused.CompareAndSwap(0, time.Now().UnixNano())
			time.Sleep(5 * time.Millisecond)
		default:
			return fmt.Errorf("put %s=%d: %w", w.key, n, err)
		}
	}
}

// writeHistory writes revisions of history straight to the member at
// cli, in Txns of 100 overwrites of 100 keys outside fencer's prefix:
// history to compact, little live data.
func writeHistory(ctx context.Context, t *testing.T, cli *clientv3.Client, revisions int) {
	t.Helper()
	const perTxn, workers = 100, 4
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Go(func() {
			ops := make([]clientv3.Op, perTxn)
			for int(next.Add(perTxn)) <= revisions {
				for i := range ops {
					ops[i] = clientv3.OpPut(fmt.Sprintf("/space-history/%03d", i), strings.Repeat("h", 64))
				}
				if _, err := cli.Txn(ctx).Then(ops...).Commit(); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err, "writing history")
	}
}

// readBackAcked reads each writer's key through s and checks that it
// holds a value at or after the last acknowledged one (and not beyond
// the last one sent): no acknowledged put is lost.
func readBackAcked(ctx context.Context, t *testing.T, s *serveProc, writers []*spaceWriter) {
	t.Helper()
	cc, err := grpc.NewClient(s.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer cc.Close()
	c := client.New(cc)
	for _, w := range writers {
		v, found, err := c.Get(ctx, w.key)
		require.NoError(t, err)
		require.True(t, found, "key %s is gone", w.key)
		n, err := strconv.ParseInt(string(v.Data), 10, 64)
		require.NoError(t, err, "key %s", w.key)
		require.GreaterOrEqual(t, n, w.acked.Load(), "key %s: an acknowledged put is lost", w.key)
		require.LessOrEqual(t, n, w.sent.Load(), "key %s holds a value never sent", w.key)
	}
}

// TestServeNoSpaceRecovers raises the NOSPACE alarm of the built fencer
// serve's embedded member (etcd's maintenance API, on the member's unix
// socket) while noSpaceWriters clients put through gRPC, with
// noSpaceHistory revisions of history to compact. Puts are refused for
// space meanwhile (UNAVAILABLE, cause no_space); the server compacts,
// defragments and disarms by itself, and accepts puts again within
// noSpaceRecoveryBound; it says so in its log and its recovery counter;
// and every key reads back at or after its last acknowledged value
// through the server, and again through a restarted server.
func TestServeNoSpaceRecovers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s := startSpaceServer(t)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{s.etcdEndpoint()}, DialTimeout: 10 * time.Second, Logger: zap.NewNop()})
	require.NoError(t, err)
	closeCli := sync.OnceFunc(func() { _ = cli.Close() })
	defer closeCli()
	writeHistory(ctx, t, cli, noSpaceHistory)

	var rec spaceRecovery
	writers := make([]*spaceWriter, noSpaceWriters)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, noSpaceWriters)
	for i := range writers {
		cc, err := grpc.NewClient(s.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		require.NoError(t, err)
		t.Cleanup(func() { _ = cc.Close() })
		c := client.New(cc)
		sess, err := c.NewSession()
		require.NoError(t, err)
		t.Cleanup(func() { _ = sess.Close(context.Background()) })
		l, err := sess.Acquire(ctx, fmt.Sprintf("space-%d", i))
		require.NoError(t, err)
		w := &spaceWriter{key: fmt.Sprintf("space/%d", i)}
		writers[i] = w
		wg.Go(func() {
			if err := w.run(ctx, c, l, &rec, stop); err != nil {
				errs <- err
			}
		})
	}
	stopWriters := sync.OnceFunc(func() { close(stop); wg.Wait() })
	defer stopWriters()
	total := func(v func(*spaceWriter) int64) (n int64) {
		for _, w := range writers {
			n += v(w)
		}
		return n
	}
	puts := func(w *spaceWriter) int64 { return w.puts.Load() }
	refused := func(w *spaceWriter) int64 { return w.refused.Load() }
	require.Eventually(t, func() bool { return total(puts) >= 10*noSpaceWriters }, 30*time.Second, 10*time.Millisecond,
		"the writers' puts are not acknowledged")

	st, err := cli.Status(ctx, s.etcdEndpoint())
	require.NoError(t, err)
	raised := time.Now()
	_, err = pb.NewMaintenanceClient(cli.ActiveConnection()).Alarm(ctx, &pb.AlarmRequest{
		Action: pb.AlarmRequest_ACTIVATE, MemberID: st.Header.MemberId, Alarm: pb.AlarmType_NOSPACE,
	})
	require.NoError(t, err, "raising the NOSPACE alarm")
	require.Eventually(t, func() bool { return rec.accepted.Load() != 0 }, noSpaceRecoveryBound, time.Millisecond,
		"no put refused for space, then accepted, within %s of the NOSPACE alarm: %d refused; %s", noSpaceRecoveryBound, total(refused), s.log)
	took := time.Duration(rec.accepted.Load() - raised.UnixNano())
	refusedFor := time.Duration(rec.accepted.Load() - rec.refused.Load())
	// Puts flow again: each writer has some acknowledged after the recovery.
	again := make([]int64, len(writers))
	for i, w := range writers {
		again[i] = w.acked.Load()
	}
	require.Eventually(t, func() bool {
		for i, w := range writers {
			if w.acked.Load() < again[i]+20 {
				return false
			}
		}
		return true
	}, 30*time.Second, 10*time.Millisecond, "some writer's puts are not acknowledged after the recovery")
	stopWriters()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}

	m, err := s.spaceMetrics()
	require.NoError(t, err)
	t.Logf("NOSPACE raised with %d revisions of history: puts accepted again %s later (the first refused %s before that); %d puts refused for space, %d acknowledged; metrics: %.0f alarms, %.0f recoveries, %.0f recovery failures, database %.0f KiB",
		noSpaceHistory, took.Round(time.Millisecond), refusedFor.Round(time.Millisecond), total(refused), total(puts),
		m[metricNoSpaceAlarms], m[metricRecoveries], m[metricRecoveryFails], m[metricDBSize]/(1<<10))
	require.Less(t, took, noSpaceRecoveryBound)
	require.GreaterOrEqual(t, m[metricNoSpaceAlarms], 1.0)
	require.GreaterOrEqual(t, m[metricRecoveries], 1.0)
	require.Zero(t, m[metricRecoveryFails])
	alarms, err := cli.AlarmList(ctx)
	require.NoError(t, err)
	require.Empty(t, alarms.Alarms, "the NOSPACE alarm is still raised")
	log := s.log.String()
	require.Contains(t, log, `level=WARN msg="etcd out of space: compacting all history, defragmenting and disarming the NOSPACE alarm"`)
	require.Contains(t, log, `level=INFO msg="etcd space recovered: NOSPACE alarm disarmed, writes accepted again"`)

	readBackAcked(ctx, t, s, writers)
	closeCli()
	s.stop()
	s.start()
	readBackAcked(ctx, t, s, writers)
}
