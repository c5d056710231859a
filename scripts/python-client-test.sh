#!/usr/bin/env bash
# The Python client from a clean checkout: installed into a fresh virtual environment
# (scripts/python-client-venv.sh), then its pytest suite against real krause-server processes on
# the bundled models and against krause-client. ctest `python_client` runs it.
#   scripts/python-client-test.sh BIN_DIR [PYTEST_ARGS...]
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
bin=$(cd "${1:?usage: python-client-test.sh BIN_DIR [PYTEST_ARGS...]}" && pwd)
shift
work=$(mktemp -d /tmp/krause-python-client.XXXXXX)
trap 'rm -rf "$work"' EXIT
"$src/scripts/python-client-venv.sh" "$work/venv"
cd "$work"  # the installed package is imported, not the checkout's
KRAUSE_BIN_DIR="$bin" KRAUSE_SOURCE_DIR="$src" \
  "$work/venv/bin/python" -m pytest -q -p no:cacheprovider "$src/client/python/tests" "$@"
