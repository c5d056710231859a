#!/usr/bin/env bash
# Writes the paper-size models, random weights in the official layout, into DIR: a flat
# --models_dir that krause-server, krause-model-bench, krause-check and the PyTorch peer
# (bench/peer/torch_peer.py) read like any checkpoint. Speed does not depend on the weights'
# values; accuracy does, so these are for benchmarks only.
#   vit_s16.safetensors          Krause ViT-S/16, 224x224x3 (width 384, depth 12, heads 6,
#                                MLP 1536, 1000 classes, radius 2, top-k 8)
#   vit_s16_softmax.safetensors  its softmax baseline
#   karm_mnist.safetensors       the paper's MNIST KARM (width 256, depth 12, heads 8, W 128,
#                                top-k 96)
#   arm_mnist.safetensors        its softmax baseline
# Usage: bench/paper_models.sh DIR [BIN (default build/bin)]
set -euo pipefail
if [ $# -lt 1 ]; then
  echo "usage: bench/paper_models.sh DIR [BIN]" >&2
  exit 2
fi
dir=$1
bin=${2:-$(cd "$(dirname "$0")/.." && pwd)/build/bin}
mkdir -p "$dir"
for name in vit-s16 vit-s16-softmax karm-mnist arm-mnist; do
  out="$dir/${name//-/_}.safetensors"
  echo "paper_models: $out" >&2
  "$bin/krause-model-bench" init "$name" "$out"
done
