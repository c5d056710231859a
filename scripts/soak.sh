#!/usr/bin/env bash
# The soak (tests/soak.py): a real krause-server on the bundled models, small queues, a hostile
# mix from several client processes; fails on a crash, a hang, an undocumented status, work left
# behind when idle, memory growth after the warm-up, or results that differ from idle results.
#   scripts/soak.sh            short mode (45 s, what ctest's `soak` test runs)
#   scripts/soak.sh --long     6 minutes, 4 client processes
#   scripts/soak.sh --tenants  the mix as one tenant beside a polite one (ctest's `soak_tenants`
#                              runs it for 20 s)
# Extra arguments go to tests/soak.py (e.g. --json report.json). Builds first (scripts/build.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
args=(--seconds 45)
if [ "${1:-}" = --long ]; then
  shift
  args=(--seconds 360 --processes 4)
fi
scripts/build.sh > /dev/null
exec /usr/bin/python3 tests/soak.py "${BUILD_DIR:-build}/bin" . "${args[@]}" "$@"
