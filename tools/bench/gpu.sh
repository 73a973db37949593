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
# First run on 2026-12-04 (one H200; docs/verify.md, "Speed"), steps 1-3 with one GPU, with
# binaries built on the development machine and carried there: the lent machine's image has
# CUDA, CMake and ninja but not the Debian packages ckpt builds against.
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

# 3. Multi-GPU next-update.
gpus=$(nvidia-smi -L | wc -l)
work=$(mktemp -d /tmp/ckpt-gpu-XXXXXX)
trap 'rm -rf "$work"' EXIT
"$BUILD/bin/ckpt" synth "$work/ckpt" --ranks 4 --params 64M --zero 2 >/dev/null
"$BUILD/bin/ckpt" export-fp32 "$work/ckpt" "$work/grad" --max-shard-size 0 --exclude-frozen \
  >/dev/null
run_next_update() {  # GPUS OUT.json: prints {"gpus", "seconds", "processes", "digests"}
  local t0 t1
  t0=$(date +%s.%N)
  "$BUILD/bin/ckpt" next-update "$work/ckpt" --grad "$work/grad/model.safetensors" \
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
