#!/usr/bin/env bash
# The whole ctest suite under AddressSanitizer + UndefinedBehaviorSanitizer, in build-asan/
# (KRAUSE_SANITIZE=1). Not part of .ci/run (it would double CI's time); run it before a release
# or after touching memory-owning code. Extra arguments go to ctest, e.g. scripts/sanitize.sh -L e2e
# Timings on the 2-core development machine are in the README ("Tests").
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build-asan}
start=$(date +%s)
KRAUSE_SANITIZE=1 BUILD_DIR="$BUILD_DIR" BUILD_TYPE=${BUILD_TYPE:-RelWithDebInfo} \
  CMAKE_ARGS="-DKRAUSE_BUILD_BENCH=OFF ${CMAKE_ARGS:-}" scripts/build.sh
built=$(date +%s)
echo "sanitize: built in $((built - start)) s"
# LibTorch's lazily created singletons are never freed (leak checks off: the fuzzers check leaks
# per input); any other report fails the test that printed it.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:abort_on_error=1:detect_odr_violation=0:quarantine_size_mb=16}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
(cd "$BUILD_DIR" && ctest --output-on-failure -j "$(nproc)" --timeout 1800 "$@")
echo "sanitize: suite passed under ASan+UBSan in $(( $(date +%s) - built )) s"
