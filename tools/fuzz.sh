#!/usr/bin/env bash
# Runs every libFuzzer target for N seconds on the seed corpus (tests/fuzz/corpus/<target>/),
# after replaying what earlier runs found (tests/fuzz/findings/<target>/).
#
#   tools/fuzz.sh [--seconds N]
#                 [--targets "manifest rank_file resealed safetensors units torch_pickle json deepspeed
#                            universal"]
#                 [--out DIR]
#
# Builds the targets first (fuzz/build.sh, clang 14, ASan + UBSan). Inputs found during the
# run are kept in DIR/corpus/<target>/ (default build-fuzz/), never in the committed seed
# corpus; a crash, sanitizer report, timeout (10 s per input) or out-of-memory leaves its input
# in DIR/artifacts/<target>/ and fails the run. Prints executions and coverage per target;
# exit 0 when every target ran clean, 1 on a finding, 2 when it cannot run.
# CI runs `tools/fuzz.sh --seconds 20`; the documented long run is `--seconds 3600`.
set -uo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
seconds=20
targets="manifest rank_file resealed safetensors units torch_pickle json deepspeed universal"
out="$repo/build-fuzz"
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    --targets) targets="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    *) echo "usage: tools/fuzz.sh [--seconds N] [--targets \"...\"] [--out DIR]" >&2; exit 2 ;;
  esac
done
"$repo/fuzz/build.sh" --out "$out" || exit 2

failed=0
# require_reach COUNTS COUNT_SED WHAT: the last "fuzz_$t: COUNTS" line of $log joins $line, and
# the count COUNT_SED picks from it must not be 0 (else rc=1, "WHAT: the harness is broken").
require_reach() {
  local reach count
  reach=$(grep -o "fuzz_$t: $1" "$log" | tail -1)
  line="$line; ${reach#fuzz_"$t": }"
  count=$(echo "$reach" | sed -n "s/$2/\\1/p")
  if [ -z "$reach" ] || [ "${count:-0}" = 0 ]; then
    rc=1
    line="$line ($3: the harness is broken)"
  fi
}
summary=""
for t in $targets; do
  exe="$out/bin/fuzz_$t"
  seeds=("$repo/tests/fuzz/corpus/$t")
  # fuzz_resealed seals the rank-file seeds and the universal fixture's file anew.
  [ "$t" = resealed ] &&
    seeds=("$repo/tests/fuzz/corpus/rank_file" "$repo/tests/fuzz/universal_fixture")
  # What earlier runs found (tests/fuzz/findings/<target>/) is replayed first, every run.
  findings="$repo/tests/fuzz/findings/$t"
  [ -d "$findings" ] && seeds+=("$findings")
  corpus="$out/corpus/$t"
  artifacts="$out/artifacts/$t/"
  mkdir -p "$corpus" "$artifacts"
  log="$out/fuzz_$t.log"
  # The pickle seeds must parse (CKPT_FUZZ_EXPECT_PARSE): proof that inputs reach the parser.
  if [ "$t" = torch_pickle ]; then
    if ! CKPT_FUZZ_EXPECT_PARSE=1 "$exe" "$seeds"/* >"$out/fuzz_${t}_seeds.log" 2>&1; then
      echo "fuzz_$t: a seed did not parse, see $out/fuzz_${t}_seeds.log"
      failed=1
      continue
    fi
  fi
  # Leak checking stays on except for the rank-file reader: HDF5 keeps library-wide caches
  # (free lists, the ID table) alive between inputs, which LeakSanitizer would report.
  leaks=1
  [ "$t" = rank_file ] && leaks=0
  [ "$t" = resealed ] && leaks=0
  [ "$t" = universal ] && leaks=0
  ASAN_OPTIONS="detect_leaks=$leaks:allocator_may_return_null=1" \
  UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
    "$exe" "$corpus" "${seeds[@]}" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
      -max_len=65536 -print_final_stats=1 -artifact_prefix="$artifacts" >"$log" 2>&1
  rc=$?
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*')
  line="fuzz_$t: ${seconds}s, ${execs:-?} executions, coverage ${cov:-?} edges, corpus $(ls "$corpus" | wc -l) inputs"
  # Harnesses that print how far their inputs got must get some all the way: the rank-file
  # reader past the metadata seal to HDF5 (fuzz/fuzz_rank_file.cc), the manifest parser past
  # the seal to the schema checks (fuzz/fuzz_manifest.cc), the DeepSpeed reader with a changed
  # file opened as a checkpoint (fuzz/fuzz_deepspeed.cc), a structure no seed has past the HDF5
  # probe into this process's libhdf5 and the readers (fuzz/fuzz_resealed.cc).
  if [ "$rc" = 0 ]; then
    case "$t" in
      rank_file) require_reach '[0-9]* inputs, [0-9]* past the manifest, [0-9]* past the metadata seal' \
                   '.*, \([0-9]*\) past the metadata seal' 'no input reached HDF5' ;;
      resealed) require_reach \
                  '[0-9]* inputs, [0-9]* refused by the probe ([0-9]* crashed it), [0-9]* walked, [0-9]* changed structures read ([0-9]* universal)' \
                  '.*, \([0-9]*\) changed structures read.*' 'no changed structure read past the probe' ;;
      deepspeed) require_reach \
                   "[0-9]* inputs, [0-9]* re-CRC'd, [0-9]* checkpoints opened, [0-9]* of them changed, [0-9]* read whole; [0-9]* integer mutations, [0-9]* opened" \
                   '.*, \([0-9]*\) of them changed,.*' 'no changed file opened as a checkpoint' ;;
      universal) require_reach \
                   '[0-9]* inputs, [0-9]* past the metadata seal, [0-9]* of them changed, [0-9]* read whole' \
                   '.*, \([0-9]*\) of them changed,.*' 'no changed input reached HDF5' ;;
      manifest) require_reach \
                  '[0-9]* inputs, [0-9]* re-sealed, [0-9]* parsed whole, [0-9]* by the fast path, [0-9]* summarized' \
                  '.*, \([0-9]*\) by the fast path,.*' 'no input parsed by the fast path' ;;
    esac
  fi
  if [ "$rc" != 0 ]; then
    failed=1
    line="$line, FAILED (exit $rc, see $log and $artifacts)"
    grep -E 'ERROR|SUMMARY|runtime error|Test unit written' "$log" | head -n 8 | sed 's/^/    /'
  fi
  echo "$line"
  summary="$summary$line"$'\n'
done
echo "fuzz: $(echo -n "$summary" | grep -c FAILED) of $(echo $targets | wc -w) targets failed"
exit "$failed"
