#!/usr/bin/env bash
# Installs the dependencies (idempotent) and builds krause-serve into build/ (binaries in
# build/bin/). Environment:
#   BUILD_DIR=build          build folder
#   BUILD_TYPE=Release       CMake build type
#   KRAUSE_SANITIZE=0        1: AddressSanitizer + UndefinedBehaviorSanitizer build
#   TORCH_PREFIX=            a LibTorch CMake prefix (e.g. from a PyTorch 2.x install); default:
#                            Debian's LibTorch
#   SKIP_INSTALL=0           1: do not run scripts/install-deps.sh
#   CMAKE_ARGS=              extra CMake arguments (e.g. -DKRAUSE_BUILD_TESTS=OFF)
#   CONFIGURE_ONLY=0         1: configure, do not build (the caller builds chosen targets)
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR=${BUILD_DIR:-build}
BUILD_TYPE=${BUILD_TYPE:-Release}
KRAUSE_SANITIZE=${KRAUSE_SANITIZE:-0}

if [ "${SKIP_INSTALL:-0}" != "1" ]; then
  scripts/install-deps.sh
fi

args=(-S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE="$BUILD_TYPE")
if [ "$KRAUSE_SANITIZE" = "1" ]; then args+=(-DKRAUSE_SANITIZE=ON); fi
if [ -n "${TORCH_PREFIX:-}" ]; then args+=(-DCMAKE_PREFIX_PATH="$TORCH_PREFIX"); fi
if [ -n "${CMAKE_ARGS:-}" ]; then read -r -a extra <<< "$CMAKE_ARGS"; args+=("${extra[@]}"); fi

cmake "${args[@]}"
if [ "${CONFIGURE_ONLY:-0}" = "1" ]; then exit 0; fi
# 2 cores and ~1.5 GiB per LibTorch translation unit: one job per core.
cmake --build "$BUILD_DIR" -j "$(nproc)"
