#!/usr/bin/env bash
# Lints proto/ with buf (STANDARD rules, proto/buf.yaml). buf is built from
# the Go module proxy at a pinned version into .cache/bin on first use.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
version=v1.75.0
bin="$PWD/.cache/bin"
if [ "$("$bin/buf" --version 2>/dev/null)" != "${version#v}" ]; then
	echo "proto-lint: building buf $version into .cache/bin"
	GOBIN="$bin" GOFLAGS= go install "github.com/bufbuild/buf/cmd/buf@$version"
fi
cd proto
"$bin/buf" lint
echo "proto-lint: buf lint clean"
