#!/usr/bin/env bash
# The GPU check, for a machine with one NVIDIA GPU, PyTorch 2.x with CUDA, nvcc, cmake and ninja
# (no gRPC, no network): builds model/ and its GPU tests against PyTorch's LibTorch
# (KRAUSE_WITH_CUDA=ON, KRAUSE_BUILD_SERVER=OFF), runs the `gpu` tests, the GPU benchmarks and
# the CPU parity tests of the shared paths, and prints a summary. Finishes within DEADLINE
# seconds (default 540): each phase gets what is left, the most important first.
#   scripts/device-check.sh            (from the repository root)
# model/ also needs Abseil, GoogleTest, nlohmann-json, libpng and zlib: where the machine lacks
# them, run scripts/fetch-device-deps.sh here first and carry .devdeps.
# Logs and JSON results go to $OUT when it is set (the device tool's folder that comes back),
# else to $BUILD-logs; they are written there as each phase runs, so a cut-off run keeps them.
# Status: written without access to a GPU machine; not run yet. On the device tool:
#   scripts/fetch-device-deps.sh   (here), then run: scripts/device-check.sh, carry [".devdeps"]
set -uo pipefail
cd "$(dirname "$0")/.."
t0=$(date +%s)
DEADLINE=${DEADLINE:-540}
BUILD=${BUILD_DIR:-build-gpu}
LOGS=${OUT:-$BUILD-logs}
mkdir -p "$LOGS"
say() { echo "device-check [$(($(date +%s) - t0)) s]: $*"; }
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
    say "$name: skipped (no time left)"
    return 124
  fi
  say "$name: up to $budget s"
  timeout "$budget" "$@" > "$log" 2>&1
}

# CPU_REHEARSAL=1 (with TORCH_PREFIX set, e.g. to Debian's LibTorch): the same flow on a machine
# without a GPU, CUDA off (the gpu tests are then absent and the benchmarks fail): checks the
# script, the .devdeps fallback (FORCE_DEVDEPS=1) and the build before a device run.
CPU_REHEARSAL=${CPU_REHEARSAL:-0}
WITH_CUDA=ON
if [ "$CPU_REHEARSAL" = 1 ]; then
  WITH_CUDA=OFF
  say "CPU rehearsal: CUDA off, LibTorch at ${TORCH_PREFIX:?set TORCH_PREFIX}"
else
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || say "nvidia-smi failed"
  TORCH_PREFIX=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)') || { say "no PyTorch"; exit 1; }
  say "torch $(python3 -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "cxx11 abi", torch._C._GLIBCXX_USE_CXX11_ABI)')"
  if ! python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
    say "PyTorch sees no CUDA device: nothing to check"
    exit 1
  fi
  if ! command -v nvcc > /dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
    export PATH=/usr/local/cuda/bin:$PATH
  fi
  export CUDACXX=${CUDACXX:-$(command -v nvcc)}
  say "nvcc: $("$CUDACXX" --version | tail -1)"
fi
say "c++: $("${CXX:-c++}" --version | head -1), cmake: $(cmake --version | head -1)"

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

phase 120 configure configure.log cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$TORCH_PREFIX${DEPS_PREFIX:+;$DEPS_PREFIX}" \
  -DCMAKE_CXX_FLAGS="$extra_flags" -DKRAUSE_WITH_CUDA=$WITH_CUDA -DKRAUSE_BUILD_SERVER=OFF \
  -DCMAKE_CUDA_ARCHITECTURES=90 || { tail -40 "$LOGS/configure.log"; exit 1; }
# -k 0: one target that fails to build does not stop the others' tests and benchmarks.
targets=(attention_parity_test attention_validation_test attention_decode_test
  incremental_decode_test decode_engine_test krause-generate-bench)
[ "$WITH_CUDA" = ON ] && targets=(attention_cuda_test engine_cuda_test krause-attention-gpu-bench
  "${targets[@]}")
