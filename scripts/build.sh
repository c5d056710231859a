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
#   TARGETS=                 build only these targets (space-separated, e.g. "krause-server
#                            krause-client", as scripts/serve.sh does); default: everything
# While it builds it shows the step count, the time elapsed and an estimate of the time left
# (scripts/lib/build-progress.awk; one line updated in place on a terminal, a line per step
# otherwise).
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
build_args=(--build "$BUILD_DIR" -j "$(nproc)")
if [ -n "${TARGETS:-}" ]; then
  read -r -a targets <<< "$TARGETS"
  build_args+=(--target "${targets[@]}")
fi
tty=0
if [ -t 1 ]; then tty=1; fi
source scripts/lib/line-awk.sh
NINJA_STATUS="[%f/%t %e] " cmake "${build_args[@]}" |
  "${LINE_AWK[@]}" -v tty="$tty" -v what="${TARGETS:-}" -f scripts/lib/build-progress.awk
