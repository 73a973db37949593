#!/usr/bin/env bash
# tools/torchrun.sh N SCRIPT [ARGS...]: runs SCRIPT on N local processes with /usr/bin/python3,
# each with RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR=127.0.0.1 and a free MASTER_PORT, the
# environment torch.distributed's env:// initialisation reads. Debian 12's
# `python3 -m torch.distributed.run` fails under Python 3.11 in its elastic agent; this is the
# loopback part of it. Exits with the first non-zero status of a rank (then stops the others),
# 0 when every rank succeeded. PYTHONPATH gains build/python (the ckpt package) when present.
set -u
if [ $# -lt 2 ]; then
  echo "usage: tools/torchrun.sh N SCRIPT [ARGS...]" >&2
  exit 2
fi
n="$1"
shift
case "$n" in '' | *[!0-9]* | 0) echo "torchrun.sh: N must be a positive integer, got '$n'" >&2; exit 2 ;; esac
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${CKPT_PYTHON:-/usr/bin/python3}"
[ -x "$python" ] || python=python3
if [ -d "$here/build/python/ckpt" ]; then
  export PYTHONPATH="$here/build/python${PYTHONPATH:+:$PYTHONPATH}"
fi
port="${MASTER_PORT:-$("$python" "$here/tools/free_port.py")}"
pids=()
for ((r = 0; r < n; r++)); do
  RANK=$r LOCAL_RANK=$r WORLD_SIZE=$n LOCAL_WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 \
    MASTER_PORT=$port "$python" "$@" &
  pids+=($!)
done
trap 'kill "${pids[@]}" 2>/dev/null' INT TERM
status=0
remaining=$n
while [ "$remaining" -gt 0 ]; do
  wait -n -p done_pid
  rc=$?
  remaining=$((remaining - 1))
  if [ "$rc" -ne 0 ] && [ "$status" -eq 0 ]; then
    status=$rc
    for p in "${pids[@]}"; do [ "$p" != "$done_pid" ] && kill "$p" 2>/dev/null; done
  fi
done
exit "$status"
