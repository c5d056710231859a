#include "model/attention/flops.h"

#include <algorithm>

namespace krause {

namespace {

// One query with c candidates of which k are kept, one head.
double QueryFlops(int64_t c, int64_t k, int64_t d) {
  return static_cast<double>(c) * (2 * d + 1) + 5.0 * k + 2.0 * d * k;
}

}  // namespace

double DenseAttentionQueryFlops(int64_t visible, int64_t heads, int64_t head_dim) {
  return heads * QueryFlops(visible, visible, head_dim);
}

AttentionCost KrauseAttentionCost(const Neighbourhood& nb, int64_t n, int64_t top_k, int64_t heads,
                                  int64_t head_dim) {
  AttentionCost cost;
  double per_head = 0, dense = 0, selection = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t c = NumCandidates(nb, n, i);
    const int64_t k = std::min(top_k, c);
    per_head += QueryFlops(c, k, head_dim);
    const int64_t visible = nb.kind == Neighbourhood::Kind::kCausal ? i + 1 : n;
    dense += QueryFlops(visible, visible, head_dim);
    if (c > k) selection += static_cast<double>(c);
    cost.candidates += c;
    cost.kept += k;
  }
  per_head += static_cast<double>(n) * (2 * head_dim + 1);  // key biases
  cost.executed_flops = heads * per_head;
  cost.dense_equivalent_flops = heads * dense;
  cost.selection_comparisons = heads * selection;
  return cost;
}

AttentionCost KrauseDecodeStepCost(int64_t position, int64_t window, int64_t top_k, int64_t heads,
                                   int64_t head_dim) {
  AttentionCost cost;
  const int64_t c = std::min(position + 1, window);
  const int64_t k = std::min(top_k, c);
  cost.candidates = c;
  cost.kept = k;
  cost.executed_flops = heads * (QueryFlops(c, k, head_dim) + (2 * head_dim + 1));
  cost.dense_equivalent_flops = DenseAttentionQueryFlops(position + 1, heads, head_dim);
  cost.selection_comparisons = c > k ? static_cast<double>(heads) * c : 0.0;
  return cost;
}

}  // namespace krause
