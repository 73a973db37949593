#!/usr/bin/env bash
# Crash soak: start a save, SIGKILL a random process at a random moment, then check the root.
#
#   tools/crash-soak.sh [--trials N] [--seed S] [--bin DIR] [--work DIR] [--engine-every K]
#                       [--async] [--keep] [--verbose]
#
# Each trial is one of
#   synth   `ckpt synth SUB --tags 40 --keep-last 3` into a fresh sub-root, killed after a random
#           delay (0-1.5 s; a tag takes about 50 ms, so most kills land inside a save);
#   engine  `mpirun -n 2 engine_min train --save-every 1 --keep-last 3` on one persistent root
#           (resuming from `latest` after the first trial), one rank killed after a random delay;
#           mpirun then tears the job down. Every K-th trial is an engine trial (default 4; 0: none,
#           also when mpirun or engine_min is missing).
# --async: every trial is an engine trial, with --async-save: the kill lands while training runs
#          and a background thread writes or commits the previous step's save (docs/async.md).
# After each kill:
#   1. `ckpt ls --json ROOT` succeeds, lists no tag whose name starts with "." and no
#      unreadable tag;
#   2. when `latest` exists: `ckpt inspect` and `ckpt check --deep` exit 0 (every file and
#      dataset checksum), and for engine trials the next trial resumes from it;
#   3. `ckpt gc ROOT` exits 0 and afterwards `ckpt ls --json` reports no temporary directory.
# Prints one line per failure and a summary; exit 0 when no trial failed, 1 otherwise, 2 when
# it cannot run. The default is 50 trials; CI runs 40 (ctest reliability_crash_soak) and 6 with
# --async (reliability_crash_soak_async); the long runs are `tools/crash-soak.sh --trials 1000`
# and `tools/crash-soak.sh --async --trials 500`.
set -uo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/.." && pwd)"
trials=50
seed=$$
bin="${CKPT_BIN_DIR:-$repo/build/bin}"
work=""
engine_every=4
async=0
keep=0
verbose=0

usage() { sed -n '2,4p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --trials) trials="$2"; shift 2 ;;
    --seed) seed="$2"; shift 2 ;;
    --bin) bin="$2"; shift 2 ;;
    --work) work="$2"; shift 2 ;;
    --engine-every) engine_every="$2"; shift 2 ;;
    --async) async=1; shift ;;
    --keep) keep=1; shift ;;
    -v|--verbose) verbose=1; shift ;;
    -h|--help) usage ;;
    *) echo "crash-soak: unknown argument $1" >&2; usage ;;
  esac
done
case "$trials$engine_every" in *[!0-9]*) echo "crash-soak: --trials/--engine-every need integers" >&2; exit 2 ;; esac

ckpt="$bin/ckpt"
engine="$bin/engine_min"
if [ ! -x "$ckpt" ]; then
  echo "crash-soak: $ckpt not found (build ckpt_cli, or pass --bin DIR)" >&2
  exit 2
fi
if ! command -v python3 >/dev/null; then
  echo "crash-soak: python3 is needed to read ckpt ls --json" >&2
  exit 2
fi
engine_flags=()
if [ "$async" = 1 ]; then
  if [ ! -x "$engine" ] || ! command -v mpirun >/dev/null; then
    echo "crash-soak: --async needs $engine and mpirun" >&2
    exit 2
  fi
  engine_every=1
  engine_flags=(--async-save)
fi
if [ "$engine_every" -gt 0 ] && { [ ! -x "$engine" ] || ! command -v mpirun >/dev/null; }; then
  echo "crash-soak: engine_min or mpirun missing, synth trials only"
  engine_every=0
fi

if [ -z "$work" ]; then
  work="$(mktemp -d "${TMPDIR:-/tmp}/crash-soak.XXXXXX")"
else
  mkdir -p "$work"
fi
cleanup() {
  [ -n "${job_pid:-}" ] && kill -KILL -- "-$job_pid" 2>/dev/null
  [ "$keep" = 1 ] || rm -rf "$work"
}
trap cleanup EXIT

RANDOM=$((seed % 32768))
failures=0
synth_trials=0
engine_trials=0
with_latest=0
temporaries=0
hangs=0
early=0
log="$work/trial.log"

fail() {
  failures=$((failures + 1))
  echo "FAIL trial $trial ($kind, killed $victim after ${delay_ms} ms): $*"
  [ -s "$log" ] && sed 's/^/    /' "$log" | tail -n 5
}

# Prints "tags temporary latest bad" from `ckpt ls --json`: bad lists tags that must not exist
# (names starting with ".", unreadable manifests).
ls_summary() {
  "$ckpt" ls --json "$1" 2>>"$log" | python3 -c '
import json, sys
d = json.load(sys.stdin)
bad = [t["tag"] for t in d["tags"] if t["tag"].startswith(".") or t.get("error")]
print(len(d["tags"]), len(d["temporary"]), d["latest"] or "-", ",".join(bad) or "-")'
}

# Waits for pid up to $2 seconds; returns 0 when it ended.
wait_for() {
  local pid=$1 limit=$2 i=0
  while kill -0 "$pid" 2>/dev/null; do
    [ "$i" -ge $((limit * 10)) ] && return 1
    sleep 0.1
    i=$((i + 1))
  done
  return 0
}

