package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/fencer-dev/fencer/client"
	"github.com/fencer-dev/fencer/etcdstore"
	"github.com/fencer-dev/fencer/token"
)

// benchFlags are the flags of fencer bench.
type benchFlags struct {
	clients   int
	conns     int // connections the clients share, round robin
	duration  time.Duration
	ops       []string
	size      int
	serverPID int       // the server's process, whose CPU time is read; 0: none
	endpoints string    // the server's etcd, for direct-put
	prefix    string    // the server's key prefix, for direct-put
	batch     int       // the server's --batch, for direct-put
	etcd      etcdFlags // credentials for endpoints
}

// benchResult is one workload's figures.
type benchResult struct {
	Op      string `json:"op"`
	Clients int    `json:"clients"`
	// Connections is how many connections (or, for the direct workloads,
	// etcd clients) the clients shared.
	Connections int     `json:"connections"`
	Ops         int     `json:"ops"`
	Errors      int     `json:"errors"`
	PerSecond   float64 `json:"ops_per_second"`
	P50         float64 `json:"p50_ms"`
	P90         float64 `json:"p90_ms"`
	P99         float64 `json:"p99_ms"`
	// CPUPerOp is this process's CPU time per successful call, in
	// microseconds; ServerCPUPerOp the server process's (--server-pid),
	// which for direct-put and direct-acquire is the work of its etcd.
	// Zero when unknown.
	CPUPerOp       float64 `json:"cpu_us_per_op,omitempty"`
	ServerCPUPerOp float64 `json:"server_cpu_us_per_op,omitempty"`
}

// benchWorkloads are the operations fencer bench can measure: one call of
// the workload, for client i, with its session and lease set up by setup.
var benchWorkloads = map[string]func(ctx context.Context, w *benchWorker) error{
	// put: a guarded Put of the client's own key with its lease's token.
	"put": func(ctx context.Context, w *benchWorker) error {
		_, err := w.c.Put(ctx, w.held.Token(), w.key, w.value)
		return err
	},
	// direct-put: the same guarded Put, sent by the library straight to
	// the server's etcd with the server's batching: the baseline that
	// shows what the server and its gRPC hop cost.
	"direct-put": func(ctx context.Context, w *benchWorker) error {
		_, err := w.direct.Put(ctx, w.held.Token(), w.key, w.value)
		return err
	},
	// acquire: an Acquire of the client's own lease and its Release.
	"acquire": func(ctx context.Context, w *benchWorker) error {
		l, err := w.sess.Acquire(ctx, w.lease+"-cycle")
		if err != nil {
			return err
		}
		return l.Release(ctx)
	},
	// direct-acquire: the same cycle of the same lease, through a session
	// of the library on the server's etcd: the baseline for acquire.
	"direct-acquire": func(ctx context.Context, w *benchWorker) error {
		l, err := w.dsess.Acquire(ctx, w.lease+"-cycle")
		if err != nil {
			return err
		}
		return l.Release(ctx)
	},
}

// benchBaselines names the baseline of each workload that has one.
var benchBaselines = map[string]string{"put": "direct-put", "acquire": "direct-acquire"}

// benchWorker is one bench client: its own connection, session, lease
// (held, named lease) and data key.
type benchWorker struct {
	c      *client.Client
	direct *etcdstore.Store   // the server's store, opened by this process on the etcd client of its connection slot; nil without --etcd-endpoints
	dsess  *etcdstore.Session // a session on direct, for direct-acquire
	sess   *client.Session
	held   *client.Lease
	lease  string
	key    string
	value  []byte
}

