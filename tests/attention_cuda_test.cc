// GPU parity (ctest label gpu): the CUDA kernels against the reference, case by case, on a CUDA
// device; and keys at an odd offset. The edge values and the dispatch:
// attention_cuda_edge_test.cc; the decode step: attention_cuda_decode_test.cc. Built only with
// KRAUSE_WITH_CUDA; every test skips without a device.
#include "attention_cuda_test.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <tuple>
#include <vector>

#include "model/attention/krause_attention.h"
#include "model/attention/neighbourhood.h"
#include "test_util.h"

namespace krause::testing {
namespace {

// How a case gives log_sigma (numel 1 or H).
enum class Sigma {
  kSame,      // [H], every head ln 2.5
  kPerHead,   // [H], a different sigma per head (PerHeadLogSigma)
  kScalar,    // 0-dim ln 2.5: one value broadcast to every head
  kOne,       // [1] ln 2.5: the shape of a ViT layer's log_sigma
  kExpanded,  // [1, 1, 1, 1] ln 2.5 expanded to [1, H, 1, 1]: a stride-0, non-contiguous view
  kTiny,      // [H] ln 1e-3: scores 5e5 times the squared distances (one-hot weights)
  kHuge,      // [H] ln 1e3: scores 5e-7 times the squared distances (near-uniform weights)
};

// Which input families a case runs (CudaParity's `exact` flag picks quantised or Gaussian).
enum class Inputs {
  kAny,        // quantised, and Gaussian where the rows are narrow enough (ParityParams)
  kExactOnly,  // quantised only
  kConstant,   // every q and every k the same vector: every score of a row ties
};

// Built on `device` directly: a stride-0 view copied to another device would arrive contiguous.
at::Tensor LogSigma(Sigma s, int64_t heads, const at::Device& device) {
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device);
  const float ln2_5 = std::log(2.5f);
  switch (s) {
    case Sigma::kSame:
      return at::full({heads}, ln2_5, f32);
    case Sigma::kPerHead:
      return PerHeadLogSigma(heads, device);
    case Sigma::kScalar:
      return at::full({}, ln2_5, f32);
    case Sigma::kOne:
      return at::full({1}, ln2_5, f32);
    case Sigma::kExpanded:
      return at::full({1, 1, 1, 1}, ln2_5, f32).expand({1, heads, 1, 1});
    case Sigma::kTiny:
      return at::full({heads}, std::log(1e-3f), f32);
    case Sigma::kHuge:
      return at::full({heads}, std::log(1e3f), f32);
  }
  return at::Tensor();
}

struct Case {
  const char* name;
  Neighbourhood nb;
  int64_t n, top_k, d;
  Sigma sigma = Sigma::kSame;
  Inputs inputs = Inputs::kAny;
  // Quantised inputs are multiples of 2^(scale_log2 - 2) up to 2^(scale_log2 - 1) (test_util.h).
  // Smaller for large d or small sigma, so that typical scores stay at a few tens at most: the
  // reference's scores (the distance form) and the kernels' (the bias form) are each rounded at
  // the scores' magnitude (half an ulp of 64 is 4e-6), which must not move the softmax weights,
  // and through them the outputs, by 1e-5.
  int scale_log2 = 3;
  int64_t batch = 2, heads = 3;
};

std::vector<Case> Cases() {
  const auto grid = [](int64_t side, int64_t radius, GridMetric metric, bool cls) {
    return Neighbourhood::Grid(side, side, radius, metric, cls);
  };
  const GridMetric manhattan = GridMetric::kManhattan, chebyshev = GridMetric::kChebyshev;
  return {
      {"causal_w1", Neighbourhood::Causal(1), 9, 1, 16},
      {"causal_w4_k2", Neighbourhood::Causal(4), 33, 2, 16},
      {"causal_w128_k96", Neighbourhood::Causal(128), 300, 96, 32},
      {"causal_w256_k192", Neighbourhood::Causal(256), 700, 192, 64},
      {"causal_k_over_w", Neighbourhood::Causal(8), 20, 11, 16},
      {"grid_manhattan_cls", grid(8, 1, manhattan, true), 65, 2, 16},
      {"grid_chebyshev_r2", grid(14, 2, chebyshev, false), 196, 8, 32},
      {"global", Neighbourhood::Global(), 50, 7, 16},
      // d not a multiple of 4 (no vector loads) and d over 32 (two elements per lane).
      {"causal_w16_d18", Neighbourhood::Causal(16), 40, 5, 18},
      {"causal_w32_d36", Neighbourhood::Causal(32), 70, 9, 36},
      // 300 candidates per row: more than a warp kernel row takes, so kAuto runs the block one.
      {"global_wide", Neighbourhood::Global(), 300, 40, 16},
      // A different sigma per head with B 2 (every case has B > 1): catches inv_sigma2 read for
      // head 0 only, at batch * heads + head, or at the query row, in either kernel.
      {"causal_w16_sigma_per_head", Neighbourhood::Causal(16), 40, 5, 16, Sigma::kPerHead,
       Inputs::kAny, 1},
      {"grid_cls_sigma_per_head", grid(8, 1, manhattan, true), 65, 3, 32, Sigma::kPerHead,
       Inputs::kAny, 0},
      {"global_wide_sigma_per_head", Neighbourhood::Global(), 300, 40, 16, Sigma::kPerHead,
       Inputs::kAny, 1},
      // One log_sigma for every head, as the ViT passes its per-layer [1] parameter: 0-dim, [1]
      // and a stride-0 expanded view. Catches a kernel or dispatch that reads the caller's
      // log_sigma storage per head (past a one-element array, or through a stride-0 view as if
      // it were contiguous) instead of the normalised [H] copy.
      {"causal_w8_sigma_scalar", Neighbourhood::Causal(8), 30, 3, 16, Sigma::kScalar,
       Inputs::kExactOnly},
      {"causal_w8_sigma_one", Neighbourhood::Causal(8), 30, 3, 16, Sigma::kOne, Inputs::kExactOnly},
      {"grid_cls_sigma_expanded", grid(8, 1, manhattan, true), 65, 3, 16, Sigma::kExpanded,
       Inputs::kExactOnly},
      {"global_wide_sigma_expanded", Neighbourhood::Global(), 300, 40, 16, Sigma::kExpanded,
       Inputs::kExactOnly},
      // Head dims over 64 (three, four and eight elements per lane; 256 is the largest the
      // kernels take): catches a query row or lane loop sized for d <= 64.
      {"causal_w32_d96", Neighbourhood::Causal(32), 80, 9, 96, Sigma::kPerHead, Inputs::kAny, 0},
      {"causal_w64_d128", Neighbourhood::Causal(64), 150, 20, 128, Sigma::kPerHead, Inputs::kAny,
       -1},
      {"causal_w128_d256", Neighbourhood::Causal(128), 200, 40, 256, Sigma::kPerHead, Inputs::kAny,
       -1},
      {"grid_cls_d256", grid(8, 1, chebyshev, true), 65, 4, 256, Sigma::kSame, Inputs::kAny, 1},
      {"global_wide_d256", Neighbourhood::Global(), 300, 40, 256, Sigma::kSame, Inputs::kAny, 0},
      // Grids over 256 tokens with CLS: the CLS row has all n candidates (more than a warp row
      // takes), the patch rows at most 6 and 26 (CLS included). Under kAuto the warp kernel runs
      // the patch rows and the block kernel the CLS row (checked in CudaParity). Likewise causal W
      // 300: rows 0..255 fit a warp, the later ones do not.
      {"grid16_manhattan_cls_n257", grid(16, 1, manhattan, true), 257, 2, 16, Sigma::kPerHead,
       Inputs::kAny, 1},
      {"grid24_chebyshev_r2_cls_n577", grid(24, 2, chebyshev, true), 577, 8, 32, Sigma::kSame,
       Inputs::kAny, 2},
      {"causal_w300_k40", Neighbourhood::Causal(300), 400, 40, 16, Sigma::kPerHead, Inputs::kAny,
       1},
      // Constant inputs: every score of a row ties, so the tie rule alone ("equal score: larger
      // key index wins") decides the kept set and its rank order, in narrow and wide rows.
      {"causal_w8_constant", Neighbourhood::Causal(8), 20, 3, 16, Sigma::kSame, Inputs::kConstant},
      {"causal_w256_constant", Neighbourhood::Causal(256), 300, 100, 32, Sigma::kSame,
       Inputs::kConstant},
      {"grid_cls_constant", grid(4, 1, chebyshev, true), 17, 3, 16, Sigma::kSame,
       Inputs::kConstant},
      {"global_wide_constant", Neighbourhood::Global(), 300, 40, 16, Sigma::kSame,
       Inputs::kConstant},
      // Extreme sigma: 1 / (2 sigma^2) = 5e5 (scores ~1e8 here: one-hot weights, exp of huge
      // negatives) and 5e-7 (scores ~1e-4: near-uniform weights): finite outputs, the
      // reference's kept sets and weights. Catches an overflow to inf / NaN in the scores or
      // the softmax, and a selection that loses ranks when scores are tiny.
      {"causal_w16_sigma_1e-3", Neighbourhood::Causal(16), 40, 5, 32, Sigma::kTiny,
       Inputs::kExactOnly},
      {"causal_w16_sigma_1e3", Neighbourhood::Causal(16), 40, 5, 32, Sigma::kHuge,
       Inputs::kExactOnly},
      {"global_wide_sigma_1e-3", Neighbourhood::Global(), 300, 40, 16, Sigma::kTiny,
       Inputs::kExactOnly},
      {"global_wide_sigma_1e3", Neighbourhood::Global(), 300, 40, 16, Sigma::kHuge,
       Inputs::kExactOnly},
      // 16 x 8 x 560 = 71,680 rows (17,920 warp-kernel blocks of 4 rows; 71,680 block-kernel
      // blocks): catches a launch that caps or wraps the rows (e.g. a grid dimension of 65,535,
      // a 16-bit row index), leaving rows unwritten. Per-head sigmas over 8 heads.
      {"rows_71680", Neighbourhood::Causal(16), 560, 5, 16, Sigma::kPerHead, Inputs::kExactOnly, 1,
       16, 8},
  };
}

// A table with rows of both kinds: some fit a warp (<= 256 candidates), some do not. kAuto then
// runs both kernels, each on its rows.
bool MixedRows(const Neighbourhood& nb, int64_t n) {
  if (MaxCandidates(nb, n) <= 256) return false;
  for (int64_t i = 0; i < n; ++i) {
    if (NumCandidates(nb, n, i) <= 256) return true;
  }
  return false;
}

class CudaParity : public ::testing::TestWithParam<std::tuple<int, bool, internal::CudaKernel>> {};

TEST_P(CudaParity, MatchesReference) {
  KRAUSE_SKIP_WITHOUT_CUDA();
  const auto [index, exact, kernel] = GetParam();
  const Case c = Cases()[index];
  SCOPED_TRACE(std::string(c.name) + " " + KernelName(kernel) + (exact ? " exact" : " gaussian"));
  at::Generator gen = at::detail::createCPUGenerator(1234 + index);
  // exact: quantised inputs (scores exact in fp32, so kept sets and ranks must match exactly,
  // ties included); else Gaussian inputs within the tolerance.
  auto make = [&](at::IntArrayRef shape) {
    return exact ? QuantizedTensor(shape, c.scale_log2, gen) : GaussianTensor(shape, 0.3, gen);
  };
  const std::vector<int64_t> shape = {c.batch, c.heads, c.n, c.d};
  at::Tensor q, k;
  if (c.inputs == Inputs::kConstant) {
    q = at::full(shape, 0.25f);
    k = at::full(shape, 0.5f);
  } else {
    q = make(shape);
    k = make(shape);
  }
  const at::Tensor v = make(shape);
  const at::Device dev(at::kCUDA);
  const at::Tensor ls = LogSigma(c.sigma, c.heads, at::Device(at::kCPU));
  const at::Tensor ls_dev = LogSigma(c.sigma, c.heads, dev);
  if (c.sigma == Sigma::kExpanded) {
    ASSERT_FALSE(ls_dev.is_contiguous());
  }
  KrauseOptions ref;
  ref.neighbourhood = c.nb;
  ref.top_k = c.top_k;
  ref.return_selection = true;
  ref.impl = KrauseImpl::kReference;
  KRAUSE_ASSERT_OK_AND_ASSIGN(KrauseResult want, KrauseAttention(q, k, v, ls, ref));
  KrauseOptions gpu = ref;
  gpu.impl = KrauseImpl::kCuda;
  KrauseResult got;
  {
    const ForceKernel force(kernel);
    KRAUSE_ASSERT_OK_AND_ASSIGN(got, KrauseAttention(q.to(dev), k.to(dev), v.to(dev), ls_dev, gpu));
  }
  EXPECT_TRUE(at::isfinite(got.out).all().item<bool>());
  EXPECT_LE(RelativeMaxError(got.out.cpu(), want.out), 1e-5);
  if (exact) {
    EXPECT_TRUE(at::equal(got.indices.cpu(), want.indices));
  }
  EXPECT_LE(RelativeMaxError(got.weights.cpu(), want.weights), 1e-5);
  // (Not when KRAUSE_CUDA_KERNEL steers kAuto: the device check re-runs the tests so.)
  if (std::getenv("KRAUSE_CUDA_KERNEL") != nullptr) return;
  KrauseOptions autod = ref;
  autod.impl = KrauseImpl::kAuto;
  if (MixedRows(c.nb, c.n)) {
    // kAuto runs the warp kernel on the narrow rows and the block kernel on the wide ones (a CLS
    // row over a grid of more than 256 tokens, the late rows of causal W > 256): the reference's
    // kept sets and outputs, and the forced block kernel's outputs within the tolerance (the two
    // kernels sum in different orders, so not bit for bit). Catches a mixed launch that drops
    // or double-writes rows, or gives a wide row to the warp kernel.
    if (kernel != internal::CudaKernel::kBlock) return;
    KRAUSE_ASSERT_OK_AND_ASSIGN(KrauseResult a,
                                KrauseAttention(q.to(dev), k.to(dev), v.to(dev), ls_dev, autod));
    EXPECT_LE(RelativeMaxError(a.out.cpu(), want.out), 1e-5);
    EXPECT_LE(RelativeMaxError(a.out, got.out), 1e-5);
    if (exact) {
      EXPECT_TRUE(at::equal(a.indices.cpu(), want.indices));
    }
    return;
  }
  // Otherwise kAuto picks the CUDA kernels for CUDA fp32 tensors without gradients, and of those
  // the warp kernel where every row fits it, else the block one: bit for bit that kernel's.
  const int64_t width = MaxCandidates(c.nb, c.n);
  const internal::CudaKernel automatic =
      width <= 256 ? internal::CudaKernel::kWarp : internal::CudaKernel::kBlock;
  if (kernel == automatic) {
    autod.return_selection = false;
    KRAUSE_ASSERT_OK_AND_ASSIGN(KrauseResult a,
                                KrauseAttention(q.to(dev), k.to(dev), v.to(dev), ls_dev, autod));
    EXPECT_TRUE(at::equal(a.out, got.out));
  }
}

// Every case with exact inputs, for both kernels (the warp one where a row fits); the Gaussian
// family only where k < 64 and rows have at most 128 candidates: with ~200 candidates a row's
// k-th and (k+1)-th Gaussian scores are close enough that the reference's and the kernel's
// roundings (~1e-6 apart) may keep different sets, which moves the output far beyond the
// tolerance without either being wrong (the CPU parity test draws the same line).
std::vector<std::tuple<int, bool, internal::CudaKernel>> ParityParams() {
  std::vector<std::tuple<int, bool, internal::CudaKernel>> params;
  const std::vector<Case> cases = Cases();
  for (int i = 0; i < static_cast<int>(cases.size()); ++i) {
    for (const internal::CudaKernel k :
         {internal::CudaKernel::kBlock, internal::CudaKernel::kWarp}) {
      // The warp kernel takes rows of up to 256 candidates.
      if (k == internal::CudaKernel::kWarp && MaxCandidates(cases[i].nb, cases[i].n) > 256)
        continue;
      params.emplace_back(i, true, k);
      if (cases[i].inputs == Inputs::kAny && cases[i].top_k < 64 &&
          MaxCandidates(cases[i].nb, cases[i].n) <= 128) {
        params.emplace_back(i, false, k);
      }
    }
  }
  return params;
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaParity, ::testing::ValuesIn(ParityParams()));

// A key tensor whose data starts 4 bytes past a 16-byte boundary (a contiguous view with a
// storage offset) must not take the warp kernel's vector loads: same result as an aligned copy.
TEST(CudaKernels, KeysAtAnOddOffsetGiveTheAlignedResult) {
  KRAUSE_SKIP_WITHOUT_CUDA();
  const ForceKernel force(internal::CudaKernel::kWarp);
  const at::Device dev(at::kCUDA);
  const int64_t n = 40, d = 16;
  at::Generator gen = at::detail::createCPUGenerator(9);
  const at::Tensor q = QuantizedTensor({1, 2, n, d}, 3, gen).to(dev);
  const at::Tensor v = QuantizedTensor({1, 2, n, d}, 3, gen).to(dev);
  const at::Tensor k = QuantizedTensor({1, 2, n, d}, 3, gen).to(dev);
  const at::Tensor storage = at::zeros({2 * n * d + 1}, k.options());
  storage.narrow(0, 1, 2 * n * d).copy_(k.reshape({-1}));
  const at::Tensor k_odd = storage.narrow(0, 1, 2 * n * d).view({1, 2, n, d});
  ASSERT_TRUE(k_odd.is_contiguous());
  ASSERT_NE(reinterpret_cast<uintptr_t>(k_odd.data_ptr()) % 16, 0u);
  KrauseOptions o;
  o.neighbourhood = Neighbourhood::Causal(8);
  o.top_k = 5;
  o.impl = KrauseImpl::kCuda;
  const at::Tensor ls = at::full({2}, std::log(2.5f), k.options());
  KRAUSE_ASSERT_OK_AND_ASSIGN(KrauseResult aligned, KrauseAttention(q, k, v, ls, o));
  KRAUSE_ASSERT_OK_AND_ASSIGN(KrauseResult odd, KrauseAttention(q, k_odd, v, ls, o));
  EXPECT_TRUE(at::equal(aligned.out, odd.out));
}

}  // namespace
}  // namespace krause::testing
