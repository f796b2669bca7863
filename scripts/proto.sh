#!/usr/bin/env bash
# Regenerates the code generated from proto/: the Go messages and gRPC
# stubs beside the .proto files, and the Python modules under python/.
# The tools are pinned, so the output is the same on every machine:
#   - protoc and grpc_python_plugin from Debian 12 (protobuf-compiler,
#     protobuf-compiler-grpc), installed if missing;
#   - protoc-gen-go and protoc-gen-go-grpc built from the Go module proxy
#     into .cache/bin.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

protoc_gen_go_version=v1.36.12
protoc_gen_go_grpc_version=v1.6.2
protoc_version="libprotoc 3.21.12"

if ! command -v protoc >/dev/null || ! command -v grpc_python_plugin >/dev/null; then
	sudo=""
	if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
	$sudo apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends protobuf-compiler protobuf-compiler-grpc >/dev/null
fi
if [ "$(protoc --version)" != "$protoc_version" ]; then
	echo "proto.sh: want $protoc_version, have $(protoc --version)" >&2
	exit 1
fi

bin="$PWD/.cache/bin"
mkdir -p "$bin"
stamp="$bin/.versions"
want="$protoc_gen_go_version $protoc_gen_go_grpc_version"
if [ ! -x "$bin/protoc-gen-go" ] || [ ! -x "$bin/protoc-gen-go-grpc" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
	GOBIN="$bin" go install "google.golang.org/protobuf/cmd/protoc-gen-go@$protoc_gen_go_version"
	GOBIN="$bin" go install "google.golang.org/grpc/cmd/protoc-gen-go-grpc@$protoc_gen_go_grpc_version"
	echo "$want" >"$stamp"
fi

protos=(fencer/v1/fencer.proto)

rm -f proto/fencer/v1/*.pb.go
PATH="$bin:$PATH" protoc -I proto \
	--go_out=proto --go_opt=paths=source_relative \
	--go-grpc_out=proto --go-grpc_opt=paths=source_relative \
	"${protos[@]}"

rm -f python/fencer/v1/*_pb2.py python/fencer/v1/*_pb2_grpc.py
mkdir -p python/fencer/v1
protoc -I proto \
	--python_out=python \
	--grpc_python_out=python --plugin=protoc-gen-grpc_python="$(command -v grpc_python_plugin)" \
	"${protos[@]}"
