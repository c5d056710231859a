// Analytic FLOP counts of one Krause attention call (docs/operator.md, section 3), executed and
// dense-equivalent side by side, with the selection work as its own figure.
//
// Conventions (one multiply-add = 2 FLOPs), per head, with c_i = |N(i)| candidates and
// k_i = min(top_k, c_i) kept for query i:
//   scores       c_i * (2d + 1)   a d-long dot product plus the bias add / scale
//   softmax      5 * k_i          max, subtract, exp, sum, divide
//   aggregation  2d * k_i         weighted sum of the kept values
// The key biases (-||k||^2 / 2, 2d + 1 per key and head) are counted once per key, in executed
// only: dense softmax attention has no such term. The dense-equivalent is the same formula with
// c_i = k_i = every token the query could see without Krause's locality: all N for global and
// grid neighbourhoods (a ViT), the causal prefix i + 1 for causal(W) (an ARM).
// Selection: sum over rows with c_i > k_i of c_i comparisons, the linear term of the partial
// selection (quickselect's expected cost is a small multiple of it); rows that keep every
// candidate need none. Not included in the FLOP figures.
// Projections and MLPs are counted by the models, not here.
#pragma once

#include <cstdint>

#include "model/attention/neighbourhood.h"

namespace krause {

struct AttentionCost {
  double executed_flops = 0;
  double dense_equivalent_flops = 0;
  double selection_comparisons = 0;
  int64_t candidates = 0;  // sum_i c_i (per head)
  int64_t kept = 0;        // sum_i k_i (per head)

  double saving() const {
    return dense_equivalent_flops > 0 ? 1.0 - executed_flops / dense_equivalent_flops : 0.0;
  }
};

// For one sequence of n tokens (multiply by the batch size for a batch).
// Precondition: ValidateNeighbourhood(nb, n).ok(), top_k >= 1.
AttentionCost KrauseAttentionCost(const Neighbourhood& nb, int64_t n, int64_t top_k, int64_t heads,
                                  int64_t head_dim);

// One decode step of one sequence at absolute position `position` with a causal window.
AttentionCost KrauseDecodeStepCost(int64_t position, int64_t window, int64_t top_k, int64_t heads,
                                   int64_t head_dim);

// Dense softmax attention (scaled dot product) over `visible` keys for one query, all heads:
// the per-query term of the dense-equivalent.
double DenseAttentionQueryFlops(int64_t visible, int64_t heads, int64_t head_dim);

}  // namespace krause