func (a *app) benchCmd() *cobra.Command {
	var f benchFlags
	var out outputFlags
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "measure a running server: guarded puts and acquire/release cycles",
		Long: `Drives a running fencer server with --clients concurrent clients, each
with its own session, for --duration per workload, and prints throughput,
latency percentiles and CPU time per call:
  put             a guarded put of the client's own key, with its lease's token
  direct-put      the same guarded put, sent by this process straight to the
                  server's etcd (--etcd-endpoints, --prefix and --batch as the
                  server has them): the baseline for put, run beside it
  acquire         an acquire of the client's own lease, then its release
  direct-acquire  the same cycle through the library on the server's etcd:
                  the baseline for acquire
The clients share --connections connections to the server, round robin,
and the direct workloads' clients as many etcd clients, each with a
library store of its own that batches only its own clients' calls: by
default one of each, so that concurrent puts leave together (as PutMany
calls to the server, as one Txn to etcd); --connections equal to
--clients gives each client its own on both sides, as that many separate
processes would have.
With a workload and its baseline both run, it prints their throughput
ratio, over all their runs: name them alternately
(--ops put,direct-put,put,direct-put) so that a busy machine weighs on both
alike. CPU_US is this process's CPU time per successful call, in
microseconds; SERVER_CPU_US the server's, read from /proc/PID/stat with
--server-pid (Linux), which for the direct workloads is its etcd's.
A run holds lease bench-<slot>, the lowest slot that no other bench
holds, so that benches run side by side; its client i uses leases
bench-<slot>-<i> and bench-<slot>-<i>-cycle and the key bench/<slot>/<i>.
When it ends, interrupted or not, it deletes its keys with guarded
deletes and releases its leases. The names are reused by later runs, so
what a run leaves (the epoch counters of those leases, and the owner
records of those keys, which fencing needs) does not grow with the number
of runs: fencer status --prefix bench- lists them. Like etcdctl check
perf, it measures the whole path: this process, the network, the server
and etcd.`,
		Example: `  fencer bench --clients 64 --duration 10s`,
		Args:    nArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if f.clients < 1 || f.duration <= 0 || f.conns < 1 {
				return usagef("--clients and --connections must be at least 1 and --duration positive")
			}
			var direct []*etcdstore.Store
			for _, op := range f.ops {
				if benchWorkloads[op] == nil {
					return usagef("--ops %q: want put, direct-put, acquire or direct-acquire", op)
				}
				for strings.HasPrefix(op, "direct-") && len(direct) < min(f.conns, f.clients) {
					st, closeStore, err := f.directStore()
					if err != nil {
						return err
					}
					defer closeStore()
					direct = append(direct, st)
				}
			}
			slot, release, err := a.benchSlot(cmd.Context())
			if err != nil {
				return err
			}
			defer release()
			var results []benchResult
			ops, secs := map[string]int{}, map[string]float64{} // by workload, over its runs
			for _, op := range f.ops {
				r, err := a.bench(cmd.Context(), f, op, direct, slot)
				if err != nil {
					return err
				}
				results = append(results, r)
				if r.PerSecond > 0 {
					ops[op] += r.Ops
					secs[op] += float64(r.Ops) / r.PerSecond
				}
			}
			for _, op := range []string{"put", "acquire"} {
				base := benchBaselines[op]
				if ops[op] > 0 && ops[base] > 0 {
					ratio := float64(ops[op]) / secs[op] / (float64(ops[base]) / secs[base])
					fmt.Fprintf(a.stderr, "fencer bench: %s through the server ran at %.2f times the throughput of %s\n", op, ratio, base)
				}
			}
			rows := make([][]string, len(results))
			ms := func(v float64) string { return strconv.FormatFloat(v, 'f', 2, 64) }
			us := func(v float64) string {
				if v == 0 {
					return "-"
				}
				return strconv.FormatFloat(v, 'f', 0, 64)
			}
			for i, r := range results {
				rows[i] = []string{r.Op, strconv.Itoa(r.Clients), strconv.Itoa(r.Ops), strconv.Itoa(r.Errors), strconv.FormatFloat(r.PerSecond, 'f', 0, 64), ms(r.P50), ms(r.P90), ms(r.P99), us(r.CPUPerOp), us(r.ServerCPUPerOp)}
			}
			return out.print(a.stdout, view{data: results, headers: []string{"OP", "CLIENTS", "OPS", "ERRORS", "OPS/S", "P50_MS", "P90_MS", "P99_MS", "CPU_US", "SERVER_CPU_US"}, rows: rows})
		},
	}
	a.conn.register(cmd.Flags())
	out.register(cmd)
	cmd.Flags().IntVar(&f.clients, "clients", 16, "concurrent clients, each with its own connection and session")
	cmd.Flags().IntVar(&f.conns, "connections", 1, "connections to the server that the clients share, round robin (at most --clients are used)")
	cmd.Flags().DurationVar(&f.duration, "duration", 10*time.Second, "how long each workload runs")
	cmd.Flags().StringSliceVar(&f.ops, "ops", []string{"put", "acquire"}, "workloads to run, in order: put, direct-put, acquire, direct-acquire")
	cmd.Flags().IntVar(&f.serverPID, "server-pid", 0, "the server's process ID, to report its CPU time per call (Linux)")
	cmd.Flags().IntVar(&f.size, "value-size", 64, "bytes per value written")
	cmd.Flags().StringVar(&f.endpoints, "etcd-endpoints", "", "the server's etcd endpoints, for direct-put and direct-acquire (fencer serve logs its embedded member's)")
	cmd.Flags().StringVar(&f.prefix, "prefix", etcdstore.DefaultPrefix, "the server's etcd key prefix, for direct-put and direct-acquire")
	cmd.Flags().IntVar(&f.batch, "batch", etcdstore.DefaultBatch, "the server's --batch, for direct-put and direct-acquire")
	envFlag(cmd.Flags(), "etcd-endpoints", "FENCER_ETCD_ENDPOINTS")
	f.etcd.register(cmd.Flags())
	return cmd
}

