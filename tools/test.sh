#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test suite (Catch2 via CTest).
# Stage 2 rebuilds with AddressSanitizer + UndefinedBehaviorSanitizer and runs the unit suites
# again (skip with CKPT_SKIP_SANITIZE=1).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$CKPT_ROOT"

ckpt_install_packages
ckpt_build build
ckpt_log "running tests (build/)"
if ! ctest --test-dir build --output-on-failure -j 2 --timeout 1500; then
  # Twice in fresh-clone runs a rank of a 2-process torch/gloo job aborted with nothing but
  # "terminate called without an active exception"; about 300 runs here did not reproduce it.
  # Those tests preload tests/terminate_trace.cc, so the output above has the aborting
  # thread's native stack (and Python's fault handler the Python stacks). One more run is
  # given only when every failed test launches torch jobs (label `torch`), the log shows that
  # abort, and no frame of its native stack is ckpt's: any other failure fails here.
  failed=$(sed -n 's/^[0-9]*://p' build/Testing/Temporary/LastTestsFailed.log)
  torch_tests=$(ctest --test-dir build -N -L torch | sed -n 's/^ *Test *#[0-9]*: *//p')
  log=build/Testing/Temporary/LastTest.log
  retry=1
  for t in $failed; do
    grep -qx "$t" <<<"$torch_tests" || retry=0
  done
  grep -q "terminate called without an active exception" "$log" || retry=0
  stacks=$(grep -A64 "std::terminate called; native stack" "$log" || true)
  if grep -q "_ckpt\.cpython\|libckpt" <<<"$stacks"; then
    retry=0
  fi
  [ "$retry" = 1 ] || exit 1
  ckpt_log "rerunning once, after the torch rank abort above: $(echo $failed)"
  ctest --test-dir build --output-on-failure --rerun-failed --timeout 1500
  echo "tools/test.sh: $(echo $failed) failed once (a torch rank abort, stacks above) and" \
    "passed when run again" >&2
fi

if [ "${CKPT_SKIP_SANITIZE:-0}" != "1" ]; then
  # Only the suites labelled `sanitize` (the format library and its reliability tests) are
  # built and run here; MPI and python-driven suites stay in the plain build.
  ckpt_configure build-asan -DCMAKE_BUILD_TYPE=Debug -DCKPT_SANITIZE=ON -DCKPT_CUDA=OFF
  mapfile -t asan_targets < <(ctest --test-dir build-asan -N -L sanitize |
                              sed -n 's/^ *Test *#[0-9]*: *//p')
  ckpt_build build-asan ckpt_cli "${asan_targets[@]}"
  ckpt_log "running them under ASan + UBSan"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    LSAN_OPTIONS=suppressions="$CKPT_ROOT/tests/lsan.supp":fast_unwind_on_malloc=0 \
    ctest --test-dir build-asan --output-on-failure -j 2 -L sanitize --timeout 1500
fi
