#!/usr/bin/env bash
# The GPU check, for a machine with one NVIDIA GPU, PyTorch 2.x with CUDA, nvcc, cmake and ninja
# (no gRPC, no network). In order, so that a run cut short has done the most important part:
#  1. preflight (scripts/device-preflight.sh, seconds): versions, the C++ ABI, nvcc vs PyTorch's
#     CUDA, the CUDA architectures (pinned to the GPU's when TORCH_CUDA_ARCH_LIST is unset);
#     stops here on a bad environment;
#  2. configure and build the two GPU test binaries and krause-check only; the verdict first: the
#     server's load-time kernel check of the bundled models on the GPU (krause-check --device
#     cuda); then the `gpu` tests (KRAUSE_REQUIRE_CUDA=1: they fail instead of skipping), each
#     reported;
#  3. compute-sanitizer (memcheck, racecheck, synccheck) on a few small GPU tests, if installed;
#  4. build the rest (benchmarks, CPU tests), the GPU benchmarks, and the CPU parity tests of the
#     shared paths against this LibTorch.
# Finishes within DEADLINE seconds (default 540): each phase gets what is left, capped.
#   scripts/device-check.sh            (from the repository root)
# model/ also needs Abseil, GoogleTest, nlohmann-json, libpng and zlib: where the machine lacks
# them, run scripts/fetch-device-deps.sh here first and carry .devdeps.
# Logs and JSON results go to $BUILD-logs, summary.txt (appended after every phase, so that a
# cut-off run keeps it) beside them. When $OUT is set (the device tool's folder that comes back,
# at most 8 files): summary.txt is written there as it goes, and on exit the JSON results and
# logs.tgz (every log) join it.
# On the device tool: scripts/fetch-device-deps.sh (here), then run: scripts/device-check.sh,
# carry [".devdeps"].
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
t0=$(date +%s)
DEADLINE=${DEADLINE:-540}
BUILD=${BUILD_DIR:-build-gpu}
LOGS=$BUILD-logs
rm -rf "$LOGS"
mkdir -p "$LOGS"
SUMMARY=${OUT:-$LOGS}/summary.txt
: > "$SUMMARY"
if [ -n "${OUT:-}" ]; then
  pack() { cp "$LOGS"/*.json "$OUT"/ 2> /dev/null; tar czf "$OUT/logs.tgz" -C "$(dirname "$LOGS")" "$(basename "$LOGS")"; }
  trap pack EXIT
fi
say() { echo "device-check [$(($(date +%s) - t0)) s]: $*"; }
# report LINE: to the console and to summary.txt at once.
report() { say "$*" | tee -a "$SUMMARY"; }
left() { echo $((DEADLINE - ($(date +%s) - t0))); }
# phase CAP NAME LOG COMMAND...: runs COMMAND under `timeout` with at most CAP seconds (and no
# more than what is left), its output into $LOGS/LOG.
phase() {
  local cap=$1 name=$2 log=$LOGS/$3
  shift 3
  local budget
  budget=$(left)
  # (a CPU rehearsal on a small machine builds far slower: only the deadline applies)
  [ "$budget" -gt "$cap" ] && [ "${CPU_REHEARSAL:-0}" != 1 ] && budget=$cap
  if [ "$budget" -lt 10 ]; then
    report "$name: skipped (no time left)"
    return 124
  fi
  say "$name: up to $budget s"
  timeout "$budget" "$@" > "$log" 2>&1
  local rc=$?
  [ $rc -eq 124 ] && report "$name: cut off after $budget s (log: $log)"
  return $rc
}
# tests_report NAME LOG RC: the counts (passed, skipped, not passed), then each test that was
# skipped or did not pass, by name. ctest's status is the field after the dots (a test's name may
# itself contain "Failed" or "Exception").
tests_report() {
  local name=$1 log=$LOGS/$2 rc=$3
  local lines passed skipped failed
  lines=$(grep -E '^ *[0-9]+/[0-9]+ Test +#[0-9]+: ' "$log" 2>/dev/null)
  passed=$(grep -c -E ' Passed +[0-9.]+ sec$' <<< "$lines")
  skipped=$(grep -c -E '\*\*\*Skipped +[0-9.]+ sec$' <<< "$lines")
  failed=$(grep -v -E ' Passed +[0-9.]+ sec$|\*\*\*Skipped +[0-9.]+ sec$' <<< "$lines" | grep -c .)
  report "$name: $passed passed, $skipped skipped, $failed not passed (rc $rc): $(grep -E 'tests passed|tests failed|No tests were found' "$log" | tail -1)"
  grep -v -E ' Passed +[0-9.]+ sec$' <<< "$lines" | grep . |
    sed -E 's/^ *[0-9]+\/[0-9]+ Test +#[0-9]+: /  /; s/ +\.{2,} */ /; s/  #.*\*\*\*/ ***/' | tee -a "$SUMMARY"
}

