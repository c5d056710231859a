#!/usr/bin/env bash
# The GPU check, for a machine with one NVIDIA GPU, PyTorch 2.x with CUDA, nvcc, cmake and ninja
# (no gRPC, no network): builds model/ and its GPU tests against PyTorch's LibTorch
# (KRAUSE_WITH_CUDA=ON, KRAUSE_BUILD_SERVER=OFF), runs the `gpu` tests and the CPU parity tests
# of the shared paths, and prints a summary. Meant to finish within about 8 minutes.
#   scripts/device-check.sh            (from the repository root)
# model/ also needs Abseil, GoogleTest, nlohmann-json, libpng and zlib; the script says which
# are missing instead of failing deep in CMake.
# Status: written without access to a GPU machine; not run yet.
set -uo pipefail
cd "$(dirname "$0")/.."
t0=$(date +%s)
BUILD=${BUILD_DIR:-build-gpu}
say() { echo "device-check: $*"; }

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || say "nvidia-smi failed"
TORCH_PREFIX=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)') || { say "no PyTorch"; exit 1; }
say "torch $(python3 -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())')"
missing=()
for h in absl/status/status.h gtest/gtest.h nlohmann/json.hpp png.h zlib.h; do
  echo "#include <$h>" | "${CXX:-c++}" -std=c++17 -fsyntax-only -x c++ - 2>/dev/null || missing+=("$h")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "missing headers: ${missing[*]} (install Abseil, GoogleTest, nlohmann-json, libpng, zlib)"
  exit 1
fi

cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$TORCH_PREFIX" \
  -DKRAUSE_WITH_CUDA=ON -DKRAUSE_BUILD_SERVER=OFF \
  -DCMAKE_CUDA_ARCHITECTURES=90 > "$BUILD.configure.log" 2>&1 || { tail -30 "$BUILD.configure.log"; exit 1; }
cmake --build "$BUILD" -j "$(nproc)" --target attention_cuda_test engine_cuda_test attention_parity_test \
  attention_validation_test incremental_decode_test decode_engine_test krause-attention-gpu-bench \
  krause-generate-bench > "$BUILD.build.log" 2>&1 || { grep -E "error" -A5 "$BUILD.build.log" | head -60; exit 1; }
t_build=$(date +%s)
ctest --test-dir "$BUILD" -L gpu --output-on-failure > "$BUILD.gpu.log" 2>&1
gpu_rc=$?
ctest --test-dir "$BUILD" -R "AttentionValidation|AttentionParity|IncrementalDecode|DecodeEngine" \
  -j "$(nproc)" > "$BUILD.cpu.log" 2>&1
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
say "  build: $((t_build - t0)) s"
say "  gpu tests: $(grep -E 'tests passed|tests failed' "$BUILD.gpu.log" | tail -1) (rc $gpu_rc)"
say "  cpu parity tests against this LibTorch: $(grep -E 'tests passed|tests failed' "$BUILD.cpu.log" | tail -1) (rc $cpu_rc)"
say "  gpu bench (rc $bench_rc; N 3072, W 256, k 192, H 8, d 64; ratio = dense causal / krause):"
sed 's/^/device-check:    /' "$BUILD.bench.log"
say "  generate bench (rc $gen_rc; cifar config, KARM vs ARM, engine on the GPU):"
grep -v '^\[' "$BUILD.generate.log" | sed 's/^/device-check:    /'
say "  total: $((t_end - t0)) s"
[ $gpu_rc -eq 0 ] && [ $cpu_rc -eq 0 ]
