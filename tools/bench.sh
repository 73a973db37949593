#!/usr/bin/env bash
# Benchmarks (issue 7): ckpt save / load / export / reshard / next-update side by side with the
# raw I/O floor and torch.save, measured in one invocation on the same bytes.
#
#   tools/bench.sh [--size 1GiB] [--ranks 4] [--reps 3] [--json FILE] [--skip PHASES] ...
#
# Builds Release into build-bench/ (Debian packages installed first, as tools/test.sh does),
# compiles the two measurement helpers under tools/bench/ against the built libckpt.a, then
# runs tools/bench/bench.py, which prints the table and PASS/MISS against the targets
# (`tools/bench.sh --help` lists every option). Never fails on a timing; exit 2 if it cannot run.
# Run as root to drop the page cache between phases (otherwise reads may come from memory and
# the report says so). docs/performance.md holds the latest figures. Other disks, as root:
# --throttle W[,R] a slow one (tools/bench/throttle.py); --memory-disk SIZE a fast one, ext4 on
# a loop device over a tmpfs file mounted at the work directory (tools/bench/memdisk.py).
#
# On a machine without the Debian packages (a lent GPU machine: quiet, 16 cores, its own disk),
# the binaries are built here and carried there, as tools/bench/gpu.sh does:
#   tools/bench.sh --prepare DIR            (here) builds, puts ckpt, ckpt_io and raw_io in DIR/bin
#                                           and the shared libraries they need in DIR/lib;
#   tools/bench.sh --prebuilt DIR [ARGS]    (there) runs tools/bench/bench.py with those binaries
#                                           (Python's standard library only; the phases that
#                                           need engine_min or Debian's torch are skipped,
#                                           with a note). A run stopped by SIGTERM (`timeout`)
#                                           still writes --json with the phases it finished.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$CKPT_ROOT"

for arg in "$@"; do
  if [ "$arg" = "--help" ] || [ "$arg" = "-h" ]; then
    exec /usr/bin/python3 tools/bench/bench.py --help
  fi
done
mode=build
if [ "${1:-}" = --prepare ] || [ "${1:-}" = --prebuilt ]; then
  [ -n "${2:-}" ] || { echo "bench.sh: $1 needs a directory" >&2; exit 2; }
  mode=${1#--}
  mkdir -p "$2"
  DIR=$(cd "$2" && pwd)
  shift 2
fi
if [ "$mode" = prebuilt ]; then
  [ -x "$DIR/bin/ckpt_io" ] ||
    { echo "bench.sh: $DIR/bin/ckpt_io not found (tools/bench.sh --prepare $DIR first)" >&2; exit 2; }
  export LD_LIBRARY_PATH="$DIR/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  py=/usr/bin/python3
  [ -x "$py" ] || py=python3
  exec "$py" tools/bench/bench.py --bin "$DIR/bin" "$@"
fi

ckpt_install_packages
ckpt_build build-bench -DCMAKE_BUILD_TYPE=Release -DCKPT_BUILD_TESTS=OFF

BIN=build-bench/bin
# The helpers are built here rather than by CMake so the benchmark adds no target to the
# project's build; they use only ckpt's public headers.
helper() {
  local out="$1" src="$2"
  shift 2
  if [ ! -x "$out" ] || [ "$src" -nt "$out" ] || [ tools/bench/raw_floor.h -nt "$out" ] ||
     [ build-bench/lib/libckpt.a -nt "$out" ] || [ tools/bench.sh -nt "$out" ]; then
    ckpt_log "compiling $out"
    g++ -O2 -std=c++20 -Wall -Wextra -Wno-unused-parameter "$src" -o "$out" "$@"
  fi
}
helper "$BIN/raw_io" tools/bench/raw_io.cc -lpthread
# As CMake links ckpt's executables (CKPT_STATIC_HDF5): Debian's static libhdf5 where it is
# there, so ckpt_io's rank processes start without the shared one's libcurl stack.
h5dir="$(pkg-config --libs-only-L hdf5-serial 2>/dev/null | sed 's/^ *-L//; s/ .*//' || true)"
if [ -n "$h5dir" ] && [ -f "$h5dir/libhdf5.a" ]; then
  HDF5_LIBS="$h5dir/libhdf5.a -lsz -lz -lm -ldl"
else
  HDF5_LIBS="$(pkg-config --libs hdf5-serial 2>/dev/null || pkg-config --libs hdf5)"
fi
# A CUDA build's libckpt.a stages device tensors for async saves through the CUDA runtime.
CUDA_LIBS=""
cudart="$(sed -n 's/^CUDA_cudart_static_LIBRARY:FILEPATH=//p' build-bench/CMakeCache.txt)"
if [ -n "$cudart" ] && [ "$(nm build-bench/lib/libckpt.a 2>/dev/null | grep -c ' U cudaHostAlloc')" -gt 0 ]; then
  CUDA_LIBS="$cudart -ldl -lrt"
fi
# libckpt.a opens libzip with dlopen on first use (ckpt/src/torch_archive.cc): not linked.
helper "$BIN/ckpt_io" tools/bench/ckpt_io.cc -Ickpt/include build-bench/lib/libckpt.a \
  $HDF5_LIBS -lzstd -lxxhash -lsimdjson -ldeflate -ldl -lpthread $CUDA_LIBS

if [ "$mode" = prepare ]; then
  mkdir -p "$DIR/bin"
  for b in ckpt ckpt_io raw_io; do cp "$BIN/$b" "$DIR/bin/"; done
  ckpt_carry_libs "$DIR/lib" "$DIR/bin/ckpt" "$DIR/bin/ckpt_io" "$DIR/bin/raw_io"
  # libzip, which ckpt opens with dlopen to read PyTorch .pt files (DeepSpeed checkpoints).
  zip=$(ldconfig -p | awk '$1 ~ /^libzip\.so\.[0-9]+$/ && !f {f = $NF} END {print f}')
  if [ -n "$zip" ]; then
    cp -L "$zip" "$DIR/lib/"
    ckpt_carry_libs "$DIR/lib" "$zip"
  fi
  du -sh "$DIR"
  exit 0
fi
exec /usr/bin/python3 tools/bench/bench.py "$@"
