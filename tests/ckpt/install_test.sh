#!/usr/bin/env bash
# Installs the build tree into a scratch prefix and checks what a user of the install gets:
# bin/ckpt, bin/engine_min and bin/next_update_worker, a consumer built with find_package(ckpt)
# against ckpt::ckpt, ckpt::safetensors, ckpt::convert, ckpt::verify and ckpt::estimate, and the
# HDF5 zstd filter where CKPT_HDF5_PLUGIN_DIR says, which lets h5py read a compressed
# checkpoint.
set -euo pipefail
build="$1"
src="$(cd "$(dirname "$0")" && pwd)/install_consumer"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
prefix="$work/prefix"
cmake --install "$build" --prefix "$prefix" >/dev/null
"$prefix/bin/ckpt" --version
test -x "$prefix/bin/engine_min" || { echo "install_test: no bin/engine_min" >&2; exit 1; }
test -x "$prefix/bin/next_update_worker" ||
  { echo "install_test: no bin/next_update_worker" >&2; exit 1; }
cmake -S "$src" -B "$work/build" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
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
plugins="$(cat "$work/build/plugin_dir.txt")"
case "$plugins" in "$prefix"/*) ;; *) echo "install_test: plugin dir $plugins outside the prefix" >&2; exit 1;; esac
"$prefix/bin/ckpt" synth "$work/zroot" --ranks 1 --params 4000 --compress zstd:3 >/dev/null
HDF5_PLUGIN_PATH="$plugins" /usr/bin/python3 - "$work/zroot" <<'PY'
import glob, sys
import h5py
path = glob.glob(sys.argv[1] + "/global_step*/rank_00000.h5")[0]
with h5py.File(path, "r") as f:
    ds = f["master"]
    assert ds.compression is not None or ds._filters, "expected a compressed dataset"
    ds[()]  # needs the zstd filter
print("h5py read a zstd dataset through", path)
PY
