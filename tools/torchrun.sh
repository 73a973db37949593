#!/usr/bin/env bash
# tools/torchrun.sh N SCRIPT [ARGS...]: runs SCRIPT on N local processes with /usr/bin/python3,
# each with RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR=127.0.0.1 and a free MASTER_PORT, the
# environment torch.distributed's env:// initialisation reads. Debian 12's
# `python3 -m torch.distributed.run` fails under Python 3.11 in its elastic agent; this is the
# loopback part of it. Exits with the first non-zero status of a rank (then stops the others),
# 0 when every rank succeeded. INT or TERM stops the ranks; the exit status is then 128 + the signal
# (or a rank's earlier failure). PYTHONPATH gains build/python (the ckpt package) when present.
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
status=0
signalled=0  # 128 + the signal that stopped the launcher
live=()      # the ranks not yet waited for
stop() {
  signalled=$((128 + $1))
  [ "${#live[@]}" -eq 0 ] || kill "${live[@]}" 2>/dev/null
}
trap 'stop 2' INT
trap 'stop 15' TERM
for ((r = 0; r < n; r++)); do
  RANK=$r LOCAL_RANK=$r WORLD_SIZE=$n LOCAL_WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 \
    MASTER_PORT=$port "$python" "$@" &
  live+=($!)
done
# finish PID RC: PID has ended with RC; the first failure stops the other ranks.
finish() {
  local p keep=()
  for p in "${live[@]}"; do [ "$p" != "$1" ] && keep+=("$p"); done
  live=("${keep[@]}")
  if [ "$2" -ne 0 ] && [ "$status" -eq 0 ]; then
    status=$2
    [ "${#live[@]}" -gt 0 ] && kill "${live[@]}" 2>/dev/null
  fi
  return 0
}
while [ "${#live[@]}" -gt 0 ]; do
  unset done_pid
  wait -n -p done_pid "${live[@]}" 2>/dev/null
  rc=$?
  if [ -n "${done_pid-}" ]; then
    finish "$done_pid" "$rc"
    continue
  fi
  # No pid: a signal (INT, TERM: the trap has stopped the ranks) ended the wait, or bash 5.2's
  # wait -n answered 127 because a rank ended and left the job table between two waits (about 1
  # run in 1000 with two ranks that end together). A rank gone from the process table has
  # ended; `wait PID` gives its status where bash kept it (it did in that race), and after a
  # signal a rank whose status bash dropped counts as stopped by it.
  found=0
  for p in "${live[@]}"; do
    if ! kill -0 "$p" 2>/dev/null; then
      wait "$p" 2>/dev/null
      rc=$?
      [ "$rc" -eq 127 ] && [ "$signalled" -ne 0 ] && rc=$signalled
      [ "$rc" -eq 127 ] && echo "torchrun.sh: the exit status of rank pid $p was lost" >&2
      finish "$p" "$rc"
      found=1
    fi
  done
  [ "$found" -eq 1 ] || sleep 0.05
done
# Stopped by a signal: never a success.
[ "$status" -eq 0 ] && status=$signalled
exit "$status"
