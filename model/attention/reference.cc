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
      // ||q_i - k_j||^2 for every pair, then score = -dist2 / (2 sigma^2).
      const at::Tensor dist2 =
          (q * q).sum(-1, true) + (k * k).sum(-1).unsqueeze(0) - 2.0 * at::matmul(q, k.t());
      const at::Tensor two_var = 2.0 * at::exp(2.0 * a.log_sigma[h]);
      const at::Tensor score = at::where(allowed, -dist2 / two_var, neg_inf);  // [N, N]

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