// directStore opens the server's store straight on its etcd, for
// direct-put and direct-acquire, and returns a function that closes it.
func (f benchFlags) directStore() (*etcdstore.Store, func(), error) {
	endpoints := splitList(f.endpoints)
	if len(endpoints) == 0 {
		return nil, nil, usagef("--ops direct-put and direct-acquire need --etcd-endpoints: the server's etcd (fencer serve logs its embedded member's endpoint)")
	}
	cfg, _, err := f.etcd.clientConfig(endpoints, false, nil) // a bench run is short: no certificate reload
	if err != nil {
		return nil, nil, err
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("etcd client: %w", err)
	}
	st, err := etcdstore.New(cli, etcdstore.WithPrefix(f.prefix), etcdstore.WithBatching(f.batch))
	if err != nil {
		cli.Close()
		return nil, nil, err
	}
	return st, func() { cli.Close() }, nil
}

// maxBenchSlots bounds the slots a bench tries: the benches that can run
// side by side against one server.
const maxBenchSlots = 64

// benchSlot holds lease bench-<slot> for the lowest slot that no other
// bench holds, and returns the slot and a function that releases it. The
// names of a bench's leases and keys derive from its slot, so that
// benches run side by side and later runs reuse the names of earlier ones.
func (a *app) benchSlot(ctx context.Context) (int, func(), error) {
	cc, err := a.conn.dial()
	if err != nil {
		return 0, nil, err
	}
	sess, err := client.New(cc).NewSession()
	if err != nil {
		cc.Close()
		return 0, nil, err
	}
	release := func() {
		cctx, cancel := context.WithTimeout(context.Background(), a.conn.timeout)
		defer cancel()
		_ = sess.Close(cctx)
		cc.Close()
	}
	for slot := range maxBenchSlots {
		cctx, cancel := context.WithTimeout(ctx, a.conn.timeout)
		_, err := sess.TryAcquire(cctx, "bench-"+strconv.Itoa(slot))
		cancel()
		var held *token.HeldError
		switch {
		case err == nil:
			return slot, release, nil
		case !errors.As(err, &held):
			release()
			return 0, nil, err
		}
	}
	release()
	return 0, nil, &exitStatus{code: exitHeld, msg: fmt.Sprintf("leases bench-0 to bench-%d are all held: %d benches run against this server already", maxBenchSlots-1, maxBenchSlots)}
}

// benchWrites is the workloads that write the workers' keys.
var benchWrites = map[string]bool{"put": true, "direct-put": true}