check_root() {
  local root=$1 summary tags tmp latest bad
  if [ ! -d "$root" ]; then
    early=$((early + 1))  # killed before the root was created
    return
  fi
  if ! summary="$(ls_summary "$root")"; then
    fail "ckpt ls --json $root failed"
    return
  fi
  read -r tags tmp latest bad <<<"$summary"
  trial_latest=$latest
  temporaries=$((temporaries + tmp))
  [ "$bad" = "-" ] || fail "ckpt ls lists temporary or unreadable tags: $bad"
  if [ "$latest" != "-" ]; then
    with_latest=$((with_latest + 1))
    "$ckpt" inspect "$root" >"$log" 2>&1 || fail "latest ($latest) does not load: ckpt inspect exit $?"
    "$ckpt" check --deep "$root" >"$log" 2>&1 || fail "latest ($latest) fails ckpt check --deep (exit $?)"
  elif [ "$tags" -gt 0 ]; then
    fail "$tags committed tag(s) but no latest"
  fi
  "$ckpt" gc "$root" >"$log" 2>&1 || fail "ckpt gc exit $?"
  summary="$(ls_summary "$root")" || { fail "ckpt ls --json after gc failed"; return; }
  read -r tags tmp latest bad <<<"$summary"
  [ "$tmp" = 0 ] || fail "$tmp temporary director(ies) left after ckpt gc"
  # gc writes the `latest` that readers infer after a first save killed before writing it.
  if [ "$tags" -gt 0 ] && [ ! -f "$root/latest" ]; then
    fail "$tags committed tag(s) and no latest file after ckpt gc"
  fi
}

engine_root="$work/engine"
engine_zero=$((1 + RANDOM % 3))  # a resumed run must keep its ZeRO stage
start=$(date +%s)
for trial in $(seq 1 "$trials"); do
  kind=synth
  if [ "$engine_every" -gt 0 ] && [ $((trial % engine_every)) = 0 ]; then kind=engine; fi
  : >"$log"
  trial_start=$(date +%s)
  if [ "$kind" = synth ]; then
    synth_trials=$((synth_trials + 1))
    root="$work/synth-$trial"
    zero=$((RANDOM % 4))
    compress=none
    [ $((RANDOM % 2)) = 0 ] && compress=zstd:1
    setsid "$ckpt" synth "$root" --tags 40 --keep-last 3 --ranks $((1 + RANDOM % 3)) \
      --params 300k --zero "$zero" --compress "$compress" --seed "$trial" --json \
      >"$log" 2>&1 &
    job_pid=$!
    disown "$job_pid"  # polled with kill -0; no "Killed" notice from bash
    victim="ckpt synth"
    delay_ms=$((RANDOM % 1500))
  else
    engine_trials=$((engine_trials + 1))
    root="$engine_root"
    resume=(--overwrite)  # a fresh start: no latest (a first save killed before its commit)
    [ -e "$root/latest" ] && resume=(--resume)
    setsid mpirun --allow-run-as-root --oversubscribe -n 2 "$engine" train --model tiny \
      --zero "$engine_zero" --steps 100000 --save-every 1 --keep-last 3 \
      --ckpt-dir "$root" --trainlog "$work/trainlog.jsonl" "${resume[@]}" "${engine_flags[@]}" \
      >"$log" 2>&1 &
    job_pid=$!
    disown "$job_pid"
    victim="engine rank"
    delay_ms=$((500 + RANDOM % 2500))
  fi
  sleep "$(printf '%d.%03d' $((delay_ms / 1000)) $((delay_ms % 1000)))"
  if [ "$kind" = synth ]; then
    kill -KILL "$job_pid" 2>/dev/null
  else
    ranks=($(pgrep -P "$job_pid" -x engine_min))
    if [ "${#ranks[@]}" -gt 0 ]; then
      pick=$((RANDOM % ${#ranks[@]}))
      victim="engine rank pid ${ranks[$pick]} (of ${#ranks[@]})"
      kill -KILL "${ranks[$pick]}" 2>/dev/null
    else
      victim="mpirun (no engine_min child yet)"
      kill -KILL "$job_pid" 2>/dev/null
    fi
  fi
  if ! wait_for "$job_pid" 30; then
    hangs=$((hangs + 1))
    fail "the job did not end within 30 s of the kill"
  fi
  kill -KILL -- "-$job_pid" 2>/dev/null  # whatever is left of the session (orted, ranks)
  job_pid=""
  failures_before=$failures
  trial_latest=-
  check_root "$root"
  [ "$verbose" = 1 ] && echo "trial $trial ($(( $(date +%s) - trial_start ))s): $kind, killed $victim after ${delay_ms} ms, latest ${trial_latest:--}," \
    "$([ "$failures" = "$failures_before" ] && echo ok || echo FAILED)"
  [ "$kind" = synth ] && [ "$keep" = 0 ] && rm -rf "$root"
done
secs=$(( $(date +%s) - start ))

echo "crash-soak: $trials trials ($synth_trials ckpt synth, $engine_trials engine_min under mpirun$([ "$async" = 1 ] && echo ", --async-save"))," \
  "$with_latest with a committed latest, $temporaries temporary dirs left by kills" \
  "(all removed by gc), $early killed before creating the root, $hangs hangs, $failures failures, ${secs}s, seed $seed"
[ "$failures" = 0 ]
