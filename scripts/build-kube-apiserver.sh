#!/usr/bin/env bash
# Builds the kube-apiserver that fencer's tests run against, from the pinned
# tools module in tools/kube-apiserver, into .cache/bin/kube-apiserver.
#
# The build takes several minutes cold, so it is skipped when the binary exists
# and tools/kube-apiserver/go.mod, go.sum and this script are unchanged since
# it was built (their sha256 sums are kept in .cache/bin/kube-apiserver.stamp).
# Set FORCE=1 to rebuild anyway.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
module="$repo/tools/kube-apiserver"
bin="$repo/.cache/bin/kube-apiserver"
stamp="$bin.stamp"

want="$(cd "$repo" && sha256sum tools/kube-apiserver/go.mod tools/kube-apiserver/go.sum scripts/build-kube-apiserver.sh)"

# The API server's etcd, a process of its own (the Kubernetes module holds
# no etcd server code): built from the etcd server module that fencer's
# root module requires, so it is the etcd that fencer serve embeds.
etcd="$repo/.cache/bin/etcd"
etcd_version="$(cd "$repo" && go list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3)"
if [[ "${FORCE:-0}" != 1 && -x "$etcd" && -f "$etcd.stamp" && "$(cat "$etcd.stamp")" == "$etcd_version" ]]; then
	echo "etcd: up to date at $etcd"
else
	mkdir -p "$(dirname "$etcd")"
	start=$SECONDS
	(cd "$repo" && go build -trimpath -buildvcs=false -o "$etcd.tmp" go.etcd.io/etcd/server/v3)
	mv "$etcd.tmp" "$etcd"
	printf '%s\n' "$etcd_version" >"$etcd.stamp"
	echo "etcd: built $etcd ($etcd_version) in $((SECONDS - start))s"
fi

if [[ "${FORCE:-0}" != 1 && -x "$bin" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
	echo "kube-apiserver: up to date at $bin"
	exit 0
fi

mkdir -p "$(dirname "$bin")"
echo "kube-apiserver: building k8s.io/kubernetes/cmd/kube-apiserver from $module (several minutes when cold)..."
start=$SECONDS
# Stamp the version the way Kubernetes' release builds do, so that
# kube-apiserver --version and /version report it rather than v0.0.0-master.
version="$(cd "$module" && go list -m -f '{{.Version}}' k8s.io/kubernetes)"
IFS=. read -r major minor _ <<<"${version#v}"
pkg=k8s.io/component-base/version
ldflags="-X $pkg.gitVersion=$version -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
# Build to a temporary name and rename, so that an interrupted build never
# leaves a half-written binary that a later run would take as current.
(cd "$module" && go build -trimpath -buildvcs=false -ldflags "$ldflags" -o "$bin.tmp" k8s.io/kubernetes/cmd/kube-apiserver)
mv "$bin.tmp" "$bin"
printf '%s\n' "$want" >"$stamp"
echo "kube-apiserver: built $bin ($("$bin" --version)) in $((SECONDS - start))s"
