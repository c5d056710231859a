// The reference implementation: the contract of krause_attention.h written out densely.
// Never optimise this file; every fast path is tested against it.
#include <ATen/ATen.h>

#include <vector>

#include "model/attention/krause_attention.h"

namespace krause::internal {

namespace {

// allowed[i][j] = j in N(i), straight from the shared candidate enumeration.
at::Tensor NeighbourMask(const Neighbourhood& nb, int64_t n) {
  at::Tensor mask = at::zeros({n, n}, at::kBool);
  auto acc = mask.accessor<bool, 2>();
  std::vector<int64_t> cand;
  for (int64_t i = 0; i < n; ++i) {
    AppendCandidates(nb, n, i, &cand);
    for (int64_t j : cand) acc[i][j] = true;
  }
  return mask;
}

// score(i, j) = -||q_i - k_j||^2 / (2 sigma^2) for every pair: [N, N] in q's dtype, differentiable.
// Each score is a function of (q_i, k_j, sigma) alone, so equal pairs get bit-equal scores and the
// tie rule, not rounding, decides between them on any CPU, GPU or BLAS. No matrix product: a GEMM
// sums a dot product in an order that depends on where the pair falls in its blocking. Instead the
// squared differences are summed over t = 0 .. d-1 in that order, in float64, one elementwise op
// at a time (an elementwise op rounds every element the same way, vectorised or not), and the
// score is rounded to q's dtype once at the end.
at::Tensor PairScores(const at::Tensor& q, const at::Tensor& k, const at::Tensor& log_sigma) {
  const at::Tensor qd = q.to(at::kDouble), kd = k.to(at::kDouble);  // [N, d]
  at::Tensor dist2;
  for (int64_t t = 0; t < q.size(1); ++t) {
    const at::Tensor diff = qd.select(1, t).unsqueeze(1) - kd.select(1, t).unsqueeze(0);  // [N, N]
    const at::Tensor square = diff * diff;
    dist2 = t == 0 ? square : dist2 + square;
  }
  const at::Tensor two_var = 2.0 * at::exp(2.0 * log_sigma.to(at::kDouble));
  return (-dist2 / two_var).to(q.scalar_type());
}

}  // namespace

KrauseResult ReferenceAttention(const AttentionArgs& a, const KrauseOptions& o) {
  const int64_t n = a.n, kept = a.kept;
  const at::Tensor allowed = NeighbourMask(o.neighbourhood, n).to(a.q.device());
  const at::Tensor neg_inf = at::full({}, -std::numeric_limits<double>::infinity(), a.q.options());

  std::vector<at::Tensor> outs, idxs, wts;
  for (int64_t b = 0; b < a.batch; ++b) {
    std::vector<at::Tensor> out_h, idx_h, wt_h;
    for (int64_t h = 0; h < a.heads; ++h) {
      const at::Tensor q = a.q[b][h], k = a.k[b][h], v = a.v[b][h];  // [N, d]
      const at::Tensor score =
          at::where(allowed, PairScores(q, k, a.log_sigma[h]), neg_inf);  // [N, N]

      // Rank by score descending; on ties the larger key index first: a stable descending sort
      // of the reversed row keeps equal scores in reversed (larger index first) order.
      const at::Tensor order = std::get<1>(at::sort(score.detach().flip(-1), /*stable=*/true,
                                                    /*dim=*/-1, /*descending=*/true));
      const at::Tensor top = (n - 1) - order.narrow(-1, 0, kept);  // [N, K]
      const at::Tensor top_score = score.gather(-1, top);
      // False where |N(i)| < K; a NaN score (ranked first by the sort) is a kept candidate.
      const at::Tensor is_kept = (top_score > neg_inf).logical_or(top_score.isnan());
      const at::Tensor weight = at::softmax(top_score, -1);
      const at::Tensor dense = at::zeros({n, n}, a.q.options()).scatter(-1, top, weight);
      out_h.push_back(at::matmul(dense, v));
      idx_h.push_back(at::where(is_kept, top, at::full({}, -1, top.options())));
      wt_h.push_back(weight);
    }
    outs.push_back(at::stack(out_h));
    idxs.push_back(at::stack(idx_h));
    wts.push_back(at::stack(wt_h));
  }
  KrauseResult r;
  r.out = at::stack(outs);
  if (o.return_selection) {
    r.indices = at::stack(idxs);
    r.weights = at::stack(wts);
  }
  return r;
}

}  // namespace krause::internal
