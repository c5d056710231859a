#!/usr/bin/env bash
# Where a classifier's packed forward (the one the server runs) spends its time: perf samples of
# krause-model-bench classify at one batch size, the top symbols by share (the model's loading
# and packing are in the samples too: about half a second of the run).
#   bench/profile_classify.sh CHECKPOINT BATCH [PRECISION (fp32|bf16)] [BIN (build/bin)]
# An older build's bin folder (one without --precision) profiles its own fp32 forward.
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: bench/profile_classify.sh CHECKPOINT BATCH [fp32|bf16] [BIN]" >&2
  exit 2
fi
ckpt=$1 batch=$2 precision=${3:-fp32}
bin=${4:-$(cd "$(dirname "$0")/.." && pwd)/build/bin}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
args=(classify "$ckpt" --batches "$batch" --seconds 8)
if [ "$precision" != fp32 ]; then args+=(--precision "$precision"); fi
perf record -q -o "$tmp/perf.data" -- "$bin/krause-model-bench" "${args[@]}" > "$tmp/run.json" 2>/dev/null
echo "# $(basename "$ckpt") batch $batch $precision: $(cat "$tmp/run.json")"
# [JIT] frames are oneDNN's generated kernels (no symbols): their share as a whole first.
echo "by library:"
perf report -i "$tmp/perf.data" --no-children --sort dso --percent-limit 2 2>/dev/null |
  grep -v '^#' | grep '%' | sed -E 's/ +$//; s/\[JIT\] tid [0-9]+/[JIT: oneDNN kernels]/'
echo "by symbol:"
perf report -i "$tmp/perf.data" --no-children --sort dso,symbol --percent-limit 1 2>/dev/null |
  grep -v '^#' | grep '%' | sed -E 's/ +$//; s/\[JIT\] tid [0-9]+/[JIT: oneDNN kernels]/' | head -20
