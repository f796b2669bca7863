#!/usr/bin/env bash
# Runs every test of every module with the race detector (make test, after
# lint, the kube-apiserver and etcd builds, and the Python packages).
#
# The root module's tests and the Kubernetes modules' (kubeadapter, then
# the Sharder's end-to-end tests in kubeadapter/shard/e2e, then the
# multicluster-runtime Coordinator in mcr) run at the same
# time, as they did when they were one go test run: the Kubernetes chain's
# output is kept in .cache/test-kube.log and printed when it ends. Then the
# small modules and the alert-rule check run. The script fails if any part
# fails, after running them all.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export FENCER_REQUIRE_KUBE=1
flags=(-race -count=1 -timeout 20m)
mkdir -p .cache
log=.cache/test-kube.log
(
	set -e
	(cd kubeadapter && go test "${flags[@]}" ./...)
	(cd kubeadapter/shard/e2e && go test "${flags[@]}" ./...)
	(cd mcr && go test "${flags[@]}" ./...)
	# mcr's own sharded coordinator, the incident's baseline, has data
	# races of its own: the incident runs again without -race, both
	# coordinators in one run.
	(cd mcr && go test -count=1 -timeout 10m -run '^TestIncidentWithMCR$' .)
) >"$log" 2>&1 &
kube=$!
status=0
go test "${flags[@]}" ./... || status=1
# The stream handlers' stack sizes are measured without the race detector,
# which changes frame sizes.
go test -count=1 -run '^TestStreamHandlersKeepSmallStacks$' ./server || status=1
wait "$kube" || status=1
echo "== Kubernetes modules (kubeadapter, kubeadapter/shard/e2e, mcr):"
cat "$log"
for m in token proto client internal/mutant internal/freeport internal/rendezvous; do
	(cd "$m" && go test "${flags[@]}" ./...) || status=1
done
(cd tools/promcheck && go vet ./... && go test -count=1 ./...) || status=1
exit "$status"
