#!/usr/bin/env bash
# The Quick start's "serve" command. It
#   1. installs what serving needs (scripts/install-deps.sh --serve; idempotent),
#   2. builds only krause-server and krause-client (scripts/build.sh with TARGETS; a progress
#      line shows the step count, the time elapsed and an estimate of the time left), into
#      build/, configured exactly as scripts/test.sh configures it: the test command later
#      builds only the rest,
#   3. starts krause-server on the bundled models in models/ (gRPC on 0.0.0.0:50051, the Open
#      Inference Protocol's REST API on 0.0.0.0:8000, /metrics on 0.0.0.0:9464) and, once it
#      serves, prints the commands to try next (scripts/lib/serve-hints.awk, which reads the
#      server's log: the addresses are the ones it listens on).
# Extra arguments go to krause-server (see build/bin/krause-server --help). Ctrl-C drains and
# stops it. Environment: BUILD_DIR (build), SKIP_INSTALL (0), SKIP_BUILD (0; 1: start what is
# built), and the rest of scripts/build.sh's.
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR=${BUILD_DIR:-build}
if [ "${SKIP_INSTALL:-0}" != 1 ]; then scripts/install-deps.sh --serve; fi
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  SKIP_INSTALL=1 BUILD_DIR="$BUILD_DIR" TARGETS="krause-server krause-client" scripts/build.sh
fi

# The server's log goes through the hint filter, which passes every line on unchanged. The
# filter ignores SIGINT and SIGTERM (Ctrl-C reaches the whole process group): it ends when the
# server closes its log, so the server's last lines (the drain) are never lost.
source scripts/lib/line-awk.sh
exec "$BUILD_DIR/bin/krause-server" --models_dir models "$@" \
  2> >(trap '' INT TERM; exec "${LINE_AWK[@]}" -v client="$BUILD_DIR/bin/krause-client" \
    -f scripts/lib/serve-hints.awk >&2)
