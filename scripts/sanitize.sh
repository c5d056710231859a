#!/usr/bin/env bash
# Sanitizer runs (not part of .ci/run: they would double or triple CI's time; run them before a
# release or after touching memory-owning or threaded code). Timings on the 2-core development
# machine are in docs/building-and-testing.md ("Tests").
#
#   scripts/sanitize.sh [CTEST_ARGS...]   the whole ctest suite under AddressSanitizer +
#                                         UndefinedBehaviorSanitizer, in build-asan/
#                                         (KRAUSE_SANITIZE=ON), e.g. scripts/sanitize.sh -L e2e
#   scripts/sanitize.sh --thread [GTEST_FILTER]
#                                         the threaded tests (engine, thread pools, scheduling,
#                                         reply pool, generator worker, the in-process server
#                                         suites) under
#                                         ThreadSanitizer, in build-tsan/ (KRAUSE_TSAN=ON);
#                                         suppressions in scripts/tsan.supp
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)

if [ "${1:-}" = "--thread" ]; then
  shift
  BUILD_DIR=${BUILD_DIR:-build-tsan}
  tests=(threads_test decode_engine_test decode_engine_conditional_test decode_engine_resume_test
         cpu_decoder_test cpu_decoder_prefill_test cpu_kernels_test scheduling_test reply_pool_test
         generator_worker_test server_e2e_test server_generate_test server_inspect_test
         server_classes_test server_access_test server_shutdown_test server_start_test
         server_hardening_test server_metrics_test model_control_test
         model_control_repository_test http_server_test http_server_tls_test http_generate_test
         connect_http_test)
  BUILD_DIR="$BUILD_DIR" BUILD_TYPE=${BUILD_TYPE:-RelWithDebInfo} TARGETS="${tests[*]}" \
    CMAKE_ARGS="-DKRAUSE_TSAN=ON -DKRAUSE_BUILD_BENCH=OFF ${CMAKE_ARGS:-}" scripts/build.sh
  built=$(date +%s)
  echo "sanitize: built in $((built - start)) s"
  # halt_on_error: the first report fails the binary that printed it. The shared libraries
  # (LibTorch, gRPC, Abseil, protobuf: Debian's) are not instrumented:
  # ignore_noninstrumented_modules drops the reports of their memcpy-like interceptors, and
  # scripts/tsan.supp the few races in gRPC's inline header code whose order is kept inside
  # libgrpc++. Races between accesses of this project's own code are reported.
  export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:ignore_noninstrumented_modules=1:suppressions=$PWD/scripts/tsan.supp}
  for t in "${tests[@]}"; do
    t0=$(date +%s)
    echo "sanitize: $t"
    "$BUILD_DIR/bin/$t" --gtest_brief=1 ${1:+--gtest_filter="$1"}
    echo "sanitize: $t passed under TSan in $(( $(date +%s) - t0 )) s"
  done
  echo "sanitize: threaded tests passed under TSan in $(( $(date +%s) - built )) s"
  exit 0
fi

BUILD_DIR=${BUILD_DIR:-build-asan}
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