// bench runs workload op with f.clients clients for f.duration, with the
// lease and key names of slot. When it returns, interrupted or not, the
// keys it wrote are deleted (guarded by their lease's token) and its
// sessions closed, which releases their leases.
func (a *app) bench(ctx context.Context, f benchFlags, op string, direct []*etcdstore.Store, slot int) (benchResult, error) {
	workers := make([]*benchWorker, f.clients)
	var conns []*grpc.ClientConn
	defer func() {
		for _, w := range workers {
			if w == nil {
				continue
			}
			cctx, cancel := context.WithTimeout(context.Background(), a.conn.timeout)
			if benchWrites[op] {
				_, _ = w.c.Delete(cctx, w.held.Token(), w.key)
			}
			if w.dsess != nil {
				_ = w.dsess.Close(cctx)
			}
			_ = w.sess.Close(cctx)
			cancel()
		}
		for _, cc := range conns {
			cc.Close()
		}
	}()
	nconns := min(f.conns, f.clients)
	clients := make([]*client.Client, nconns)
	for i := range clients {
		cc, err := a.conn.dial()
		if err != nil {
			return benchResult{}, err
		}
		conns = append(conns, cc)
		clients[i] = client.New(cc)
	}
	for i := range workers {
		c := clients[i%nconns]
		w := &benchWorker{c: c, lease: fmt.Sprintf("bench-%d-%d", slot, i), key: fmt.Sprintf("bench/%d/%d", slot, i), value: make([]byte, f.size)}
		if len(direct) > 0 {
			w.direct = direct[i%len(direct)]
		}
		var err error
		if w.sess, err = c.NewSession(); err != nil {
			return benchResult{}, err
		}
		sctx, cancel := context.WithTimeout(ctx, a.conn.timeout)
		w.held, err = w.sess.Acquire(sctx, w.lease)
		if err == nil && op == "direct-acquire" {
			w.dsess, err = w.direct.NewSession(sctx, etcdstore.WithHolder(w.lease))
		}
		cancel()
		if err != nil {
			_ = w.sess.Close(context.Background())
			return benchResult{}, err
		}
		workers[i] = w
	}
	do := benchWorkloads[op]
	lat := make([][]time.Duration, len(workers))
	errs := make([]int, len(workers))
	var firstErr error
	var mu sync.Mutex
	rctx, cancel := context.WithTimeout(ctx, f.duration)
	defer cancel()
	cpu0, server0 := processCPU(os.Getpid()), processCPU(f.serverPID)
	start := time.Now()
	var wg sync.WaitGroup
	for i, w := range workers {
		wg.Go(func() {
			for rctx.Err() == nil {
				t0 := time.Now()
				cctx, ccancel := context.WithTimeout(ctx, a.conn.timeout)
				err := do(cctx, w)
				ccancel()
				if err != nil {
					errs[i]++
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					continue
				}
				lat[i] = append(lat[i], time.Since(t0))
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	cpu1, server1 := processCPU(os.Getpid()), processCPU(f.serverPID)
	if ctx.Err() != nil {
		return benchResult{}, ctx.Err()
	}
	all := slices.Concat(lat...)
	slices.Sort(all)
	r := benchResult{Op: op, Clients: f.clients, Connections: nconns, Ops: len(all), PerSecond: float64(len(all)) / elapsed.Seconds()}
	for _, n := range errs {
		r.Errors += n
	}
	if len(all) == 0 {
		return r, firstErr // no call succeeded: say why
	}
	perOp := func(t0, t1 time.Duration) float64 {
		if t0 < 0 || t1 < 0 {
			return 0
		}
		return float64(t1-t0) / float64(time.Microsecond) / float64(len(all))
	}
	r.CPUPerOp, r.ServerCPUPerOp = perOp(cpu0, cpu1), perOp(server0, server1)
	pct := func(p float64) float64 { return float64(all[int(p*float64(len(all)-1))]) / float64(time.Millisecond) }
	r.P50, r.P90, r.P99 = pct(0.50), pct(0.90), pct(0.99)
	if r.Errors > 0 {
		fmt.Fprintf(a.stderr, "fencer bench: %s: %d calls failed, the first with: %s\n", op, r.Errors, describe(firstErr, a.conn.server, a.conn.secure()).msg)
	}
	return r, nil
}