# CPU_REHEARSAL=1 (with TORCH_PREFIX set, e.g. to Debian's LibTorch): the same flow on a machine
# without a GPU, CUDA off (the gpu tests are then absent and the benchmarks fail): checks the
# script, the .devdeps fallback (FORCE_DEVDEPS=1) and the build before a device run.
CPU_REHEARSAL=${CPU_REHEARSAL:-0}
export CPU_REHEARSAL
WITH_CUDA=ON
if [ "$CPU_REHEARSAL" = 1 ]; then
  WITH_CUDA=OFF
  say "CPU rehearsal: CUDA off, LibTorch at ${TORCH_PREFIX:?set TORCH_PREFIX}"
else
  if ! command -v nvcc > /dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
    export PATH=/usr/local/cuda/bin:$PATH
  fi
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || say "nvidia-smi failed"
fi
# 1. Preflight: stops here (with every reason) on an environment that cannot build or run.
if ! pre=$(scripts/device-preflight.sh 2> "$LOGS/preflight.log"); then
  cat "$LOGS/preflight.log"
  report "preflight failed: nothing built (log: $LOGS/preflight.log)"
  exit 1
fi
cat "$LOGS/preflight.log"
eval "$pre"  # export TORCH_CUDA_ARCH_LIST=... (pinned to the GPU's when unset)
report "preflight passed${TORCH_CUDA_ARCH_LIST:+ (TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST)}"
if [ "$CPU_REHEARSAL" != 1 ]; then
  TORCH_PREFIX=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
  export CUDACXX=${CUDACXX:-$(command -v nvcc)}
  report "$(python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "on", torch.cuda.get_device_name(0))')"
fi

# model/ also needs Abseil, GoogleTest, nlohmann-json, libpng and zlib. Where the machine lacks
# them, Debian 12's packages unpacked by scripts/fetch-device-deps.sh (carried as .devdeps) do.
headers=(absl/status/status.h gtest/gtest.h gmock/gmock.h nlohmann/json.hpp png.h zlib.h)
missing_headers() {
  local h
  for h in "${headers[@]}"; do
    echo "#include <$h>" | "${CXX:-c++}" -std=c++17 -fsyntax-only "$@" -x c++ - 2>/dev/null || echo "$h"
  done
}
missing=$(missing_headers)
[ "${FORCE_DEVDEPS:-0}" = 1 ] && missing="(forced)"
DEPS_PREFIX=""
extra_flags=""
if [ -n "$missing" ] && [ -d .devdeps/usr/include ]; then
  DEPS_PREFIX=$PWD/.devdeps/usr
  # Abseil 20220623 misses an <cstdint> include that GCC 13 and later no longer bring in.
  extra_flags="-include cstdint"
  export LD_LIBRARY_PATH=$DEPS_PREFIX/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  say "using .devdeps for: $(echo $missing)"
  missing=$(missing_headers -isystem "$DEPS_PREFIX/include" $extra_flags)
fi
if [ -n "$missing" ]; then
  say "missing headers: $(echo $missing) (install Abseil, GoogleTest, nlohmann-json, libpng, zlib, or carry"
  say "  .devdeps made by scripts/fetch-device-deps.sh)"
  exit 1
fi

