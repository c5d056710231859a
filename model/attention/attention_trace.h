// What a model's forward records of its attention when asked (ViT::Features, PixelModel::
// ForwardTokens): per recorded layer, the keys each query kept and their weights, from the same
// operator call that computes the layer's output. engine/inspect.h turns it into the Inspect
// RPC's reply and its summary figures.
//
// Krause layers record the operator's selection (KrauseOptions::return_selection): the kept key
// indices in rank order and their softmax weights, [B, H, N, K] (-1 / 0 padded where a query has
// fewer candidates), and each head's sigma. Softmax layers record the full attention
// probabilities [B, H, N, N] (causal models: 0 above the diagonal).
// Thread-safety: a trace belongs to one forward call.
#pragma once

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "model/attention/krause_attention.h"

namespace krause {

struct AttentionTrace {
  // The layers to record, ascending; empty records none.
  std::vector<int64_t> layers;
  // Also keep each recorded layer's q, k and v [B, H, N, d] (tests: they re-run the reference
  // operator on exactly the inputs the serving operator saw).
  bool keep_inputs = false;

  struct Layer {
    int64_t layer = 0;
    at::Tensor indices, weights;  // Krause: [B, H, N, K] int64 / float
    at::Tensor sigma;             // Krause: [H] float, exp(log_sigma) per head
    int64_t top_k = 0;            // Krause: the layer's k
    at::Tensor probs;             // softmax: [B, H, N, N] float
    at::Tensor q, k, v;           // keep_inputs only
  };
  std::vector<Layer> recorded;  // in forward order

  bool Wants(int64_t layer) const {
    return std::binary_search(layers.begin(), layers.end(), layer);
  }

  // What both models' attention layers call. Begin: the record of `layer` (its inputs kept when
  // keep_inputs), or null when the trace does not ask for it; `trace` may be null.
  static Layer* Begin(AttentionTrace* trace, int64_t layer, const at::Tensor& q,
                      const at::Tensor& k, const at::Tensor& v);
  // A Krause layer's selection (a KrauseResult made with return_selection), its heads' sigma
  // (log_sigma: one value or one per head) and k.
  static void RecordSelection(Layer* record, const KrauseResult& result,
                              const at::Tensor& log_sigma, int64_t heads, int64_t top_k);
};

}  // namespace krause
