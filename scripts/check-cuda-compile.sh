#!/usr/bin/env bash
# Compile-checks the CUDA code on machines without a GPU or a CUDA LibTorch, so it cannot rot:
#  1. every CUDA source (model/**/*.cu) compiles standalone with nvcc for sm_90 and sm_75 (the
#     kernels include no LibTorch header);
#  2. the LibTorch glue and every file with KRAUSE_WITH_CUDA branches pass a syntax check with
#     KRAUSE_WITH_CUDA defined, against this machine's LibTorch headers (Debian's ship the CUDA
#     headers but not one generated config header, which is stubbed for the check).
# Exit 77 (ctest: skipped) when nvcc is not installed.
set -euo pipefail
cd "$(dirname "$0")/.."
NVCC=${NVCC:-$(command -v nvcc || true)}
if [ -z "$NVCC" ] && [ -x /usr/local/cuda/bin/nvcc ]; then NVCC=/usr/local/cuda/bin/nvcc; fi
if [ -z "$NVCC" ]; then
  echo "check-cuda-compile: nvcc not found: skipped"
  exit 77
fi
CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(readlink -f "$NVCC")")")}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
n=0
while IFS= read -r f; do
  # sm_90 (the GPU machines) and sm_75, the oldest CUDA 13 has: the kernels' fallbacks for GPUs
  # before sm_80 (an architecture list taken from TORCH_CUDA_ARCH_LIST may include them).
  "$NVCC" -std=c++17 -gencode arch=compute_90,code=sm_90 -gencode arch=compute_75,code=sm_75 -I. \
    -Werror all-warnings -c "$f" -o "$out/$(basename "$f").o"
  n=$((n + 1))
done < <(find model -name '*.cu' | sort)
echo "check-cuda-compile: $n CUDA file(s) compiled for sm_90 and sm_75 with $("$NVCC" --version | tail -1)"

TORCH_INCLUDE=${TORCH_INCLUDE:-/usr/include}
if [ ! -f "$TORCH_INCLUDE/ATen/cuda/CUDAContext.h" ]; then
  echo "check-cuda-compile: no LibTorch CUDA headers under $TORCH_INCLUDE: glue not checked"
  exit 0
fi
mkdir -p "$out/stub/c10/cuda/impl"
[ -f "$TORCH_INCLUDE/c10/cuda/impl/cuda_cmake_macros.h" ] ||
  echo '#pragma once' > "$out/stub/c10/cuda/impl/cuda_cmake_macros.h"
torch_flags=(-isystem "$TORCH_INCLUDE/torch/csrc/api/include")
# /usr/include is a default system folder already (adding it again breaks #include_next).
[ "$TORCH_INCLUDE" = /usr/include ] || torch_flags+=(-isystem "$TORCH_INCLUDE")
m=0
for f in model/attention/cuda/dispatch_cuda.cc model/attention/krause_attention.cc model/attention/decode.cc \
  model/engine/device_context.cc model/engine/decode_graphs.cc tests/attention_cuda_test.cc \
  tests/attention_cuda_edge_test.cc tests/attention_cuda_decode_test.cc tests/engine_cuda_test.cc \
  bench/attention_gpu_bench.cc; do
  "${CXX:-c++}" -std=c++17 -fsyntax-only -Wall -Werror -DKRAUSE_WITH_CUDA -I. -Itests -I"$out/stub" \
    "${torch_flags[@]}" -idirafter "$CUDA_HOME/include" "$f"
  m=$((m + 1))
done
echo "check-cuda-compile: $m C++ file(s) with KRAUSE_WITH_CUDA pass a syntax check"