# 2. Configure; build the GPU tests first (if the build is cut later, they have run).
phase 120 configure configure.log cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$TORCH_PREFIX${DEPS_PREFIX:+;$DEPS_PREFIX}" \
  -DCMAKE_CXX_FLAGS="$extra_flags" -DKRAUSE_WITH_CUDA=$WITH_CUDA -DKRAUSE_BUILD_SERVER=OFF \
  -DKRAUSE_WITH_DNNL=OFF \
  -DCMAKE_CUDA_ARCHITECTURES=90 || { tail -40 "$LOGS/configure.log"; report "configure failed"; exit 1; }
grep -o -E -- '-gencode[ ;=][^ ;]*' "$LOGS/configure.log" "$BUILD/CMakeCache.txt" 2>/dev/null | sort -u | head -5 |
  sed 's/^/device-check:   gencode flag from PyTorch: /'

# The GPU tests fail (instead of skipping) if LibTorch cannot see the GPU.
export KRAUSE_REQUIRE_CUDA=1
gpu_targets=(krause-check attention_cuda_test attention_cuda_edge_test attention_cuda_decode_test
  engine_cuda_test)
gpu_build_rc=- gpu_rc=- san_rc=- kcheck_rc=-
if [ "$WITH_CUDA" = ON ]; then
  phase 300 "build gpu tests" build-gpu-tests.log cmake --build "$BUILD" -j "$(nproc)" -- -k 0 \
    "${gpu_targets[@]}"
  gpu_build_rc=$?
  [ $gpu_build_rc -eq 0 ] || grep -E "error|FAILED" -A5 "$LOGS/build-gpu-tests.log" | head -60
  report "build gpu tests: rc $gpu_build_rc, at $(($(date +%s) - t0)) s"
  # The verdict first: the server's load-time kernel check of the bundled models on the GPU
  # (tools/krause_check_main.cc): rc 0 every model on its CUDA kernels, 1 one falls back (to the
  # LibTorch path or the CPU), 2 one would not be served.
  phase 60 "kernel check" kernel-check.log "$BUILD/bin/krause-check" --device cuda \
    models/*.safetensors
  kcheck_rc=$?
  report "kernel check on the GPU (rc $kcheck_rc):"
  sed 's/^/    /' "$LOGS/kernel-check.log" | tee -a "$SUMMARY"
  # -j 8: each test is a process that loads LibTorch and makes a CUDA context (seconds); eight
  # at a time share the GPU easily. --no-tests=error: no test found is a failure, not a pass.
  phase 180 "gpu tests" gpu-tests.log ctest --test-dir "$BUILD" -L gpu -j 8 --timeout 140 \
    --output-on-failure --no-tests=error
  gpu_rc=$?
  tests_report "gpu tests" gpu-tests.log $gpu_rc

  # 3. compute-sanitizer on small cases: both kernels of the first parity cases, the odd-offset
  # keys, the decode step's small windows.
  SANITIZER=$(command -v compute-sanitizer || true)
  [ -z "$SANITIZER" ] && [ -n "${CUDACXX:-}" ] && [ -x "$(dirname "$CUDACXX")/compute-sanitizer" ] &&
    SANITIZER=$(dirname "$CUDACXX")/compute-sanitizer
  if [ -z "$SANITIZER" ]; then
    report "compute-sanitizer: not installed, skipped"
  elif [ -x "$BUILD/bin/attention_cuda_test" ]; then
    san_rc=0
    filter='Cases/CudaParity.MatchesReference/?:CudaKernels.*'
    for tool in memcheck racecheck synccheck; do
      phase 50 "compute-sanitizer $tool" "sanitizer-$tool.log" "$SANITIZER" --tool "$tool" \
        --error-exitcode 3 "$BUILD/bin/attention_cuda_test" --gtest_filter="$filter"
      rc=$?
      [ $rc -ne 0 ] && san_rc=$rc
      report "compute-sanitizer $tool: rc $rc, $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$LOGS/sanitizer-$tool.log" | tail -1)"
    done
  fi
fi

# 4. The rest: benchmarks and the CPU tests of the shared paths.
targets=(attention_parity_test attention_validation_test attention_decode_test
  incremental_decode_test decode_engine_test krause-generate-bench)
[ "$WITH_CUDA" = ON ] && targets=(krause-attention-gpu-bench "${targets[@]}")
phase 240 build build.log cmake --build "$BUILD" -j "$(nproc)" -- -k 0 "${targets[@]}"
build_rc=$?
[ $build_rc -eq 0 ] || grep -E "error|FAILED" -A5 "$LOGS/build.log" | head -60
report "build the rest: rc $build_rc, at $(($(date +%s) - t0)) s"

bench_rc=- gen_rc=-
if [ "$WITH_CUDA" = ON ]; then
  # Prefill: fused Krause vs dense causal attention (SDPA), N 3072, W 256, k 192.
  phase 60 "attention bench" attention-bench.log "$BUILD/bin/krause-attention-gpu-bench" \
    --json "$LOGS/attention-gpu.json"
  bench_rc=$?
  report "gpu attention bench (rc $bench_rc; N 3072, W 256, k 192, H 8, d 64; ratio = dense causal / krause, per kernel):"
  sed 's/^/    /' "$LOGS/attention-bench.log" | tee -a "$SUMMARY"
  # KARM vs ARM generation at the paper's CIFAR-10 size (32x32x3, d 512, 16 layers, W 256,
  # k 192), 1, 200 and 256 sequences, eager and (KARM) CUDA-graphed; the decode step's bytes/s.
  phase 120 "generate bench" generate-bench.log "$BUILD/bin/krause-generate-bench" --device cuda \
    --only cifar --streams 1,200,256 --json "$LOGS/generate-gpu.json"
  gen_rc=$?
  report "generate bench (rc $gen_rc; cifar config, KARM vs ARM, engine's step on the GPU):"
  tr '\r' '\n' < "$LOGS/generate-bench.log" | grep -v -E '^\[|^$' | sed 's/^/    /' | tee -a "$SUMMARY"
fi
# If the GPU tests failed: once more with the block kernels forced, to tell a fault of the warp
# kernels (the default where a row fits) from the rest.
gpu_block_rc=-
if [ "$gpu_rc" != - ] && [ "$gpu_rc" -ne 0 ]; then
  export KRAUSE_CUDA_KERNEL=block
  phase 90 "gpu tests, block kernels forced" gpu-tests-block.log ctest --test-dir "$BUILD" -L gpu \
    -j 8 --timeout 80 --output-on-failure --no-tests=error
  gpu_block_rc=$?
  tests_report "gpu tests with KRAUSE_CUDA_KERNEL=block" gpu-tests-block.log $gpu_block_rc
  unset KRAUSE_CUDA_KERNEL
fi
# -LE gpu: the name filter also matches GPU tests (CudaDecode...DecodeStep...).
phase 150 "cpu parity tests" cpu-tests.log ctest --test-dir "$BUILD" -LE gpu \
  -R "AttentionValidation|AttentionParity|DecodeStep|IncrementalDecode|DecodeEngine" -j "$(nproc)" \
  --timeout 80 --no-tests=error
cpu_rc=$?
tests_report "cpu parity tests against this LibTorch" cpu-tests.log $cpu_rc

echo
report "summary ($(date -u +%Y-%m-%d), $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)): gpu build rc $gpu_build_rc, kernel check rc $kcheck_rc, gpu tests rc $gpu_rc, sanitizers rc $san_rc, build rc $build_rc, benches rc $bench_rc/$gen_rc, cpu tests rc $cpu_rc"
say "logs and results in $LOGS (summary: $SUMMARY)"
if [ "$WITH_CUDA" = ON ]; then
  [ "$gpu_build_rc" = 0 ] && [ "$kcheck_rc" = 0 ] && [ "$gpu_rc" = 0 ] && [ "$san_rc" != 3 ] &&
    [ $build_rc -eq 0 ] &&
    [ $cpu_rc -eq 0 ]
else
  [ $build_rc -eq 0 ] && [ $cpu_rc -eq 0 ]
fi
