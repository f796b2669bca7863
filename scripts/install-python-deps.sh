#!/usr/bin/env bash
# Installs what fencer's Python client and its tests need, from Debian:
# grpcio and protobuf for /usr/bin/python3, and venv (with pip and
# setuptools) and wheel for python/README.md's install line, which
# cmd/fencer's TestPythonInstall runs. Idempotent; when everything is
# installed it only checks and returns. Needs root (or sudo) to install.
set -euo pipefail

pkgs=(python3 python3-grpcio python3-protobuf python3-venv python3-wheel)

missing=()
for p in "${pkgs[@]}"; do
	if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
		missing+=("$p")
	fi
done
if [ ${#missing[@]} -eq 0 ]; then
	exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then
	sudo="sudo"
fi
echo "install-python-deps: installing ${missing[*]}" >&2
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
/usr/bin/python3 -c 'import grpc, google.protobuf, ensurepip, wheel' 
