#!/usr/bin/env bash
# Installs the build tree into a scratch prefix and builds a consumer with find_package(ckpt).
set -euo pipefail
build="$1"
src="$(cd "$(dirname "$0")" && pwd)/install_consumer"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
cmake -S "$src" -B "$work/build" -G Ninja -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/build" >/dev/null
"$work/build/consumer" "$work/root"
