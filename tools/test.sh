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
ctest --test-dir build --output-on-failure -j 2 --timeout 1500

if [ "${CKPT_SKIP_SANITIZE:-0}" != "1" ]; then
  ckpt_build build-asan -DCKPT_SANITIZE=ON -DCKPT_CUDA=OFF
  ckpt_log "running unit and io tests under ASan + UBSan (build-asan/)"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir build-asan --output-on-failure -j 2 -L sanitize --timeout 1500
fi
