#!/usr/bin/env bash
# Runs fencer's benchmarks and prints their figures. Each benchmark measures
# fencer beside its baseline in the same run and reports the ratio through
# b.ReportMetric. BENCHTIME overrides the iteration counts (for example
# BENCHTIME=100x for a quick look).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export FENCER_REQUIRE_KUBE=1
bt="${BENCHTIME:-}"
# gotest runs go test on a package given from the repository root, in the
# module that holds it: the Kubernetes packages are a module of their own
# (kubeadapter), and so are the Sharder's end-to-end tests (kubeadapter/shard/e2e).
gotest() { # package, go test arguments...
	local pkg="$1" dir=.
	shift
	case "$pkg" in
	./kubeadapter/shard/e2e*) dir=kubeadapter/shard/e2e pkg=".${pkg#./kubeadapter/shard/e2e}" ;;
	./kubeadapter*) dir=kubeadapter pkg=".${pkg#./kubeadapter}" ;;
	./mcr*) dir=mcr pkg=".${pkg#./mcr}" ;;
	esac
	(cd "$dir" && go test "$@" "${pkg:-.}")
}
run() { # package, benchmark regexp, default benchtime
	echo "== go test -run '^\$' -bench '$2' -benchtime ${bt:-$3} $1"
	gotest "$1" -run '^$' -bench "$2" -benchtime "${bt:-$3}" -count 1 | grep -E '^(Benchmark|ok|FAIL|---|panic)' || true
}
# etcd store: guarded Put vs a raw guarded Txn and a plain Put; Acquire+Release
# vs concurrency.Mutex at 1 and 64 goroutines, and a one-goroutine cycle taken
# apart with raw etcd calls; loss detection after an external delete.
run ./etcdstore 'BenchmarkGuardedPut$' 3000x
run ./etcdstore 'BenchmarkGuardedPutFreshKey$' 2000x
run ./etcdstore 'BenchmarkAcquireRelease$' 2000x
run ./etcdstore 'BenchmarkAcquireReleaseCost$' 2000x
run ./etcdstore 'BenchmarkLossDetection$' 500x
# Rings: etcd writes/s in the steady state, N shards over 3 members beside one
# etcd lease per shard, over 10 s; the time from a member's death to all its
# shards re-owned. N is FENCER_RING_BENCH_SHARDS (default 1,000): both sizes.
run ./ring 'BenchmarkSteadyWrites$' 1x
run ./ring 'BenchmarkDeathReown$' 5x
echo "== FENCER_RING_BENCH_SHARDS=10000"
FENCER_RING_BENCH_SHARDS=10000 run ./ring 'BenchmarkSteadyWrites$' 1x
FENCER_RING_BENCH_SHARDS=10000 run ./ring 'BenchmarkDeathReown$' 3x
# Rings through the Go client: Ring.Owns (memory), the Owns RPC
# (Ring.CheckOwns) and, for scale, Client.Check of the shard's token.
run ./integration/client 'BenchmarkRingOwns$' 20000x
# Rings through the binary: 3 fencer ring join processes over 10,000 shards,
# sampled until settled: never two owners, all owned.
echo "== FENCER_RING_JOIN_SHARDS=10000 go test -run '^TestRingJoinProcessesOwnEachShardOnce\$' ./cmd/fencer"
FENCER_RING_JOIN_SHARDS=10000 go test -run '^TestRingJoinProcessesOwnEachShardOnce$' -count 1 -v ./cmd/fencer | grep -E '^(---|ok|FAIL|panic)|ring_join_processes' || true
# Kubernetes, on the real kube-apiserver: fenced Update (first read from a
# cache, or live) vs a plain conditional client.Update; the admission
# policies' cost per update (policy.yaml, and with live-lease.yaml added) vs
# updates that no policy matches.
run ./kubeadapter/fenced 'BenchmarkFencedUpdate$' 3000x
run ./kubeadapter/fenced 'BenchmarkFencedPatch$' 3000x
run ./kubeadapter 'BenchmarkPolicyCost$' 3000x
# Service: guarded Put through gRPC vs a direct guarded etcd Txn (1 and 64
# clients); server RSS with 10,000 held leases (one full run per iteration).
run ./server 'BenchmarkServiceGuardedPut' 3000x
# Service: CPU per holder-key change with 200 WatchLease streams open vs 1.
run ./server 'BenchmarkWatchLeaseFanout' 1000x
echo "== go test -run '^\$' -bench BenchmarkServiceRSS10kLeases -benchtime 1x ./server"
go test -run '^$' -bench 'BenchmarkServiceRSS10kLeases' -benchtime 1x -count 1 ./server | grep -E '^(Benchmark|ok|FAIL|---|panic)' || true
# Self-fencing on the real kube-apiserver: 50 trials each of delete, replace
# and holder change, fencer beside stock client-go (15/10/2 s) in the same run.
echo "== go test -run '^\$' -bench BenchmarkSelfFence -benchtime 1x ./kubeadapter"
gotest ./kubeadapter -run '^$' -bench 'BenchmarkSelfFence$' -benchtime 1x -count 1 | grep -E '^(Benchmark|ok|FAIL|---|panic)|selffence_bench' || true
# Live-Lease admission on the real kube-apiserver: lag from an acquisition to
# the first refused stale write (p50/p99); cost per update with 1, 100 and
# 10,000 labelled Leases in the namespace beside updates the policy does not
# match; one binding per Lease instead of the selector binding.
run ./kubeadapter 'BenchmarkLiveLeaseLag$' 500x
run ./kubeadapter 'BenchmarkLiveLeaseUpdate/leases=(1|100)$' 300x
run ./kubeadapter 'BenchmarkLiveLeaseUpdate/leases=10000$' 20x
run ./kubeadapter 'BenchmarkLiveLeaseBindingPerLease$' 30x
# Sharding on the real kube-apiserver, 10,000 shards: Owns with 16 concurrent
# readers beside a map behind a sync.RWMutex; steady-state Lease writes of 3
# members (one heartbeat each) beside one Lease per shard renewed with GET+PUT,
# at a 2s and at a 10s period, counted by the API server's
# apiserver_request_total between two bracketed scrapes (window >= 30s), with
# the baseline's offered and achieved rates, its expired Leases and the ratios.
run ./kubeadapter/shard/e2e 'BenchmarkOwns$' 2000000x
echo "== go test -run '^\$' -bench BenchmarkShardRenewals -benchtime 1x -timeout 30m ./kubeadapter/shard/e2e"
gotest ./kubeadapter/shard/e2e -run '^$' -bench 'BenchmarkShardRenewals$' -benchtime 1x -count 1 -timeout 30m | grep -E '^(Benchmark|ok|FAIL|---|panic)' || true
# Rebalance of 10,000 shards on the real kube-apiserver: a fourth member joins,
# leaves gracefully, then a member crashes; shards moved, shard-Lease writes,
# the handover gap of each move (p50, p99, max, overlaps),
# API server Lease writes beside renewals, and time to converge.
echo "== go test -run '^\$' -bench BenchmarkShardRebalance -benchtime 1x -timeout 30m ./kubeadapter/shard/e2e"
gotest ./kubeadapter/shard/e2e -run '^$' -bench 'BenchmarkShardRebalance$' -benchtime 1x -count 1 -timeout 30m | grep -E '^(Benchmark|ok|FAIL|---|panic)' || true
# multicluster-runtime on the real kube-apiserver, 1,000 and 10,000 clusters:
# fencer's Coordinator beside mcr v0.24.1's sharded coordinator, 3 replicas
# each, renewals every 2s, unthrottled clients: time to engage every cluster
# from a cold start, steady-state Lease writes/s from the API server's
# apiserver_request_total over 20s, and the baseline's offered rate and lapsed
# Leases (docs/multicluster.md). The 10,000 case runs only here.
echo "== go test -run '^\$' -bench BenchmarkCoordinatorLeaseWrites -benchtime 1x -timeout 90m ./mcr -mcr-clusters=1000,10000"
gotest ./mcr -run '^$' -bench 'BenchmarkCoordinatorLeaseWrites$' -benchtime 1x -count 1 -timeout 90m -mcr-clusters=1000,10000 | grep -E '^(Benchmark|ok|FAIL|---|panic)|engaged after' || true
# End to end through the shipped binary: fencer bench (guarded puts, then
# acquire/release cycles, 64 clients with a session each, sharing one
# connection) against a fencer serve in its own process, on an embedded etcd.
echo "== fencer bench --clients 64 --duration 10s (against fencer serve, separate processes)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
go build -o "$tmp/fencer" ./cmd/fencer
addr=127.0.0.1:17899
"$tmp/fencer" serve --listen "$addr" --metrics-listen "" --data-dir "$tmp/data" 2>"$tmp/serve.log" &
serve_pid=$!
for _ in $(seq 100); do "$tmp/fencer" health --server "$addr" >/dev/null 2>&1 && break; sleep 0.1; done
"$tmp/fencer" bench --server "$addr" --clients 1 --duration 5s || true
"$tmp/fencer" bench --server "$addr" --clients 64 --duration 10s || true
# The same guarded puts and acquire/release cycles straight to the server's
# etcd through the library, interleaved with those through the server, their
# ratios, and the CPU time per call of the bench and of the server: the
# clients sharing one connection (and the baselines one etcd client), then,
# at 16 and 64 clients, a connection (and an etcd client) each.
for conns in 1 16 64; do
  for clients in 1 16 64; do
    [ "$conns" = 1 ] || [ "$conns" = "$clients" ] || continue
    echo "-- $clients clients, $conns connections"
    "$tmp/fencer" bench --server "$addr" --server-pid "$serve_pid" --clients "$clients" --connections "$conns" --duration 3s \
      --ops put,direct-put,put,direct-put,put,direct-put,acquire,direct-acquire,acquire,direct-acquire,acquire,direct-acquire \
      --etcd-endpoints "unix://$tmp/data/etcd.sock" || true
  done