phase 330 build build.log cmake --build "$BUILD" -j "$(nproc)" -- -k 0 "${targets[@]}"
build_rc=$?
[ $build_rc -eq 0 ] || grep -E "error|FAILED" -A5 "$LOGS/build.log" | head -60
t_build=$(date +%s)

# The GPU tests fail (instead of skipping) if LibTorch cannot see the GPU.
export KRAUSE_REQUIRE_CUDA=1
# -j 8: each test is a process that loads LibTorch and makes a CUDA context (seconds); eight
# at a time share the GPU easily.
phase 150 "gpu tests" gpu-tests.log ctest --test-dir "$BUILD" -L gpu -j 8 --timeout 140 \
  --output-on-failure
gpu_rc=$?
# Prefill: fused Krause vs dense causal attention (SDPA), N 3072, W 256, k 192.
phase 60 "attention bench" attention-bench.log "$BUILD/bin/krause-attention-gpu-bench" \
  --json "$LOGS/attention-gpu.json"
bench_rc=$?
# KARM vs ARM generation at the paper's CIFAR-10 size (32x32x3, d 512, 16 layers, W 256, k 192),
# 1, 200 and 256 sequences, eager and (KARM) CUDA-graphed; the decode step's bytes read per second.
phase 200 "generate bench" generate-bench.log "$BUILD/bin/krause-generate-bench" --device cuda \
  --only cifar --streams 1,200,256 --json "$LOGS/generate-gpu.json"
gen_rc=$?
# If the GPU tests failed: once more with the block kernels forced, to tell a fault of the warp
# kernels (the default where a row fits) from the rest.
gpu_block_rc=-
if [ $gpu_rc -ne 0 ]; then
  export KRAUSE_CUDA_KERNEL=block
  phase 120 "gpu tests, block kernels forced" gpu-tests-block.log ctest --test-dir "$BUILD" -L gpu -j 8 \
    --timeout 110 --output-on-failure
  gpu_block_rc=$?
  unset KRAUSE_CUDA_KERNEL
fi
phase 90 "cpu parity tests" cpu-tests.log ctest --test-dir "$BUILD" \
  -R "AttentionValidation|AttentionParity|DecodeStep|IncrementalDecode|DecodeEngine" -j "$(nproc)" \
  --timeout 80
cpu_rc=$?

echo
say "summary ($(date -u +%Y-%m-%d), $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1))"
say "  build: $((t_build - t0)) s (rc $build_rc)"
say "  gpu tests: $(grep -E 'tests passed|tests failed' "$LOGS/gpu-tests.log" | tail -1) (rc $gpu_rc)"
grep -E '\((Failed|Timeout|Not Run|SEGFAULT|Exception|Skipped)\)' "$LOGS/gpu-tests.log" |
  sed 's/^/device-check:    /'
if [ "$gpu_block_rc" != - ]; then
  say "  gpu tests with KRAUSE_CUDA_KERNEL=block: $(grep -E 'tests passed|tests failed' "$LOGS/gpu-tests-block.log" | tail -1) (rc $gpu_block_rc)"
fi
say "  cpu parity tests against this LibTorch: $(grep -E 'tests passed|tests failed' "$LOGS/cpu-tests.log" | tail -1) (rc $cpu_rc)"
grep -E '\((Failed|Timeout|Not Run|SEGFAULT|Exception)\)' "$LOGS/cpu-tests.log" |
  sed 's/^/device-check:    /'
say "  gpu attention bench (rc $bench_rc; N 3072, W 256, k 192, H 8, d 64; ratio = dense causal / krause, per kernel):"
sed 's/^/device-check:    /' "$LOGS/attention-bench.log"
say "  generate bench (rc $gen_rc; cifar config, KARM vs ARM, engine's step on the GPU):"
tr '\r' '\n' < "$LOGS/generate-bench.log" | grep -v -E '^\[|^$' | sed 's/^/device-check:    /'
say "  logs and results in $LOGS"
[ $build_rc -eq 0 ] && [ $gpu_rc -eq 0 ] && [ $cpu_rc -eq 0 ]
