#!/usr/bin/env bash
# The prepared I/O check for a session lent a machine (issue 19): one call of about 9 minutes on
# a quiet 16-core machine with a disk of its own, where the development VM is shared and its
# disk sits on the host's page cache (docs/performance.md, 2026-12-04 18:15).
#   tools/bench/device_io.sh --prepare DIR    (here) tools/bench.sh --prepare DIR, plus the
#                                             io_timeline.c shim in DIR/lib and DIR/ckpt.sh
#                                             (ckpt with those libraries);
#   tools/bench/device_io.sh --prebuilt DIR   (there, DIR carried) writes into $OUT (default
#                                             /tmp/device_io):
#     machine.txt    cores, memory, disks and their queues, kernel, Python's torch;
#     bench.*        tools/bench.sh --prebuilt DIR (1 GiB, 4 ranks, 5 pairs), stopped by SIGTERM
#                    after BENCH_S seconds (default 420) with the phases it finished;
#     tl.txt         io_timeline summaries of `check --deep` and `export-fp32` of a 1 GiB
#                    checkpoint of 4 ranks, three runs each after a cache drop, and raw_io's
#                    read and copy of the same files for comparison;
#     start.txt      what starting a program costs after a cache drop (its binary and libraries
#                    read from the disk): ckpt against raw_io, three times each, and ckpt warm;
#                    check --deep and export are timed from their start, raw_io is far smaller;
#     ds.txt         tests/deepspeed/check_deepspeed.py --quick with that machine's Python
#                    (its torch writes the fixtures), where it has torch, numpy and h5py.
# Run it as `set -o pipefail; bash tools/bench/device_io.sh --prebuilt DIR 2>&1 | tee $OUT/log`
# with timeout_s 600.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
case "${1:-}" in
  --prepare)
    [ -n "${2:-}" ] || { echo "device_io.sh: --prepare needs a directory" >&2; exit 2; }
    tools/bench.sh --prepare "$2" || exit 2
    gcc -O2 -shared -fPIC -o "$2/lib/io_timeline.so" tools/bench/io_timeline.c -ldl || exit 2
    # `ckpt` with its libraries, for the scripts that take a ckpt binary (check_deepspeed.py).
    printf '#!/bin/sh\nd=$(dirname "$0")\nLD_LIBRARY_PATH="$d/lib" exec "$d/bin/ckpt" "$@"\n' \
      >"$2/ckpt.sh"
    chmod +x "$2/ckpt.sh"
    exit 0
    ;;
  --prebuilt)
    [ -n "${2:-}" ] && [ -x "$2/bin/ckpt" ] ||
      { echo "device_io.sh: --prebuilt needs a directory made by --prepare" >&2; exit 2; }
    DIR=$(cd "$2" && pwd)
    ;;
  *)
    echo "usage: tools/bench/device_io.sh --prepare DIR | --prebuilt DIR" >&2
    exit 2
    ;;
esac
OUT=${OUT:-/tmp/device_io}
mkdir -p "$OUT"
py=$(command -v python3)
{
  date -u; nproc; free -g; df -hT .
  lsblk -d -o NAME,ROTA,SIZE,MODEL,LOG-SEC,PHY-SEC 2>/dev/null
  for q in /sys/block/*/queue; do
    [ -r "$q/scheduler" ] || continue
    echo "$q $(cat "$q/scheduler") nr_requests=$(cat "$q/nr_requests") max_sectors_kb=$(cat "$q/max_sectors_kb")"
  done
  uptime; uname -r
  "$py" -c 'import torch; print("torch", torch.__version__)' 2>&1 | tail -1
} >"$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"

# 1. The bench.
PYTHONUNBUFFERED=1 timeout -s TERM "${BENCH_S:-420}" bash tools/bench.sh --prebuilt "$DIR" \
  --size 1GiB --ranks 4 --reps 5 --reps2 3 \
  --skip scaling,variants,reshard,reshard_load,reshard_rss,nextupdate,async,rule \
  --work "$PWD/bench-work" --json "$OUT/bench.json" --markdown "$OUT/bench.md" 2>&1 |
  tee "$OUT/bench.log"
echo "bench: exit ${PIPESTATUS[0]}"
rm -rf "$PWD/bench-work"

# 2. Timelines of check --deep and export against raw_io on the same files.
ckpt() { LD_LIBRARY_PATH="$DIR/lib" "$DIR/bin/ckpt" "$@"; }
drop() { sync; echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || true; }
traced() {  # NAME N COMMAND...: the command after a cache drop under the shim
  local name=$1 n=$2
  shift 2
  drop
  IO_TIMELINE="$OUT/$name.$n.txt" LD_PRELOAD="$DIR/lib/io_timeline.so" LD_LIBRARY_PATH="$DIR/lib" \
    "$@" >/dev/null
  "$py" tools/bench/io_timeline.py "$OUT/$name.$n.txt" | head -1
  rm -f "$OUT/$name.$n.txt"
}
work=$PWD/tl-work
rm -rf "$work"
mkdir -p "$work/links"
ckpt synth "$work/ck" --ranks 4 --params 89478485 >/dev/null
tag=$(head -1 "$work/ck/latest")
for r in 0 1 2 3; do ln "$work/ck/$tag/rank_0000$r.h5" "$work/links/raw_$r.bin"; done
{
  for n in 1 2 3; do
    traced check "$n" "$DIR/bin/ckpt" check --deep "$work/ck"
    traced read "$n" "$DIR/bin/raw_io" read "$work/links" --files 4 --variant direct_64MiB
    rm -rf "$work/out"
    traced export "$n" "$DIR/bin/ckpt" export-fp32 "$work/ck" "$work/out"
    rm -rf "$work/copy"
    mkdir -p "$work/copy"
    # Export's floor: as many bytes as it reads (each rank's master, 89478484 bytes) per file.
    traced copy "$n" "$DIR/bin/raw_io" copy "$work/links" "$work/copy" --files 4 \
      --bytes-per-file 89478484 --variant direct_8MiB_x2
  done
} 2>&1 | tee "$OUT/tl.txt"
rm -rf "$work"

# 3. A cold start: the program and the libraries it loads, read from the disk after a drop.
{
  TIMEFORMAT=%R
  for n in 1 2 3; do
    drop
    cold=$({ time ckpt --version >/dev/null; } 2>&1)
    drop
    raw=$({ time "$DIR/bin/raw_io" variants write >/dev/null; } 2>&1)
    warm=$({ time ckpt --version >/dev/null; } 2>&1)
    echo "start after a drop: ckpt ${cold} s, raw_io ${raw} s; ckpt warm ${warm} s"
  done
  du -b "$DIR/bin/ckpt" "$DIR/bin/raw_io" "$DIR"/lib/*.so* 2>/dev/null
} 2>&1 | tee "$OUT/start.txt"

# 4. DeepSpeed fixtures written by this machine's torch.
if "$py" -c 'import torch, numpy, h5py' 2>/dev/null; then
  timeout 120 "$py" tests/deepspeed/check_deepspeed.py "$DIR/ckpt.sh" /tmp/device_io_ds --quick \
    >"$OUT/ds.txt" 2>&1
  echo "deepspeed check: exit $?"
  tail -3 "$OUT/ds.txt"
fi
