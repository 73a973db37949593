#!/usr/bin/env bash
# The prepared GPU check of issue 7 (item 6) and issue 5 (multi-GPU next-update), for a session
# that is lent a device. One script, a few minutes on a 16-core machine; prints JSON lines to
# paste into docs/performance.md and docs/verify.md:
#   1. the next-update CUDA kernel against a device-to-device copy of the same bytes
#      (`ckpt next-update --bench-bytes N --device cuda`, CUDA events, best of reps), at 256 MiB,
#      1 GiB and 4 GiB of inputs (w, m, v, g);
#   2. host <-> device copy rates, pinned and pageable, for the save and load path
#      (tools/bench/copy_rates.cu);
#   3. `ckpt next-update --device cuda` on a synthetic 64M-parameter checkpoint with one GPU and,
#      when there are several, split over all of them (`--gpus N`: one process per GPU, NCCL
#      all-reduce); the split must give the one-GPU digests (exit 1 otherwise), with wall times.
# A lent GPU machine has CUDA, CMake and ninja but not the Debian packages ckpt builds
# against, and reaches no package registry, so the binaries are built here and carried there:
#   tools/bench/gpu.sh --prepare DIR    (here, no GPU needed) builds build-bench-cuda and puts
#                                       ckpt, next_update_worker, copy_rates and the shared
#                                       libraries they need beyond glibc and libstdc++ in DIR
#                                       (a folder .git/info/exclude ignores, to name in `carry`);
#   tools/bench/gpu.sh --prebuilt DIR   (there) runs steps 1-3 with those binaries;
#   tools/bench/gpu.sh                  builds and runs on a machine that has both.
# First run on 2026-12-04 (one H200, steps 1-3 with one GPU): docs/verify.md, "Speed".
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
cd "$CKPT_ROOT"
BUILD=build-bench-cuda
export PATH="$PATH:/usr/local/cuda/bin"
mode=build
if [ "${1:-}" = --prepare ] || [ "${1:-}" = --prebuilt ]; then
  [ -n "${2:-}" ] || { echo "gpu.sh: $1 needs a directory" >&2; exit 2; }
  mode=${1#--}
  if [ "$mode" = prepare ]; then mkdir -p "$2/lib"; fi
  if [ "$mode" = prebuilt ] && [ ! -x "$2/ckpt" ]; then
    echo "gpu.sh: $2/ckpt not found (tools/bench/gpu.sh --prepare $2 first)" >&2
    exit 2
  fi
  DIR=$(cd "$2" && pwd)
fi
if [ "$mode" != prebuilt ]; then
  command -v nvcc >/dev/null || { echo "gpu.sh: nvcc not found" >&2; exit 2; }
  ckpt_build "$BUILD" -DCMAKE_BUILD_TYPE=Release -DCKPT_BUILD_TESTS=OFF -DCKPT_CUDA=ON
  nvcc -O2 -arch=sm_90 -o "$BUILD/bin/copy_rates" tools/bench/copy_rates.cu
fi
if [ "$mode" = prepare ]; then
  for b in ckpt next_update_worker copy_rates; do cp "$BUILD/bin/$b" "$DIR/"; done
  ckpt_carry_libs "$DIR/lib" "$BUILD/bin/ckpt" "$BUILD/bin/next_update_worker"
  du -sh "$DIR"
  exit 0
fi
if [ "$mode" = prebuilt ]; then
  BIN=$DIR
  export LD_LIBRARY_PATH="$DIR/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  # NCCL (loaded when --gpus N runs) from the machine's Python packages, if it has them.
  nccl=$(python3 -c 'import os, nvidia.nccl as n; print(os.path.join(list(n.__path__)[0], "lib"))' \
    2>/dev/null || true)
  if [ -n "$nccl" ]; then export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$nccl"; fi
else
  BIN=$BUILD/bin
fi
export CKPT_BIN_DIR=$BIN  # next_update_worker for --gpus N
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
for bytes in $((256 << 20)) $((1 << 30)) $((4 << 30)); do
  "$BIN/ckpt" next-update --bench-bytes "$bytes" --bench-reps 5 --device cuda --json |
    tr -d '\n'
  echo
done
"$BIN/copy_rates" $((1 << 30))

# 3. Multi-GPU next-update.
gpus=$(nvidia-smi -L | wc -l)
work=$(mktemp -d /tmp/ckpt-gpu-XXXXXX)
trap 'rm -rf "$work"' EXIT
"$BIN/ckpt" synth "$work/ckpt" --ranks 4 --params 64M --zero 2 >/dev/null
"$BIN/ckpt" export-fp32 "$work/ckpt" "$work/grad" --max-shard-size 0 --exclude-frozen \
  >/dev/null
run_next_update() {  # GPUS OUT.json: prints {"gpus", "seconds", "processes", "digests"}
  local t0 t1
  t0=$(date +%s.%N)
  "$BIN/ckpt" next-update "$work/ckpt" --grad "$work/grad/model.safetensors" \
    --device cuda --gpus "$1" --json >"$2"
  t1=$(date +%s.%N)
  /usr/bin/python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(json.dumps({"gpus": int(sys.argv[2]), "seconds": round(float(sys.argv[4]) - float(sys.argv[3]), 3), "processes": r["processes"], "devices": r["devices"], "elements": r["elements"], "digests": r["digests"]}))' \
    "$2" "$1" "$t0" "$t1"
}
run_next_update 1 "$work/one.json"
if [ "$gpus" -ge 2 ]; then
  run_next_update "$gpus" "$work/all.json"
  /usr/bin/python3 - "$work/one.json" "$work/all.json" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
same = a["digests"] == b["digests"] and all(
    a["overall"][k]["max_abs"] == b["overall"][k]["max_abs"] and
    a["overall"][k]["n_differ"] == b["overall"][k]["n_differ"]
    for k in ("weights_only", "moments_dropped"))
print(json.dumps({"multi_gpu_matches_one_gpu": same}))
sys.exit(0 if same else 1)
PY
else
  echo '{"multi_gpu": "skipped: one GPU visible"}'
fi
