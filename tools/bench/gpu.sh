#!/usr/bin/env bash
# The prepared GPU check of issue 7 (item 6), for a session that is lent a device. One script,
# a few minutes on a 16-core machine; prints JSON lines to paste into docs/performance.md:
#   1. the next-update CUDA kernel against a device-to-device copy of the same bytes
#      (`ckpt next-update --bench-bytes N --device cuda`, CUDA events, best of reps), at 256 MiB,
#      1 GiB and 4 GiB of inputs (w, m, v, g);
#   2. host <-> device copy rates, pinned and pageable, for the save and load path
#      (tools/bench/copy_rates.cu).
# Not yet run: this repository's development machine has no GPU.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
cd "$CKPT_ROOT"
BUILD=build-bench-cuda
export PATH="$PATH:/usr/local/cuda/bin"
command -v nvcc >/dev/null || { echo "gpu.sh: nvcc not found" >&2; exit 2; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
ckpt_build "$BUILD" -DCMAKE_BUILD_TYPE=Release -DCKPT_BUILD_TESTS=OFF -DCKPT_CUDA=ON
for bytes in $((256 << 20)) $((1 << 30)) $((4 << 30)); do
  "$BUILD/bin/ckpt" next-update --bench-bytes "$bytes" --bench-reps 5 --device cuda --json |
    tr -d '\n'
  echo
done
nvcc -O2 -o "$BUILD/bin/copy_rates" tools/bench/copy_rates.cu
"$BUILD/bin/copy_rates" $((1 << 30))
