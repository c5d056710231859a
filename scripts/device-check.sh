#!/usr/bin/env bash
# The GPU check, for a machine with one NVIDIA GPU, PyTorch 2.x with CUDA, nvcc, cmake and ninja
# (no gRPC, no network): builds model/ and its GPU tests against PyTorch's LibTorch
# (KRAUSE_WITH_CUDA=ON, KRAUSE_BUILD_SERVER=OFF), runs the `gpu` tests and the CPU parity tests
# of the shared paths, and prints a summary. Meant to finish within about 8 minutes.
#   scripts/device-check.sh            (from the repository root)
# model/ also needs Abseil, GoogleTest, nlohmann-json, libpng and zlib: where the machine lacks
# them, run scripts/fetch-device-deps.sh here first and carry .devdeps.
# Status: written without access to a GPU machine; not run yet. On the device tool:
#   scripts/fetch-device-deps.sh   (here), then run: scripts/device-check.sh, carry [".devdeps"]
set -uo pipefail
cd "$(dirname "$0")/.."
t0=$(date +%s)
BUILD=${BUILD_DIR:-build-gpu}
say() { echo "device-check: $*"; }

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || say "nvidia-smi failed"
TORCH_PREFIX=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)') || { say "no PyTorch"; exit 1; }
say "torch $(python3 -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())')"
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

cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$TORCH_PREFIX${DEPS_PREFIX:+;$DEPS_PREFIX}" \
  -DCMAKE_CXX_FLAGS="$extra_flags" \
  -DKRAUSE_WITH_CUDA=ON -DKRAUSE_BUILD_SERVER=OFF \
  -DCMAKE_CUDA_ARCHITECTURES=90 > "$BUILD.configure.log" 2>&1 || { tail -30 "$BUILD.configure.log"; exit 1; }
# -k 0: one target that fails to build does not stop the others' tests and benchmarks.
cmake --build "$BUILD" -j "$(nproc)" -- -k 0 attention_cuda_test engine_cuda_test attention_parity_test \
  attention_validation_test incremental_decode_test decode_engine_test krause-attention-gpu-bench \
  krause-generate-bench > "$BUILD.build.log" 2>&1
build_rc=$?
[ $build_rc -eq 0 ] || grep -E "error|FAILED" -A5 "$BUILD.build.log" | head -60
t_build=$(date +%s)
ctest --test-dir "$BUILD" -L gpu --timeout 240 --output-on-failure > "$BUILD.gpu.log" 2>&1
gpu_rc=$?
ctest --test-dir "$BUILD" -R "AttentionValidation|AttentionParity|IncrementalDecode|DecodeEngine" \
  -j "$(nproc)" --timeout 240 > "$BUILD.cpu.log" 2>&1
cpu_rc=$?
mkdir -p bench/results
timeout 120 "$BUILD/bin/krause-attention-gpu-bench" --json bench/results/attention-gpu.json > "$BUILD.bench.log" 2>&1
bench_rc=$?
# KARM vs ARM generation on the GPU at the paper's CIFAR-10 size (32x32x3, d 512, 16 layers,
# W 256, k 192), 1, 200 and 256 sequences; the decode step's bytes read per second.
timeout 180 "$BUILD/bin/krause-generate-bench" --device cuda --only cifar --streams 1,200,256 \
  --json bench/results/generate-gpu.json > "$BUILD.generate.log" 2>&1
gen_rc=$?
t_end=$(date +%s)
echo
say "summary ($(date -u +%Y-%m-%d), $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1))"
say "  build: $((t_build - t0)) s (rc $build_rc)"
say "  gpu tests: $(grep -E 'tests passed|tests failed' "$BUILD.gpu.log" | tail -1) (rc $gpu_rc)"
grep -E "^\s+[0-9]+ - .*\(Failed|Timeout|Not Run|SEGFAULT|Exception\)" "$BUILD.gpu.log" | sed 's/^/device-check:    /'
say "  cpu parity tests against this LibTorch: $(grep -E 'tests passed|tests failed' "$BUILD.cpu.log" | tail -1) (rc $cpu_rc)"
say "  gpu bench (rc $bench_rc; N 3072, W 256, k 192, H 8, d 64; ratio = dense causal / krause):"
sed 's/^/device-check:    /' "$BUILD.bench.log"
say "  generate bench (rc $gen_rc; cifar config, KARM vs ARM, engine on the GPU):"
grep -v '^\[' "$BUILD.generate.log" | sed 's/^/device-check:    /'
say "  total: $((t_end - t0)) s"
# On the device tool's machine, the logs and results come back through $OUT.
if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then
  cp "$BUILD.build.log" "$BUILD.gpu.log" "$BUILD.cpu.log" "$BUILD.bench.log" "$BUILD.generate.log" "$OUT/" 2>/dev/null
  cp bench/results/attention-gpu.json bench/results/generate-gpu.json "$OUT/" 2>/dev/null
fi
[ $build_rc -eq 0 ] && [ $gpu_rc -eq 0 ] && [ $cpu_rc -eq 0 ]
