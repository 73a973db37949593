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
# The Python package, when the build has it (pybind11): installed under the prefix and importable
# from there (not from the build tree).
for pkg in "$work"/prefix/lib/python3*/dist-packages; do
  [ -d "$pkg/ckpt" ] || continue
  (cd "$work" && PYTHONPATH="$pkg" /usr/bin/python3 -c "
import ckpt, sys
assert ckpt.__file__.startswith(sys.argv[1]), ckpt.__file__
assert ckpt.ls(sys.argv[2])['tags'], 'the consumer saved a tag'
" "$pkg" "$work/root")
done
