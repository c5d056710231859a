#!/usr/bin/env bash
# The npm packages the tests use, from the lock files beside them: the official OpenAI SDK for
# tests/openai_sdk_test.py. Best effort: without Node.js 20 and npm, or without the registry, it
# says so and the tests that need the packages skip. Idempotent (npm ci only when missing).
set -uo pipefail
cd "$(dirname "$0")/.."
dir=tests/openai_sdk
if [ -d "$dir/node_modules/openai" ]; then exit 0; fi
if ! command -v npm > /dev/null || ! command -v node > /dev/null; then
  echo "install-node-deps: no node/npm; tests/openai_sdk_test.py will skip"
  exit 0
fi
if ! timeout 300 npm ci --prefix "$dir" --no-audit --no-fund > /dev/null 2>&1; then
  echo "install-node-deps: npm ci in $dir failed; tests/openai_sdk_test.py will skip"
fi
exit 0
