#!/usr/bin/env bash
# The whole test suite: installs what it needs, builds (everything in build/; after
# scripts/serve.sh only what serve did not build: the same folder and configuration), runs every
# ctest test (labels unit, slow, build, parity, e2e; gpu tests skip themselves without a GPU),
# then the fuzzers for 30 s each (scripts/fuzz.sh; FUZZ_SECONDS=0 skips them), then the
# container check (scripts/container-check.sh: builds the CPU image and runs it; needs root;
# CONTAINER_CHECK=0 skips it), then the threaded tests under ThreadSanitizer (scripts/sanitize.sh
# --thread, in build-tsan/; TSAN=0 skips them). Extra arguments go to ctest, e.g.
#   scripts/test.sh -L parity
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/build.sh
scripts/install-node-deps.sh
BUILD_DIR=${BUILD_DIR:-build}
(cd "$BUILD_DIR" && ctest --output-on-failure -j "$(nproc)" --timeout 900 "$@")
FUZZ_SECONDS=${FUZZ_SECONDS:-30}
if [ "$FUZZ_SECONDS" != 0 ]; then
  scripts/fuzz.sh "$FUZZ_SECONDS"
fi
if [ "${CONTAINER_CHECK:-1}" != 0 ]; then
  BUILD_DIR="$BUILD_DIR" CLIENT="$BUILD_DIR/bin/krause-client" scripts/container-check.sh
fi
if [ "${TSAN:-1}" != 0 ]; then
  SKIP_INSTALL=1 scripts/sanitize.sh --thread
fi
