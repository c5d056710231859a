#!/usr/bin/env bash
# Compile-checks every CUDA source (model/**/*.cu) standalone with nvcc for sm_90, so CUDA code
# cannot rot on machines without a GPU or a CUDA LibTorch (the kernels include no LibTorch
# header). Exit 77 (ctest: skipped) when nvcc is not installed.
set -euo pipefail
cd "$(dirname "$0")/.."
NVCC=${NVCC:-$(command -v nvcc || true)}
if [ -z "$NVCC" ] && [ -x /usr/local/cuda/bin/nvcc ]; then NVCC=/usr/local/cuda/bin/nvcc; fi
if [ -z "$NVCC" ]; then
  echo "check-cuda-compile: nvcc not found: skipped"
  exit 77
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
n=0
while IFS= read -r f; do
  "$NVCC" -std=c++17 -arch=sm_90 -I. -Werror all-warnings -c "$f" -o "$out/$(basename "$f").o"
  n=$((n + 1))
done < <(find model -name '*.cu' | sort)
echo "check-cuda-compile: $n file(s) compiled for sm_90 with $("$NVCC" --version | tail -1)"
