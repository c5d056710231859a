#!/usr/bin/env bash
# What the Quick start's "serve" command runs. The gRPC server does not exist yet (see README,
# Status): until it does, this installs what is needed, builds, and runs the attention benchmark
# (a quick subset; pass --help to see the options, or run build/bin/krause-attention-bench
# without --quick for the full table).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/build.sh
BUILD_DIR=${BUILD_DIR:-build}
if [ $# -eq 0 ]; then set -- --quick; fi
exec "$BUILD_DIR/bin/krause-attention-bench" "$@"
