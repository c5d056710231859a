// GPU parity (ctest label gpu) at the edges: signed zero scores and NaN scores in both CUDA
// kernels (ties to the larger key index, every row keeping min(k, |N(i)|) candidates), and the
// dispatch of shapes the kernels do not take (the windowed path under kAuto, refused under
// kCuda). Built only with KRAUSE_WITH_CUDA; every test skips without a device.
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <vector>

#include "attention_cuda_test.h"
#include "model/attention/krause_attention.h"
#include "model/attention/neighbourhood.h"
#include "test_util.h"

namespace krause::testing {
namespace {

// The neighbourhoods of the edge-value tests, with the kernel variants that take them.
struct EdgeCase {
  const char* name;
  Neighbourhood nb;
  int64_t n, top_k;
};

std::vector<EdgeCase> EdgeCases() {
  return {{"causal_w16_k5", Neighbourhood::Causal(16), 64, 5},
          {"causal_w16_k1", Neighbourhood::Causal(16), 64, 1},
          {"grid_cls_k4", Neighbourhood::Grid(8, 8, 1, GridMetric::kChebyshev, true), 65, 4},
          {"global_wide_k40", Neighbourhood::Global(), 300, 40}};
}

std::vector<internal::CudaKernel> KernelsFor(const Neighbourhood& nb, int64_t n) {
  std::vector<internal::CudaKernel> kernels = {internal::CudaKernel::kAuto,
                                               internal::CudaKernel::kBlock};
  if (MaxCandidates(nb, n) <= 256) kernels.push_back(internal::CudaKernel::kWarp);
  return kernels;
}

// Every row keeps exactly min(top_k, |N(i)|) candidates: its first that many indices are >= 0,
// the rest -1.
void ExpectKeptCounts(const at::Tensor& indices, const Neighbourhood& nb, int64_t n,
                      int64_t top_k) {
  const at::Tensor idx = indices.cpu();
  const auto acc = idx.accessor<int64_t, 4>();
  int64_t wrong = 0;
  for (int64_t b = 0; b < idx.size(0); ++b) {
    for (int64_t h = 0; h < idx.size(1); ++h) {
      for (int64_t i = 0; i < n; ++i) {
        const int64_t want = std::min(top_k, NumCandidates(nb, n, i));
        for (int64_t r = 0; r < idx.size(3); ++r) {
          if ((acc[b][h][i][r] >= 0) != (r < want)) ++wrong;
        }
      }
    }
  }
  EXPECT_EQ(wrong, 0) << "selection entries that break 'keep exactly min(k, |N(i)|)'";
}

// Signed zeros are one score. Queries of at most 2^-18, keys of at most 2^-21 and 1/sigma^2 =
// 2^-120: each bias-form sum q.k - ||k||^2 / 2 is an exact, tiny number of either sign (keys
// short next to the queries: the sign is mostly q.k's; checked below), and its product with
// 1/sigma^2 underflows to +0 or -0, so every score of a row is a zero, about a third of them +0,
// the rest -0 (in the reference's distance form every score underflows to -0). Every score ties:
// each row keeps its K largest candidate indices, descending, with uniform weights. Catches a
// selection that orders the raw bits (-0 below +0: +0 keys kept ahead of larger-index -0 keys)
// in either kernel, or on the CPU (kFusedCpu).
TEST(CudaEdgeValues, SignedZeroScoresAreOneScoreAndTiesGoToTheLargerKeyIndex) {
  KRAUSE_SKIP_WITHOUT_CUDA();
  const at::Device dev(at::kCUDA);
  const int64_t b = 2, h = 2, d = 32;
  for (const EdgeCase& c : EdgeCases()) {
    SCOPED_TRACE(c.name);
    at::Generator gen = at::detail::createCPUGenerator(31 + c.n + c.top_k);
    const at::Tensor q = QuantizedTensor({b, h, c.n, d}, -17, gen);  // multiples of 2^-19
    const at::Tensor k = QuantizedTensor({b, h, c.n, d}, -20, gen);  // multiples of 2^-22
    const at::Tensor v = GaussianTensor({b, h, c.n, d}, 1.0, gen);
    const at::Tensor ls = at::full({h}, static_cast<float>(60 * std::log(2.0)));  // sigma 2^60
    {
      const at::Tensor qd = q.to(at::kDouble), kd = k.to(at::kDouble);
      const at::Tensor dot = at::matmul(qd, kd.transpose(-1, -2));
      const at::Tensor norm2 = (kd * kd).sum(-1).unsqueeze(-2);
      const at::Tensor raw = dot - 0.5 * norm2;
      // Bias form: |q.k + b| * 2^-120 below 2^-150 (rounds to a zero); distance form:
      // ||q - k||^2 / 2^121 below 2^-150 as well.
      ASSERT_LT(raw.abs().max().item<double>(), std::ldexp(1.0, -31));
      const at::Tensor dist2 = (qd * qd).sum(-1, true) + norm2 - 2.0 * dot;
      ASSERT_LT(dist2.max().item<double>(), std::ldexp(1.0, -30));
      ASSERT_GT((raw > 0).sum().item<int64_t>(), raw.numel() / 5);
      ASSERT_GT((raw < 0).sum().item<int64_t>(), raw.numel() / 5);
    }
    KrauseOptions o;
    o.neighbourhood = c.nb;
    o.top_k = c.top_k;
    o.return_selection = true;
    o.impl = KrauseImpl::kReference;
    KRAUSE_ASSERT_OK_AND_ASSIGN(KrauseResult ref, KrauseAttention(q, k, v, ls, o));
    o.impl = KrauseImpl::kFusedCpu;
    KRAUSE_ASSERT_OK_AND_ASSIGN(KrauseResult fused, KrauseAttention(q, k, v, ls, o));
    // The rule written out: the K largest candidate indices, descending, -1 padded.
    const int64_t kept = ref.indices.size(3);
    at::Tensor expected = at::full({c.n, kept}, -1, at::kLong);
    {
      auto e = expected.accessor<int64_t, 2>();
      std::vector<int64_t> cand;
      for (int64_t i = 0; i < c.n; ++i) {
        AppendCandidates(c.nb, c.n, i, &cand);
        for (int64_t r = 0; r < kept && r < static_cast<int64_t>(cand.size()); ++r) {
          e[i][r] = cand[cand.size() - 1 - r];
        }
      }
    }
    expected = expected.expand({b, h, c.n, kept});
    EXPECT_TRUE(at::equal(ref.indices, expected)) << "reference";
    EXPECT_TRUE(at::equal(fused.indices, expected)) << "fused_cpu";
    o.impl = KrauseImpl::kCuda;
    for (const internal::CudaKernel kernel : KernelsFor(c.nb, c.n)) {
      SCOPED_TRACE(KernelName(kernel));
      const ForceKernel force(kernel);
      KRAUSE_ASSERT_OK_AND_ASSIGN(KrauseResult got,
                                  KrauseAttention(q.to(dev), k.to(dev), v.to(dev), ls.to(dev), o));
      EXPECT_TRUE(at::equal(got.indices.cpu(), expected));
      EXPECT_TRUE(at::equal(got.indices.cpu(), fused.indices));
      EXPECT_LE(RelativeMaxError(got.out.cpu(), ref.out), 1e-5);
      EXPECT_LE(RelativeMaxError(got.weights.cpu(), ref.weights), 1e-5);
    }
  }
}

// NaN scores rank above every number, all NaNs are one score (ties to the larger key index),
// and a row with NaN scores still keeps exactly min(k, |N(i)|) candidates. One NaN element in a
// few key rows makes every score of those keys NaN (the bias and the dot product): two NaN keys
// 3 apart in (batch 0, head 0), so that rows see both, and one each in (0, 1) and (1, 1). The
// GPU's kept indices must equal the reference's and kFusedCpu's, lead with the row's NaN keys
// in descending index order, and count min(k, |N(i)|); rows that see no NaN key keep their
// outputs (those that do are NaN, so only their indices are compared). Catches a selection that
// drops NaN scores (comparisons with NaN are false: a radix count that never matches, a kept
// count short of K, -1 entries), ranks them last, or breaks their tie by the smaller index.
TEST(CudaEdgeValues, NanScoresRankAboveEveryNumberAndRowsStillKeepMinKCandidates) {
  KRAUSE_SKIP_WITHOUT_CUDA();
  const at::Device dev(at::kCUDA);
  const int64_t b = 2, h = 2, d = 32;
  const std::vector<std::array<int64_t, 3>> nan_keys = {
      {0, 0, 20}, {0, 0, 23}, {0, 1, 40}, {1, 1, 7}};
  for (const EdgeCase& c : EdgeCases()) {
    SCOPED_TRACE(c.name);
    at::Generator gen = at::detail::createCPUGenerator(77 + c.n + c.top_k);
    const at::Tensor q = QuantizedTensor({b, h, c.n, d}, 0, gen);
    const at::Tensor k = QuantizedTensor({b, h, c.n, d}, 0, gen);
    const at::Tensor v = QuantizedTensor({b, h, c.n, d}, 0, gen);
    for (const auto& [bb, hh, j] : nan_keys) k[bb][hh][j][3].fill_(std::nanf(""));
    const at::Tensor ls = PerHeadLogSigma(h);
    // sees[b][h][i]: row i has a NaN key among its candidates; nan_lead[b][h][i]: those keys,
    // descending (the rule's first kept indices).
    at::Tensor sees = at::zeros({b, h, c.n}, at::kBool);
    std::vector<std::vector<int64_t>> nan_lead(b * h * c.n);
    {
      auto s = sees.accessor<bool, 3>();
      std::vector<int64_t> cand;
      for (int64_t i = 0; i < c.n; ++i) {
        AppendCandidates(c.nb, c.n, i, &cand);
        // nan_keys lists each (b, h)'s keys ascending: backwards, descending.
        for (auto it = nan_keys.rbegin(); it != nan_keys.rend(); ++it) {
          const auto& [bb, hh, j] = *it;
          if (std::binary_search(cand.begin(), cand.end(), j)) {
            s[bb][hh][i] = true;
            nan_lead[(bb * h + hh) * c.n + i].push_back(j);
          }
        }
      }
    }
    ASSERT_TRUE(sees.any().item<bool>());
    KrauseOptions o;
    o.neighbourhood = c.nb;
    o.top_k = c.top_k;
    o.return_selection = true;
    o.impl = KrauseImpl::kReference;
    KRAUSE_ASSERT_OK_AND_ASSIGN(KrauseResult ref, KrauseAttention(q, k, v, ls, o));
    o.impl = KrauseImpl::kFusedCpu;
    KRAUSE_ASSERT_OK_AND_ASSIGN(KrauseResult fused, KrauseAttention(q, k, v, ls, o));
    ExpectKeptCounts(ref.indices, c.nb, c.n, c.top_k);
    ExpectKeptCounts(fused.indices, c.nb, c.n, c.top_k);
    const at::Tensor clean = sees.logical_not();
    o.impl = KrauseImpl::kCuda;
    for (const internal::CudaKernel kernel : KernelsFor(c.nb, c.n)) {
      SCOPED_TRACE(KernelName(kernel));
      const ForceKernel force(kernel);
      KRAUSE_ASSERT_OK_AND_ASSIGN(KrauseResult got,
                                  KrauseAttention(q.to(dev), k.to(dev), v.to(dev), ls.to(dev), o));
      const at::Tensor idx = got.indices.cpu(), out = got.out.cpu();
      EXPECT_TRUE(at::equal(idx, ref.indices)) << "GPU vs reference";
      EXPECT_TRUE(at::equal(idx, fused.indices)) << "GPU vs fused_cpu";
      ExpectKeptCounts(idx, c.nb, c.n, c.top_k);
      const auto acc = idx.accessor<int64_t, 4>();
      int64_t wrong_lead = 0;
      for (int64_t bb = 0; bb < b; ++bb) {
        for (int64_t hh = 0; hh < h; ++hh) {
          for (int64_t i = 0; i < c.n; ++i) {
            const std::vector<int64_t>& lead = nan_lead[(bb * h + hh) * c.n + i];
            for (int64_t r = 0; r < static_cast<int64_t>(lead.size()) && r < idx.size(3); ++r) {
              if (acc[bb][hh][i][r] != lead[r]) ++wrong_lead;
            }
          }
        }
      }
      EXPECT_EQ(wrong_lead, 0) << "rows whose NaN keys are not kept first, larger index first";
      // Rows without a NaN candidate: finite, and the reference's outputs.
      const at::Tensor out_clean = out.masked_select(clean.unsqueeze(-1));
      const at::Tensor ref_clean = ref.out.masked_select(clean.unsqueeze(-1));
      EXPECT_TRUE(at::isfinite(out_clean).all().item<bool>());
      EXPECT_LE(RelativeMaxError(out_clean, ref_clean), 1e-5);
    }
  }
}

// Dispatch. Under kAuto, shapes the CUDA kernels do not take (more than 2048 candidates per row;
// head dimension over 256) run the windowed LibTorch path on the GPU and match the reference;
// kCuda refuses them with InvalidArgument. Catches a kAuto that sends them to the kernels (an
// Internal error or a kernel reading past its shared memory) and a kCuda that aborts or
// throws instead of refusing.
TEST(CudaDispatch, ShapesTheKernelsDoNotTakeFallBackToTheWindowedPathUnderAuto) {
  KRAUSE_SKIP_WITHOUT_CUDA();
  const at::Device dev(at::kCUDA);
  for (const EdgeCase& c : {EdgeCase{"global_n2500", Neighbourhood::Global(), 2500, 8},
                            EdgeCase{"causal_w16_d320", Neighbourhood::Causal(16), 40, 5}}) {
    SCOPED_TRACE(c.name);
    const int64_t d = c.n == 2500 ? 16 : 320;
    const int scale_log2 = d == 320 ? -1 : 0;  // scores of a few tens (see Case::scale_log2)
    at::Generator gen = at::detail::createCPUGenerator(5);
    // Quantised: exact scores, so the windowed path's kept sets and their ties are the
    // reference's.
    const at::Tensor q = QuantizedTensor({1, 2, c.n, d}, scale_log2, gen);
    const at::Tensor k = QuantizedTensor({1, 2, c.n, d}, scale_log2, gen);
    const at::Tensor v = QuantizedTensor({1, 2, c.n, d}, scale_log2, gen);
    const at::Tensor ls = PerHeadLogSigma(2);
    KrauseOptions o;
    o.neighbourhood = c.nb;
    o.top_k = c.top_k;
    o.return_selection = true;
    o.impl = KrauseImpl::kReference;
    KRAUSE_ASSERT_OK_AND_ASSIGN(KrauseResult want, KrauseAttention(q, k, v, ls, o));
    o.impl = KrauseImpl::kAuto;
    KRAUSE_ASSERT_OK_AND_ASSIGN(KrauseResult got,
                                KrauseAttention(q.to(dev), k.to(dev), v.to(dev), ls.to(dev), o));
    ASSERT_TRUE(got.out.is_cuda());
    EXPECT_LE(RelativeMaxError(got.out.cpu(), want.out), 1e-5);
    EXPECT_TRUE(at::equal(got.indices.cpu(), want.indices));
    o.impl = KrauseImpl::kCuda;
    EXPECT_THAT(StatusOf(KrauseAttention(q.to(dev), k.to(dev), v.to(dev), ls.to(dev), o)),
                StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
  }
  // Global over 20,000 tokens: refused from the shape alone (a candidate table would hold 400
  // million entries; the check must not build one first).
  const at::Tensor x = at::zeros({1, 1, 20000, 16}, at::TensorOptions().device(dev));
  KrauseOptions o;
  o.neighbourhood = Neighbourhood::Global();
  o.top_k = 4;
  o.impl = KrauseImpl::kCuda;
  EXPECT_THAT(StatusOf(KrauseAttention(x, x, x, at::zeros({1}, x.options()), o)),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
}

}  // namespace
}  // namespace krause::testing
