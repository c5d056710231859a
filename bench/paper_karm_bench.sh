#!/usr/bin/env bash
# The paper's MNIST KARM (bench/paper_models.sh: width 256, depth 12, heads 8, W 128, top-k 96)
# at the issue's sizes, in one run: Score of 64 images and 64 sequences generating 64 images
# (the decode engine as the server's generator worker drives it), per precision and ring dtype,
# and, with a baseline bin folder, the same fp32 figures from that older build first.
#   bench/paper_karm_bench.sh DIR [BASELINE_BIN]
# DIR holds karm_mnist.safetensors (bench/paper_models.sh DIR writes it). Each line is
# krause-model-bench's JSON record after the command that printed it. About 6 minutes on 2 cores
# (a minute more with a baseline).
#   score    fp32: the LibTorch forward (what a worker runs); bf16: the packed step's bf16 GEMMs
#   generate fp32 or bf16 linear layers, float32 or bfloat16 rings (kv_cache_dtype)
set -euo pipefail
if [ $# -lt 1 ]; then
  echo "usage: bench/paper_karm_bench.sh DIR [BASELINE_BIN]" >&2
  exit 2
fi
ckpt=$1/karm_mnist.safetensors
bin=$(cd "$(dirname "$0")/.." && pwd)/build/bin
base=${2:-}
[ -f "$ckpt" ] || { echo "paper_karm_bench: $ckpt missing (bench/paper_models.sh $1)" >&2; exit 1; }
run() {  # BIN ARGS...: the command, then its records
  local b=$1
  shift
  echo "# $([ "$b" = "$bin" ] && echo build/bin || echo "$b")/krause-model-bench $*"
  "$b/krause-model-bench" "$@" 2>&1 | grep '^{'
}
i=0
total=$([ -n "$base" ] && echo 8 || echo 6)
step() { i=$((i + 1)); echo "paper_karm_bench: [$i/$total] $*" >&2; }
if [ -n "$base" ]; then
  step "baseline score"; run "$base" score "$ckpt" --batches 64 --seconds 1
  step "baseline generate"; run "$base" generate "$ckpt" --streams 64 --images 64
fi
step "score fp32"; run "$bin" score "$ckpt" --batches 64 --seconds 1
step "score bf16"; run "$bin" score "$ckpt" --batches 64 --seconds 1 --precision bf16 --weights bfloat16
step "generate fp32, fp32 rings"; run "$bin" generate "$ckpt" --streams 64 --images 64
step "generate fp32, bf16 rings"; run "$bin" generate "$ckpt" --streams 64 --images 64 --kv_cache bfloat16
step "generate bf16, fp32 rings"
run "$bin" generate "$ckpt" --streams 64 --images 64 --precision bf16 --weights bfloat16
step "generate bf16, bf16 rings"
run "$bin" generate "$ckpt" --streams 64 --images 64 --precision bf16 --weights bfloat16 --kv_cache bfloat16