done
kill "$serve_pid"
wait "$serve_pid" || true
# Space: a 10-minute soak of 1 KiB overwrites of one key, as fast as 32
# writers get them into the embedded etcd member (in process, faster than
# through fencer serve), under a 256 MiB quota and the default compaction
# policy: the largest database file, writes/s, writes refused for space
# (must be 0), compactions and NOSPACE recoveries (embedetcd TestSoak).
# FENCER_SOAK_DURATION shortens it.
echo "== FENCER_SOAK=1 go test -run '^TestSoak\$' -v ./embedetcd"
FENCER_SOAK=1 go test -run '^TestSoak$' -v -count 1 -timeout 30m ./embedetcd | grep -E 'soak:|^(ok|FAIL|---|panic)|Error' || true
# The same space soak through the shipped binary: fencer bench --ops put
# --clients 32 --value-size 1024 against fencer serve --etcd-quota-bytes
# 268435456 (256 MiB), two processes, for 10 minutes, sampling the server's
# /metrics: puts/s, MiB written, the largest database file, compactions,
# puts failed (must be 0) and NOSPACE alarms (must be 0)
# (cmd/fencer TestServeSoak; make test runs 30 s of it under 16 MiB).
# FENCER_SOAK_DURATION shortens it.
echo "== FENCER_SOAK=1 go test -run '^TestServeSoak\$' -v ./cmd/fencer"
FENCER_SOAK=1 go test -run '^TestServeSoak$' -v -count 1 -timeout 30m ./cmd/fencer | grep -E 'soak:|^(ok|FAIL|---|panic)|Error' || true
# Scale curves through the shipped binary: fencer serve (embedded etcd) with
# 1 to 10,000 sessions of 10 leases, 10,000 and 100,000 leases, and 1 to
# 10,000 WatchLease streams, each point beside etcd's own client doing the
# same work on the same embedded etcd; prints the tables with their growth
# rates and draws docs/scale-*.svg. The largest points take minutes.
for curve in Sessions Leases WatchStreams; do
  echo "== go test -run '^\$' -bench 'BenchmarkScale$curve\$' -benchtime 1x -timeout 60m ./cmd/fencer"
  FENCER_SCALE_DOCS="$PWD/docs" go test -run '^$' -bench "BenchmarkScale$curve\$" -benchtime 1x -count 1 -timeout 60m ./cmd/fencer |
    grep -E '^(Benchmark|ok|FAIL|---|panic|\||scale:)' || true
done
