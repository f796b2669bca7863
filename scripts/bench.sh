#!/usr/bin/env bash
# Runs fencer's benchmarks and prints their figures. Each benchmark measures
# fencer beside its baseline in the same run and reports the ratio.
# BENCHTIME overrides the iteration counts (e.g. BENCHTIME=200x for a quick look).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export FENCER_REQUIRE_KUBE=1
bt="${BENCHTIME:-}"
run() { # package, benchmark regexp, default benchtime
	go test -run '^$' -bench "$2" -benchtime "${bt:-$3}" -count 1 "$1" | grep -E '^(Benchmark|ok|FAIL|---)' || true
}
run ./etcdstore 'BenchmarkGuardedPut$' 3000x
run ./etcdstore 'BenchmarkAcquireRelease$' 2000x
run ./etcdstore 'BenchmarkLossDetection$' 500x
