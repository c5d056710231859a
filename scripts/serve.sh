#!/usr/bin/env bash
# The Quick start's "serve" command: installs what is needed (scripts/install-deps.sh via
# scripts/build.sh), builds, and starts krause-server on the bundled models in models/
# (gRPC on 0.0.0.0:50051 unless you pass --listen). Extra arguments go to krause-server
# (see build/bin/krause-server --help). Ctrl-C drains and stops it.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/build.sh
BUILD_DIR=${BUILD_DIR:-build}
exec "$BUILD_DIR/bin/krause-server" --models_dir models "$@"
