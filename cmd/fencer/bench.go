package main

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	"github.com/fencer-dev/fencer/client"
)

// benchFlags are the flags of fencer bench.
type benchFlags struct {
	clients  int
	duration time.Duration
	ops      []string
	size     int
}

// benchResult is one workload's figures.
type benchResult struct {
	Op        string  `json:"op"`
	Clients   int     `json:"clients"`
	Ops       int     `json:"ops"`
	Errors    int     `json:"errors"`
	PerSecond float64 `json:"ops_per_second"`
	P50       float64 `json:"p50_ms"`
	P90       float64 `json:"p90_ms"`
	P99       float64 `json:"p99_ms"`
}

// benchWorkloads are the operations fencer bench can measure: one call of
// the workload, for client i, with its session and lease set up by setup.
var benchWorkloads = map[string]func(ctx context.Context, w *benchWorker) error{
	// put: a guarded Put of the client's own key with its lease's token.
	"put": func(ctx context.Context, w *benchWorker) error {
		_, err := w.c.Put(ctx, w.held.Token(), w.key, w.value)
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
}

// benchWorker is one bench client: its own connection, session, lease
// (held, named lease) and data key.
type benchWorker struct {
	c     *client.Client
	sess  *client.Session
	held  *client.Lease
	lease string
	key   string
	value []byte
}

func (a *app) benchCmd() *cobra.Command {
	var f benchFlags
	var out outputFlags
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "measure a running server: guarded puts and acquire/release cycles",
		Long: `Drives a running fencer server with --clients concurrent clients, each on
its own connection and session, for --duration per workload, and prints
throughput and latency percentiles:
  put      a guarded put of the client's own key, with its lease's token
  acquire  an acquire of the client's own lease, then its release
Each client uses leases named bench-<start time>-<workload>-<client> and
keys under bench/; the keys are deleted and the leases released
afterwards. Like etcdctl check perf, it
measures the whole path: this process, the network, the server and etcd.`,
		Example: `  fencer bench --clients 64 --duration 10s`,
		Args:    nArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := out.validate(); err != nil {
				return err
			}
			if f.clients < 1 || f.duration <= 0 {
				return usagef("--clients must be at least 1 and --duration positive")
			}
			for _, op := range f.ops {
				if benchWorkloads[op] == nil {
					return usagef("--ops %q: want put or acquire", op)
				}
			}
			var results []benchResult
			for _, op := range f.ops {
				r, err := a.bench(cmd.Context(), f, op)
				if err != nil {
					return err
				}
				results = append(results, r)
			}
			rows := make([][]string, len(results))
			ms := func(v float64) string { return strconv.FormatFloat(v, 'f', 2, 64) }
			for i, r := range results {
				rows[i] = []string{r.Op, strconv.Itoa(r.Clients), strconv.Itoa(r.Ops), strconv.Itoa(r.Errors), strconv.FormatFloat(r.PerSecond, 'f', 0, 64), ms(r.P50), ms(r.P90), ms(r.P99)}
			}
			return out.print(a.stdout, view{data: results, headers: []string{"OP", "CLIENTS", "OPS", "ERRORS", "OPS/S", "P50_MS", "P90_MS", "P99_MS"}, rows: rows})
		},
	}
	a.conn.register(cmd.Flags())
	out.register(cmd)
	cmd.Flags().IntVar(&f.clients, "clients", 16, "concurrent clients, each with its own connection and session")
	cmd.Flags().DurationVar(&f.duration, "duration", 10*time.Second, "how long each workload runs")
	cmd.Flags().StringSliceVar(&f.ops, "ops", []string{"put", "acquire"}, "workloads to run, in order: put, acquire")
	cmd.Flags().IntVar(&f.size, "value-size", 64, "bytes per value written")
	return cmd
}

// bench runs workload op with f.clients clients for f.duration.
func (a *app) bench(ctx context.Context, f benchFlags, op string) (benchResult, error) {
	run := fmt.Sprintf("bench-%d-%s", time.Now().UnixNano(), op)
	workers := make([]*benchWorker, f.clients)
	var conns []*grpc.ClientConn
	defer func() {
		for _, w := range workers {
			if w == nil {
				continue
			}
			cctx, cancel := context.WithTimeout(context.Background(), a.conn.timeout)
			_, _ = w.c.Delete(cctx, w.held.Token(), w.key)
			_ = w.sess.Close(cctx)
			cancel()
		}
		for _, cc := range conns {
			cc.Close()
		}
	}()
	for i := range workers {
		cc, err := a.conn.dial()
		if err != nil {
			return benchResult{}, err
		}
		conns = append(conns, cc)
		w := &benchWorker{c: client.New(cc), lease: fmt.Sprintf("%s-%d", run, i), key: fmt.Sprintf("bench/%s/%d", run, i), value: make([]byte, f.size)}
		if w.sess, err = w.c.NewSession(); err != nil {
			return benchResult{}, err
		}
		sctx, cancel := context.WithTimeout(ctx, a.conn.timeout)
		w.held, err = w.sess.Acquire(sctx, w.lease)
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
	if ctx.Err() != nil {
		return benchResult{}, ctx.Err()
	}
	all := slices.Concat(lat...)
	slices.Sort(all)
	r := benchResult{Op: op, Clients: f.clients, Ops: len(all), PerSecond: float64(len(all)) / elapsed.Seconds()}
	for _, n := range errs {
		r.Errors += n
	}
	if len(all) == 0 {
		return r, firstErr // no call succeeded: say why
	}
	pct := func(p float64) float64 { return float64(all[int(p*float64(len(all)-1))]) / float64(time.Millisecond) }
	r.P50, r.P90, r.P99 = pct(0.50), pct(0.90), pct(0.99)
	if r.Errors > 0 {
		fmt.Fprintf(a.stderr, "fencer bench: %s: %d calls failed, the first with: %s\n", op, r.Errors, describe(firstErr, a.conn.server, a.conn.secure()).msg)
	}
	return r, nil
}
