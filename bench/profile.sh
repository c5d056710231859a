#!/usr/bin/env bash
# Where one krause-model-bench measurement spends its time: perf samples of the run, the top
# libraries and symbols by share (the model's loading and packing are in the samples too: about
# half a second of the run).
#   bench/profile.sh classify|score|generate CHECKPOINT SIZE [PRECISION (fp32|bf16)] [BIN]
#                    [MORE krause-model-bench FLAGS...]
# SIZE: the batch (classify, score) or the streams (generate, SIZE images). An older build's bin
# folder (one without --precision) profiles its own fp32 path. For example
#   bench/profile.sh classify vit_s16.safetensors 8 bf16
#   bench/profile.sh generate karm_mnist.safetensors 64 bf16 build/bin --kv_cache bfloat16
set -euo pipefail
if [ $# -lt 3 ]; then
  echo "usage: bench/profile.sh classify|score|generate CHECKPOINT SIZE [fp32|bf16] [BIN] [FLAGS...]" >&2
  exit 2
fi
what=$1 ckpt=$2 size=$3 precision=${4:-fp32}
bin=${5:-$(cd "$(dirname "$0")/.." && pwd)/build/bin}
shift $(($# < 5 ? $# : 5))
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
case "$what" in
  classify | score) args=("$what" "$ckpt" --batches "$size" --seconds 8) ;;
  generate) args=(generate "$ckpt" --streams "$size" --images "$size") ;;
  *) echo "bench/profile.sh: classify, score or generate, not $what" >&2; exit 2 ;;
esac
if [ "$precision" != fp32 ]; then args+=(--precision "$precision"); fi
args+=("$@")
perf record -q -o "$tmp/perf.data" -- "$bin/krause-model-bench" "${args[@]}" > "$tmp/run.json" 2>/dev/null
echo "# $(basename "$ckpt") $what $size $precision $*: $(cat "$tmp/run.json")"
# [JIT] frames are oneDNN's generated kernels (no symbols): their share as a whole first.
echo "by library:"
perf report -i "$tmp/perf.data" --no-children --sort dso --percent-limit 2 2>/dev/null |
  grep -v '^#' | grep '%' | sed -E 's/ +$//; s/\[JIT\] tid [0-9]+/[JIT: oneDNN kernels]/'
echo "by symbol:"
perf report -i "$tmp/perf.data" --no-children --sort dso,symbol --percent-limit 1 2>/dev/null |
  grep -v '^#' | grep '%' | sed -E 's/ +$//; s/\[JIT\] tid [0-9]+/[JIT: oneDNN kernels]/' | head -20
