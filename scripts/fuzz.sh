#!/usr/bin/env bash
# Runs every fuzz target of every module (the root, the light modules token,
# proto and client, the small internal ones and the Kubernetes modules) for
# FUZZTIME (default 10s) each.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
fuzztime="${FUZZTIME:-10s}"
for mod in . token proto client internal/mutant internal/freeport internal/rendezvous kubeadapter kubeadapter/shard/e2e mcr; do
	for pkg in $(cd "$mod" && go list ./...); do
		for target in $(cd "$mod" && go test -list '^Fuzz' "$pkg" | grep '^Fuzz' || true); do
			echo "== $pkg $target ($fuzztime)"
			(cd "$mod" && go test -run "^\$" -fuzz "^${target}\$" -fuzztime "$fuzztime" -fuzzminimizetime 100x "$pkg")
		done
	done
done
