// The windowed LibTorch implementation: device-agnostic, differentiable (through the kept scores
// and log_sigma; the selection itself is piecewise constant), O(N * W) memory.
//   causal(W): queries in blocks of R; each block scores its R + W - 1 keys and gathers the band
//              of W candidates per query.
//   grid:      patch rows gather their (2r+1)^2 (+ CLS) candidate keys through a table; the CLS
//              row, which sees all N tokens, is one dense row.
//   global:    one dense block (|N(i)| = N is the definition).
// Every path ends in the same selection: candidates in ascending key order along the last axis,
// ranked by score with the larger key winning ties (krause_attention.h). Every score is a
// function of its (query, key) pair alone (OrderedDots, OrderedSum: no matrix product, whose
// rounding depends on where a pair falls in the BLAS kernel's blocking), so equal pairs tie
// exactly and the tie rule decides them; the aggregation by the weights is a matrix product.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <atomic>
#include <limits>
#include <vector>

#include "model/attention/krause_attention.h"
#include "model/attention/pair_sums.h"

namespace krause::internal {

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

std::atomic<GridRoute> g_grid_route{GridRoute::kAuto};

// scores: [..., C] with -inf for non-candidates, candidates in ascending key order along C.
// Returns the positions along C of the K best, in rank order (score desc, larger position first).
at::Tensor RankTopK(const at::Tensor& scores, int64_t kept) {
  at::NoGradGuard no_grad;
  const int64_t c = scores.size(-1);
  const at::Tensor order = std::get<1>(at::sort(scores.detach().flip(-1), /*stable=*/true,
                                                /*dim=*/-1, /*descending=*/true));
  return (c - 1) - order.narrow(-1, 0, kept);
}

// 1 / sigma_h^2 as [1, H, 1, 1].
at::Tensor InverseVariance(const AttentionArgs& a) {
  return at::exp(-2.0 * a.log_sigma).view({1, a.heads, 1, 1});
}

// -||k_j||^2 / 2: [B, H, N].
at::Tensor KeyBias(const at::Tensor& k) { return -0.5 * OrderedSum(k * k); }

struct Selected {
  at::Tensor position;  // [B, H, R, K] positions along the candidate axis
  at::Tensor weight;    // [B, H, R, K]
  at::Tensor valid;     // [B, H, R, K] bool: a real candidate (false where |N(i)| < K)
};

Selected SelectAndNormalise(const at::Tensor& cand_scores, int64_t kept) {
  Selected s;
  s.position = RankTopK(cand_scores, kept);
  const at::Tensor top = cand_scores.gather(-1, s.position);
  s.valid = (top > kNegInf).logical_or(top.isnan());  // a NaN score is a kept candidate
  s.weight = at::softmax(top, -1);
  return s;
}

// Collects per-block outputs and selections.
struct Pieces {
  std::vector<at::Tensor> out, index, weight;
  void Add(const at::Tensor& o, const Selected& s, const at::Tensor& key_index, bool selection) {
    out.push_back(o);
    if (selection) {
      index.push_back(at::where(s.valid, key_index, at::full({}, -1, key_index.options())));
      weight.push_back(s.weight);
    }
  }
  KrauseResult Finish(bool selection) {
    KrauseResult r;
    r.out = at::cat(out, 2);
    if (selection) {
      r.indices = at::cat(index, 2);
      r.weights = at::cat(weight, 2);
    }
    return r;
  }
};

KrauseResult CausalWindowed(const AttentionArgs& a, const KrauseOptions& o) {
  const int64_t n = a.n, w = std::min(o.neighbourhood.window, n), kept = a.kept;
  const at::Tensor inv_var = InverseVariance(a);
  // Front padding of W - 1 keys so that every query's window is a full band; padded keys are
  // masked below.
  const at::Tensor kp = at::constant_pad_nd(a.k, {0, 0, w - 1, 0});
  const at::Tensor vp = at::constant_pad_nd(a.v, {0, 0, w - 1, 0});
  const at::Tensor bp = at::constant_pad_nd(KeyBias(a.k), {w - 1, 0});
  const int64_t block = std::min<int64_t>(n, std::max<int64_t>(64, w));
  const auto long_opts = at::TensorOptions().dtype(at::kLong).device(a.q.device());

  Pieces pieces;
  for (int64_t s = 0; s < n; s += block) {
    const int64_t r = std::min(block, n - s);
    const int64_t c = r + w - 1;  // keys of this block in padded coordinates [s, s + c)
    const at::Tensor scores =
        (OrderedDots(a.q.narrow(2, s, r), kp.narrow(2, s, c).transpose(-1, -2)) +
         bp.narrow(2, s, c).unsqueeze(-2)) *
        inv_var;  // [B, H, r, c]
    // band column of (row i, window slot t) = i + t; its key index = s + i - (w - 1) + t.
    const at::Tensor rows = at::arange(r, long_opts).unsqueeze(1);
    const at::Tensor slots = at::arange(w, long_opts).unsqueeze(0);
    const at::Tensor band_col = rows + slots;               // [r, w]
    const at::Tensor key_index = band_col + (s - (w - 1));  // [r, w]
    const at::Tensor band = scores.gather(-1, band_col.expand({a.batch, a.heads, r, w}))
                                .masked_fill(key_index < 0, kNegInf);
    Selected sel = SelectAndNormalise(band, kept);
    const at::Tensor cols = sel.position + rows;  // back to block columns
    const at::Tensor attn = at::zeros_like(scores).scatter(-1, cols, sel.weight);
    pieces.Add(at::matmul(attn, vp.narrow(2, s, c)), sel, sel.position + (s - (w - 1)) + rows,
               o.return_selection);
  }
  return pieces.Finish(o.return_selection);
}

// Dense rows [row0, row0 + r) against all N keys (global neighbourhood, or the CLS row).
KrauseResult DenseRows(const AttentionArgs& a, int64_t row0, int64_t r, int64_t kept,
                       bool selection) {
  const at::Tensor scores =
      (OrderedDots(a.q.narrow(2, row0, r), a.k.transpose(-1, -2)) + KeyBias(a.k).unsqueeze(-2)) *
      InverseVariance(a);  // [B, H, r, N]
  Selected sel = SelectAndNormalise(scores, kept);
  const at::Tensor attn = at::zeros_like(scores).scatter(-1, sel.position, sel.weight);
  Pieces pieces;
  pieces.Add(at::matmul(attn, a.v), sel, sel.position, selection);
  return pieces.Finish(selection);
}

KrauseResult GridWindowed(const AttentionArgs& a, const KrauseOptions& o) {
  const Neighbourhood& nb = o.neighbourhood;
  const int64_t first = nb.cls ? 1 : 0;  // first patch row
  const int64_t r = a.n - first;
  // Candidate table of the patch rows (the CLS row would widen it to N).
  std::vector<int64_t> table;
  std::vector<int64_t> cand;
  int64_t width = 0;
  for (int64_t i = first; i < a.n; ++i) width = std::max(width, NumCandidates(nb, a.n, i));
  table.assign(static_cast<size_t>(r * width), 0);
  std::vector<uint8_t> pad(static_cast<size_t>(r * width), 1);
  for (int64_t i = first; i < a.n; ++i) {
    AppendCandidates(nb, a.n, i, &cand);
    for (size_t t = 0; t < cand.size(); ++t) {
      table[(i - first) * width + t] = cand[t];
      pad[(i - first) * width + t] = 0;
    }
  }
  const auto dev = a.q.device();
  const at::Tensor index = at::tensor(table, at::kLong).view({r, width}).to(dev);
  const at::Tensor is_pad = at::tensor(pad, at::kByte).view({r, width}).to(dev, at::kBool);
  const int64_t kept = std::min(o.top_k, width);
  const at::Tensor q = a.q.narrow(2, first, r);
  const at::Tensor full_index = index.expand({a.batch, a.heads, r, width});
  GridRoute route = g_grid_route.load();
  if (route == GridRoute::kAuto)
    route = a.n <= width * a.head_dim ? GridRoute::kDenseRows : GridRoute::kCandidateTable;

  at::Tensor patch_out;
  Selected sel;
  if (route == GridRoute::kDenseRows) {
    const at::Tensor dense =
        (OrderedDots(q, a.k.transpose(-1, -2)) + KeyBias(a.k).unsqueeze(-2)) * InverseVariance(a);
    const at::Tensor scores = dense.gather(-1, full_index).masked_fill(is_pad, kNegInf);
    sel = SelectAndNormalise(scores, kept);
    // scatter_add: a row with fewer candidates than K also "keeps" padding entries (weight 0,
    // table index 0), which must not overwrite a real weight of key 0.
    const at::Tensor attn =
        at::zeros_like(dense).scatter_add(-1, full_index.gather(-1, sel.position), sel.weight);
    patch_out = at::matmul(attn, a.v);  // [B, H, r, d]
  } else {
    // Gathered candidates: [B, H, r, width, d].
    const at::Tensor flat = index.reshape({-1});
    const at::Tensor kg = a.k.index_select(2, flat).view({a.batch, a.heads, r, width, a.head_dim});
    const at::Tensor vg = a.v.index_select(2, flat).view({a.batch, a.heads, r, width, a.head_dim});
    const at::Tensor bg = KeyBias(a.k).index_select(2, flat).view({a.batch, a.heads, r, width});
    const at::Tensor scores =
        ((OrderedDots(q.unsqueeze(-2), kg.transpose(-1, -2)).squeeze(-2) + bg) * InverseVariance(a))
            .masked_fill(is_pad, kNegInf);
    sel = SelectAndNormalise(scores, kept);
    const at::Tensor attn = at::zeros_like(scores).scatter(-1, sel.position, sel.weight);
    patch_out = at::matmul(attn.unsqueeze(-2), vg).squeeze(-2);  // [B, H, r, d]
  }
  const at::Tensor patch_index = full_index.gather(-1, sel.position);

  Pieces pieces;
  if (nb.cls) {
    KrauseResult cls_row = DenseRows(a, 0, 1, a.kept, o.return_selection);
    pieces.out.push_back(cls_row.out);
    if (o.return_selection) {
      pieces.index.push_back(cls_row.indices);
      pieces.weight.push_back(cls_row.weights);
    }
  }
  if (o.return_selection && kept < a.kept) {
    // Patch rows keep fewer than the CLS row: pad their selections to K columns.
    Selected padded = sel;
    const int64_t extra = a.kept - kept;
    padded.valid = at::constant_pad_nd(sel.valid, {0, extra}, 0);
    padded.weight = at::constant_pad_nd(sel.weight, {0, extra}, 0);
    pieces.Add(patch_out, padded, at::constant_pad_nd(patch_index, {0, extra}, -1), true);
  } else {
    pieces.Add(patch_out, sel, patch_index, o.return_selection);
  }
  return pieces.Finish(o.return_selection);
}

}  // namespace

void SetGridRouteForTesting(GridRoute route) { g_grid_route.store(route); }

KrauseResult WindowedAttention(const AttentionArgs& a, const KrauseOptions& o) {
  switch (o.neighbourhood.kind) {
    case Neighbourhood::Kind::kCausal:
      return CausalWindowed(a, o);
    case Neighbourhood::Kind::kGrid:
      return GridWindowed(a, o);
    case Neighbourhood::Kind::kGlobal:
      return DenseRows(a, 0, a.n, a.kept, o.return_selection);
  }
  return {};
}

}  // namespace krause::internal
