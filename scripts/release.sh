#!/usr/bin/env bash
# Cuts fencer release VERSION (see docs/releasing.md): on a clean tree, it
# sets every module's requirements on fencer's other modules (token, proto,
# client, internal/mutant, internal/freeport, internal/rendezvous,
# kubeadapter, mcr) to VERSION,
# commits, tags the commit with each module's tag (token/VERSION, ...,
# kubeadapter/VERSION) and VERSION for the root, builds the release binaries
# into dist/ with the version and commit stamped, and prints the commands
# that push the tags and build the image. It pushes nothing.
#
# PLATFORMS (default "linux/amd64 linux/arm64") lists the GOOS/GOARCH pairs
# to build.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

die() {
	echo "release: $*" >&2
	exit 1
}

[ $# -eq 1 ] || die "usage: scripts/release.sh VERSION (e.g. v0.1.0)"
version="$1"
# Semantic version with Go's leading v, without build metadata, which
# module versions cannot carry.
semver='^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?$'
[[ "$version" =~ $semver ]] || die "$version is not a semantic version vMAJOR.MINOR.PATCH[-PRERELEASE]"
# From v2 on, Go needs the major version in every module path (/v2).
[ "${BASH_REMATCH[1]}" -le 1 ] || die "$version: major versions above 1 need /v${BASH_REMATCH[1]} module paths"
[ -z "$(git status --porcelain)" ] || die "the working tree is not clean (git status)"

root=github.com/fencer-dev/fencer
modules=(token proto client internal/mutant internal/freeport internal/rendezvous kubeadapter mcr)
for m in "${modules[@]}" ""; do
	tag="${m:+$m/}$version"
	if git rev-parse -q --verify "refs/tags/$tag" >/dev/null; then
		die "tag $tag exists"
	fi
done

# The requirements on fencer's modules name the release; the replace
# directives stay, so that a checkout still builds from its directories.
# kubeadapter/shard/e2e holds tests only and is not tagged.
requires() { # module directory, the modules it requires
	local dir="$1" args=()
	shift
	for m in "$@"; do args+=("-require=$root/$m@$version"); done
	(cd "$dir" && go mod edit "${args[@]}")
}
requires . token proto client internal/mutant internal/freeport internal/rendezvous kubeadapter
requires client token proto
requires kubeadapter token internal/mutant internal/freeport internal/rendezvous
requires kubeadapter/shard/e2e kubeadapter
requires mcr kubeadapter token internal/mutant internal/freeport internal/rendezvous
for m in . "${modules[@]}" kubeadapter/shard/e2e; do
	(cd "$m" && go mod tidy)
done
git commit -q -am "fencer $version: every module requires fencer's other modules at $version"
commit="$(git rev-parse HEAD)"
for m in "${modules[@]}" ""; do
	git tag -a -m "fencer $version" "${m:+$m/}$version" "$commit"
done

mkdir -p dist
for platform in ${PLATFORMS:-linux/amd64 linux/arm64}; do
	goos="${platform%/*}"
	goarch="${platform#*/}"
	out="dist/fencer-$version-$goos-$goarch"
	CGO_ENABLED=0 GOOS="$goos" GOARCH="$goarch" go build -trimpath \
		-ldflags="-s -w -X main.version=$version -X main.commit=$commit" -o "$out" ./cmd/fencer
	echo "built $out"
done
(cd dist && sha256sum fencer-"$version"-* >"fencer-$version.sha256")

cat <<EOF
tagged $commit as ${modules[*]/%//$version} $version
push the commit and the tags:
  git push origin HEAD ${modules[*]/%//$version} $version
build and push the image:
  docker build -t REGISTRY/fencer:$version --build-arg VERSION=$version --build-arg COMMIT=$commit .
  docker push REGISTRY/fencer:$version
EOF
