#!/usr/bin/env bash
# The libFuzzer targets of fuzz/ (PNG decoding, request images, safetensors, the manifest, the
# Open Inference Protocol's JSON tensors, the HTTP generation's body, OpenAI's image request): builds
# them with clang-14, ASan and UBSan in build-fuzz/ and runs each for SECONDS (default 60) from the
# seed corpus in fuzz/corpus/ (new inputs go to a temporary folder; the committed corpus is not
# changed). A crash, a sanitizer report, a leak, an input over 10 s or over 2 GB of memory fails
# the run; the input that did it is left in build-fuzz/artifacts/.
#   scripts/fuzz.sh [SECONDS]       (scripts/test.sh runs it with 30)
set -euo pipefail
cd "$(dirname "$0")/.."
EACH=${1:-60}
BUILD=${FUZZ_BUILD_DIR:-build-fuzz}
scripts/install-deps.sh --fuzz
start=$(date +%s)
mkdir -p "$BUILD"
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKRAUSE_FUZZ=ON -DKRAUSE_BUILD_TESTS=OFF \
  -DKRAUSE_BUILD_BENCH=OFF -DKRAUSE_USE_PCH=OFF -DKRAUSE_WITH_CUDA=OFF > "$BUILD/configure.log" 2>&1 ||
  { cat "$BUILD/configure.log" >&2; exit 1; }
targets=(png image safetensors manifest oip_json generate_body images_request)
ninja -C "$BUILD" $(printf 'fuzz_%s ' "${targets[@]}")
echo "fuzz: built in $(( $(date +%s) - start )) s; ${EACH} s per target"
mkdir -p "$BUILD/artifacts"
# LibTorch's lazily created singletons are never freed: leaks are reported per input only when an
# input's own allocations do not balance (libFuzzer's default), which is what we want to catch.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
i=0
for t in "${targets[@]}"; do
  i=$((i + 1))
  work=$(mktemp -d)
  echo "fuzz [$i/${#targets[@]}] fuzz_$t for ${EACH} s (eta $(( (${#targets[@]} - i + 1) * EACH )) s)"
  if ! "$BUILD/bin/fuzz_$t" "$work" "fuzz/corpus/$t" -max_total_time="$EACH" -timeout=10 \
      -rss_limit_mb=2048 -malloc_limit_mb=512 -max_len=65536 -print_final_stats=1 \
      -artifact_prefix="$BUILD/artifacts/$t-" > "$BUILD/fuzz_$t.log" 2>&1; then
    tail -60 "$BUILD/fuzz_$t.log" >&2
    echo "fuzz: fuzz_$t FAILED (input in $BUILD/artifacts/)" >&2
    rm -rf "$work"
    exit 1
  fi
  grep -E "^stat::number_of_executed_units|^stat::peak_rss_mb" "$BUILD/fuzz_$t.log" | tr '\n' ' '
  echo "corpus $(ls "$work" | wc -l) new inputs"
  rm -rf "$work"
done
echo "fuzz: all ${#targets[@]} targets clean ($(( $(date +%s) - start )) s)"
