// GPU parity (ctest label gpu): the CUDA kernels against the reference, case by case, on a CUDA
// device. Built only with KRAUSE_WITH_CUDA; every test skips without a device.
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "model/attention/decode.h"
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

// Clearly different sigmas per head (ln 0.7, ln 2.5, ln 6 for three heads): a kernel that takes
// head 0's 1/sigma^2 for every head, or indexes it by batch * heads + head (past the [H] array
// for batch > 0) or by the query row, moves the softmax weights far beyond the tolerance.
at::Tensor PerHeadLogSigma(int64_t heads, const at::Device& device = at::Device(at::kCPU)) {
  static constexpr double kSigmas[] = {0.7, 2.5, 6.0, 1.2, 4.0, 0.9, 3.2, 1.6};
  std::vector<float> ls;
  for (int64_t h = 0; h < heads; ++h) ls.push_back(static_cast<float>(std::log(kSigmas[h % 8])));
  return at::tensor(ls).to(device);
}

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

// Forces one CUDA kernel variant for a scope.
class ForceKernel {
 public:
  explicit ForceKernel(internal::CudaKernel k) { internal::SetCudaKernelForTesting(k); }
  ~ForceKernel() { internal::SetCudaKernelForTesting(internal::CudaKernel::kAuto); }
};

const char* KernelName(internal::CudaKernel k) {
  switch (k) {
    case internal::CudaKernel::kWarp:
      return "warp";
    case internal::CudaKernel::kBlock:
      return "block";
    default:
      return "auto";
  }
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

// The CUDA decode step against the CPU decode step (itself bit-equal to the fused prefill): three
// sequences joining at different steps, across several ring wraps, k > W included.
// Step t of the decode tests: sequence i (slot i) joins at step 2 i, so it is at position
// t - 2 i. Returns the slots and positions of the sequences that have joined.
std::pair<at::Tensor, at::Tensor> JoinedAt(int64_t t, int64_t slots) {
  std::vector<int64_t> sl, pos;
  for (int64_t i = 0; i < slots; ++i) {
    if (t >= 2 * i) {
      sl.push_back(i);
      pos.push_back(t - 2 * i);
    }
  }
  return {at::tensor(sl, at::kLong), at::tensor(pos, at::kLong)};
}

class CudaDecode : public ::testing::TestWithParam<internal::CudaKernel> {};

TEST_P(CudaDecode, MatchesTheCpuDecodeStepAcrossTheRingWrap) {
  KRAUSE_SKIP_WITHOUT_CUDA();
  const ForceKernel force(GetParam());
  const int64_t slots = 3, h = 2;
  const at::Device dev(at::kCUDA);
  // d 16 and 64 (a warp lane then holds two elements of each row).
  for (const auto& [window, top_k, d] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {8, 5, 16}, {4, 9, 16}, {128, 96, 16}, {256, 192, 16}, {32, 12, 64}, {256, 192, 64}}) {
    KRAUSE_ASSERT_OK_AND_ASSIGN(KrauseRingCache cpu, KrauseRingCache::Create(slots, h, d, window));
    KRAUSE_ASSERT_OK_AND_ASSIGN(KrauseRingCache gpu,
                                KrauseRingCache::Create(slots, h, d, window, dev));
    at::Generator gen = at::detail::createCPUGenerator(window);
    const at::Tensor ls = at::full({h}, std::log(2.5f));
    const int64_t steps = 3 * window + 5;
    for (int64_t t = 0; t < steps; ++t) {
      const auto [st, pt] = JoinedAt(t, slots);
      const int64_t s = st.size(0);
      const at::Tensor q = QuantizedTensor({s, h, d}, 3, gen),
                       k = QuantizedTensor({s, h, d}, 3, gen),
                       v = QuantizedTensor({s, h, d}, 3, gen);
      DecodeSelection want_sel, got_sel;
      KRAUSE_ASSERT_OK_AND_ASSIGN(at::Tensor want,
                                  KrauseDecodeStep(q, k, v, ls, top_k, st, pt, &cpu, &want_sel));
      KRAUSE_ASSERT_OK_AND_ASSIGN(
          at::Tensor got, KrauseDecodeStep(q.to(dev), k.to(dev), v.to(dev), ls.to(dev), top_k, st,
                                           pt, &gpu, &got_sel));
      ASSERT_LE(RelativeMaxError(got.cpu(), want), 1e-5) << "W " << window << " step " << t;
      ASSERT_TRUE(at::equal(got_sel.indices.cpu(), want_sel.indices))
          << "W " << window << " step " << t;
    }
  }
}

// What a GPU ring of `dtype` stores of x (what the CPU fp32 step must be fed to match it): fp32
// as is, bf16 rounded, fp16 rounded and saturated at +-65504 (written out here rather than taken
// from KrauseRingCache::Rounded, which the tests check).
at::Tensor StoredAs(const at::Tensor& x, at::ScalarType dtype) {
  if (dtype == at::kFloat) return x;
  const at::Tensor y = dtype == at::kHalf ? x.clamp(-65504.0, 65504.0) : x;
  return y.to(dtype).to(at::kFloat);
}

// One decode run for ExpectDecodeMatchesTheCpu.
struct DecodeRun {
  int64_t slots = 3, heads = 2, d = 16, window = 8, top_k = 5;
  at::Tensor log_sigma;               // CPU, numel 1 or heads
  at::ScalarType dtype = at::kFloat;  // the GPU ring's keys and values
  bool exact = true;                  // quantised inputs, else Gaussian
  int scale_log2 = 3;                 // quantised inputs: multiples of 2^(scale_log2 - 2)
  int64_t steps = 0;                  // 0: two ring wraps and a few steps more
  std::vector<int64_t> join;          // slot i's sequence joins at step join[i]; empty: 2 i
  bool alternate_order = false;       // odd steps list the slots in descending order
};

// Runs the decode steps of r on a CPU fp32 ring and a GPU ring side by side (the CPU step fed the
// keys and values as the GPU ring stores them): each step's outputs within 1e-5 of the CPU's and,
// with exact inputs, its kept positions equal.
void ExpectDecodeMatchesTheCpu(const DecodeRun& r, uint64_t seed) {
  const at::Device dev(at::kCUDA);
  KRAUSE_ASSERT_OK_AND_ASSIGN(KrauseRingCache cpu,
                              KrauseRingCache::Create(r.slots, r.heads, r.d, r.window));
  KRAUSE_ASSERT_OK_AND_ASSIGN(
      KrauseRingCache gpu, KrauseRingCache::Create(r.slots, r.heads, r.d, r.window, dev, r.dtype));
  ASSERT_EQ(gpu.dtype(), r.dtype);
  std::vector<int64_t> join = r.join;
  if (join.empty()) {
    for (int64_t i = 0; i < r.slots; ++i) join.push_back(2 * i);
  }
  at::Generator gen = at::detail::createCPUGenerator(seed);
  const at::Tensor ls_dev = r.log_sigma.to(dev);
  const int64_t steps = r.steps > 0 ? r.steps : 2 * r.window + 7;
  for (int64_t t = 0; t < steps; ++t) {
    std::vector<int64_t> sl, pos;
    for (int64_t i = 0; i < r.slots; ++i) {
      if (t >= join[i]) {
        sl.push_back(i);
        pos.push_back(t - join[i]);
      }
    }
    if (sl.empty()) continue;
    if (r.alternate_order && t % 2 == 1) {
      std::reverse(sl.begin(), sl.end());
      std::reverse(pos.begin(), pos.end());
    }
    const at::Tensor st = at::tensor(sl, at::kLong), pt = at::tensor(pos, at::kLong);
    const int64_t s = st.size(0);
    auto make = [&] {
      return r.exact ? QuantizedTensor({s, r.heads, r.d}, r.scale_log2, gen)
                     : GaussianTensor({s, r.heads, r.d}, 0.3, gen);
    };
    const at::Tensor q = make(), k = make(), v = make();
    DecodeSelection want_sel, got_sel;
    KRAUSE_ASSERT_OK_AND_ASSIGN(at::Tensor want,
                                KrauseDecodeStep(q, StoredAs(k, r.dtype), StoredAs(v, r.dtype),
                                                 r.log_sigma, r.top_k, st, pt, &cpu, &want_sel));
    KRAUSE_ASSERT_OK_AND_ASSIGN(
        at::Tensor got,
        KrauseDecodeStep(q.to(dev), k.to(dev), v.to(dev), ls_dev, r.top_k, st, pt, &gpu, &got_sel));
    ASSERT_LE(RelativeMaxError(got.cpu(), want), 1e-5) << "step " << t;
    if (r.exact) {
      ASSERT_TRUE(at::equal(got_sel.indices.cpu(), want_sel.indices)) << "step " << t;
    }
  }
}

// A different sigma per head over several sequences at once (S up to 4, H 3): catches a decode
// kernel that reads inv_sigma2 for head 0 only, or at sequence * heads + head (past the [H]
// array), or at the sequence. Also one 0-dim log_sigma shared by every head. Narrow (W 16) and
// wide (W 200: 7 candidates per lane) rows.
TEST_P(CudaDecode, DistinctSigmasPerHeadMatchTheCpuDecodeStep) {
  KRAUSE_SKIP_WITHOUT_CUDA();
  const ForceKernel force(GetParam());
  for (const auto& [window, top_k, d] :
       std::vector<std::tuple<int64_t, int64_t, int64_t>>{{16, 5, 32}, {200, 60, 16}}) {
    for (const bool exact : {true, false}) {
      // (Gaussian only on narrow rows: see ParityParams.)
      if (!exact && window > 128) continue;
      SCOPED_TRACE(::testing::Message() << "W " << window << (exact ? " exact" : " gaussian"));
      DecodeRun r;
      r.slots = 4;
      r.heads = 3;
      r.d = d;
      r.window = window;
      r.top_k = top_k;
      r.log_sigma = PerHeadLogSigma(3);
      r.exact = exact;
      r.scale_log2 = 2;
      ExpectDecodeMatchesTheCpu(r, 100 + window);
    }
  }
  DecodeRun r;
  r.heads = 3;
  r.d = 32;
  r.window = 16;
  r.top_k = 5;
  r.log_sigma = at::full({}, std::log(0.8f));
  SCOPED_TRACE("0-dim log_sigma");
  ExpectDecodeMatchesTheCpu(r, 7);
}

// Head dims over 64 (3, 4 and 8 elements per lane; 256 is the largest the kernels take): catches
// a query row or lane loop sized for d <= 64.
TEST_P(CudaDecode, HeadDimsOver64MatchTheCpuDecodeStep) {
  KRAUSE_SKIP_WITHOUT_CUDA();
  const ForceKernel force(GetParam());
  for (const auto& [window, top_k, d] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {32, 12, 96}, {64, 20, 128}, {48, 16, 256}}) {
    for (const bool exact : {true, false}) {
      SCOPED_TRACE(::testing::Message() << "d " << d << (exact ? " exact" : " gaussian"));
      DecodeRun r;
      r.heads = 2;
      r.d = d;
      r.window = window;
      r.top_k = top_k;
      r.log_sigma = PerHeadLogSigma(2);
      r.exact = exact;
      r.scale_log2 = 1;
      ExpectDecodeMatchesTheCpu(r, 200 + d);
    }
  }
}

// 600 sequences x 8 heads = 4,800 (sequence, head) rows in one step (1,200 warp-kernel blocks,
// a 600 x 8 block-kernel grid), sequences joining in five waves and listed in descending slot
// order on odd steps (a step's row s is then not slot s): catches a launch that caps the rows
// and a ring addressed by the step's row instead of its slot.
TEST_P(CudaDecode, ManySequencesTimesHeadsMatchTheCpuDecodeStep) {
  KRAUSE_SKIP_WITHOUT_CUDA();
  const ForceKernel force(GetParam());
  DecodeRun r;
  r.slots = 600;
  r.heads = 8;
  r.d = 16;
  r.window = 32;
  r.top_k = 12;
  r.log_sigma = PerHeadLogSigma(8);
  r.scale_log2 = 2;
  r.steps = r.window + 12;  // one ring wrap for every wave
  for (int64_t i = 0; i < r.slots; ++i) r.join.push_back(i % 5);
  r.alternate_order = true;
  ExpectDecodeMatchesTheCpu(r, 600);
}

INSTANTIATE_TEST_SUITE_P(Kernels, CudaDecode,
                         ::testing::Values(internal::CudaKernel::kBlock,
                                           internal::CudaKernel::kWarp),
                         [](const ::testing::TestParamInfo<internal::CudaKernel>& info) {
                           return std::string(KernelName(info.param));
                         });

// fp32 decode with W > 256: the only route into the block decode kernel under kAuto (the warp
// kernel takes windows up to 256), so it is checked under kAuto as well as forced. W 300 and 512,
// with the ring wrapped, per-head sigmas. Catches a kAuto that sends a wide window to the warp
// kernel (an error, or a row cut at 256 candidates) and block-kernel faults past 256.
class CudaDecodeWide : public ::testing::TestWithParam<internal::CudaKernel> {};

TEST_P(CudaDecodeWide, WindowsOver256MatchTheCpuDecodeStep) {
  KRAUSE_SKIP_WITHOUT_CUDA();
  const ForceKernel force(GetParam());
  for (const auto& [window, top_k, d] :
       std::vector<std::tuple<int64_t, int64_t, int64_t>>{{300, 40, 16}, {512, 200, 32}}) {
    SCOPED_TRACE(::testing::Message() << "W " << window);
    DecodeRun r;
    r.heads = 3;
    r.d = d;
    r.window = window;
    r.top_k = top_k;
    r.log_sigma = PerHeadLogSigma(3);
    r.scale_log2 = 2;
    r.steps = window + 12;  // past the ring wrap for every sequence
    ExpectDecodeMatchesTheCpu(r, window);
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, CudaDecodeWide,
                         ::testing::Values(internal::CudaKernel::kAuto,
                                           internal::CudaKernel::kBlock),
                         [](const ::testing::TestParamInfo<internal::CudaKernel>& info) {
                           return std::string(KernelName(info.param));
                         });

// bf16 / fp16 ring caches: the CUDA decode step stores keys and values rounded; with inputs that
// are exact in both formats (multiples of 1/4 times 8, |x| <= 4) it matches the fp32 CPU decode
// step exactly in the kept sets, and within the fp32 tolerance in the outputs. Then Gaussian
// inputs against the CPU step fed the same rounded keys and values: within 1e-5.
TEST(CudaDecodeReduced, MatchesTheCpuStepOnTheRoundedKeysAndValues) {
  KRAUSE_SKIP_WITHOUT_CUDA();
  const int64_t slots = 3, h = 2, d = 32, window = 16, top_k = 6;
  const at::Device dev(at::kCUDA);
  for (const at::ScalarType dtype : {at::kBFloat16, at::kHalf}) {
    for (const bool exact : {true, false}) {
      SCOPED_TRACE(std::string(c10::toString(dtype)) + (exact ? " exact" : " gaussian"));
      KRAUSE_ASSERT_OK_AND_ASSIGN(KrauseRingCache cpu,
                                  KrauseRingCache::Create(slots, h, d, window));
      KRAUSE_ASSERT_OK_AND_ASSIGN(KrauseRingCache gpu,
                                  KrauseRingCache::Create(slots, h, d, window, dev, dtype));
      EXPECT_EQ(gpu.dtype(), dtype);
      at::Generator gen = at::detail::createCPUGenerator(17);
      const at::Tensor ls = at::full({h}, std::log(2.5f));
      for (int64_t t = 0; t < 2 * window + 3; ++t) {
        const auto [st, pt] = JoinedAt(t, slots);
        const int64_t s = st.size(0);
        auto make = [&] {
          return exact ? QuantizedTensor({s, h, d}, 3, gen) : GaussianTensor({s, h, d}, 0.3, gen);
        };
        const at::Tensor q = make(), k = make(), v = make();
        // What the reduced cache stores, for the fp32 CPU step.
        const at::Tensor kr = k.to(dtype).to(at::kFloat), vr = v.to(dtype).to(at::kFloat);
        DecodeSelection want_sel, got_sel;
        KRAUSE_ASSERT_OK_AND_ASSIGN(
            at::Tensor want, KrauseDecodeStep(q, kr, vr, ls, top_k, st, pt, &cpu, &want_sel));
        KRAUSE_ASSERT_OK_AND_ASSIGN(
            at::Tensor got, KrauseDecodeStep(q.to(dev), k.to(dev), v.to(dev), ls.to(dev), top_k, st,
                                             pt, &gpu, &got_sel));
        ASSERT_LE(RelativeMaxError(got.cpu(), want), 1e-5) << "step " << t;
        if (exact) {
          ASSERT_TRUE(at::equal(got_sel.indices.cpu(), want_sel.indices)) << t;
        }
      }
    }
  }
}

// bf16 / fp16 rings with windows over 16 (W 64 and the largest, 256: up to 8 candidates per
// lane, keys read back as 16-bit elements across the whole ring), per-head sigmas: catches a
// reduced-precision ring indexed or strided for small windows only. Gaussian inputs on W 64 only
// (see ParityParams).
TEST(CudaDecodeReduced, WindowsOver16MatchTheCpuStepOnTheRoundedKeysAndValues) {
  KRAUSE_SKIP_WITHOUT_CUDA();
  for (const at::ScalarType dtype : {at::kBFloat16, at::kHalf}) {
    for (const auto& [window, top_k] :
         std::vector<std::pair<int64_t, int64_t>>{{64, 20}, {256, 100}}) {
      for (const bool exact : {true, false}) {
        if (!exact && window > 128) continue;
        SCOPED_TRACE(::testing::Message() << c10::toString(dtype) << " W " << window
                                          << (exact ? " exact" : " gaussian"));
        DecodeRun r;
        r.heads = 3;
        r.d = 32;
        r.window = window;
        r.top_k = top_k;
        r.log_sigma = PerHeadLogSigma(3);
        r.dtype = dtype;
        r.exact = exact;
        r.scale_log2 = 2;  // integers up to 2: exact in bf16 and fp16
        r.steps = window + 12;
        ExpectDecodeMatchesTheCpu(r, 300 + window);
      }
    }
  }
}

// fp16 rings saturate: a key or value element beyond +-65504 is stored as +-65504 (not inf), and
// the key's bias is the stored key's. Step 2 writes key elements 1e5 and -1e5 and value elements
// 1e5 and -2e5; on steps 3..6 the query of (slot 0, head 0) has 6e4 where the saturated key has
// 65504, so that key's score, (6e4 * 65504 - 65504^2 / 2) / sigma^2 > 0, wins its row outright:
// with a bias from the unsaturated key (-1e10 / 2) it would lose (the output then differs), with
// an inf key or value the output is inf or NaN. top_k = W keeps every key, so each saturated
// value enters an output. Against the fp32 CPU step fed the saturated, rounded keys and values:
// finite, within 1e-5 (relative to each element), the same kept positions. bf16 (fp32's range:
// nothing saturates) runs the same steps against its rounding.
TEST(CudaDecodeReduced, Fp16CachesSaturateAtTheLargestHalfInsteadOfOverflowing) {
  KRAUSE_SKIP_WITHOUT_CUDA();
  const int64_t slots = 2, h = 2, d = 16, window = 8, top_k = 8;
  const at::Device dev(at::kCUDA);
  for (const at::ScalarType dtype : {at::kHalf, at::kBFloat16}) {
    SCOPED_TRACE(c10::toString(dtype));
    KRAUSE_ASSERT_OK_AND_ASSIGN(KrauseRingCache cpu, KrauseRingCache::Create(slots, h, d, window));
    KRAUSE_ASSERT_OK_AND_ASSIGN(KrauseRingCache gpu,
                                KrauseRingCache::Create(slots, h, d, window, dev, dtype));
    at::Generator gen = at::detail::createCPUGenerator(65504);
    const at::Tensor ls = at::full({h}, std::log(2.5f));
    for (int64_t t = 0; t < 2 * window + 4; ++t) {
      const at::Tensor st = at::arange(slots, at::kLong), pt = at::full({slots}, t, at::kLong);
      const at::Tensor q = QuantizedTensor({slots, h, d}, 0, gen),
                       k = QuantizedTensor({slots, h, d}, 0, gen),
                       v = QuantizedTensor({slots, h, d}, 0, gen);
      if (t == 2) {
        k[0][0][0].fill_(1e5);
        k[1][1][3].fill_(-1e5);
        v[0][1][5].fill_(1e5);
        v[1][0][2].fill_(-2e5);
      }
      if (t >= 3 && t <= 6) q[0][0][0].fill_(6e4);
      DecodeSelection want_sel, got_sel;
      KRAUSE_ASSERT_OK_AND_ASSIGN(
          at::Tensor want, KrauseDecodeStep(q, StoredAs(k, dtype), StoredAs(v, dtype), ls, top_k,
                                            st, pt, &cpu, &want_sel));
      KRAUSE_ASSERT_OK_AND_ASSIGN(
          at::Tensor got, KrauseDecodeStep(q.to(dev), k.to(dev), v.to(dev), ls.to(dev), top_k, st,
                                           pt, &gpu, &got_sel));
      const at::Tensor g = got.cpu();
      ASSERT_TRUE(at::isfinite(g).all().item<bool>()) << "step " << t;
      ASSERT_TRUE(at::isfinite(want).all().item<bool>()) << "step " << t;
      ASSERT_TRUE(at::allclose(g, want, 1e-5, 1e-5))
          << "step " << t << ": largest difference " << (g - want).abs().max().item<double>();
      ASSERT_TRUE(at::equal(got_sel.indices.cpu(), want_sel.indices)) << "step " << t;
      if (t == 2 && dtype == at::kHalf) {
        // The saturated elements as the GPU ring holds them (position 2: ring column 2).
        const at::Tensor keys = gpu.keys_t().cpu().to(at::kFloat);    // [slots, H, d, stride]
        const at::Tensor values = gpu.values().cpu().to(at::kFloat);  // [slots, H, W, d]
        EXPECT_EQ(keys[0][0][0][2].item<float>(), 65504.f);
        EXPECT_EQ(keys[1][1][3][2].item<float>(), -65504.f);
        EXPECT_EQ(values[0][1][2][5].item<float>(), 65504.f);
        EXPECT_EQ(values[1][0][2][2].item<float>(), -65504.f);
        // Its bias is the stored key's: -(65504^2 + the other elements' squares) / 2.
        const double others = k[0][0].narrow(0, 1, d - 1).pow(2).sum().item<double>();
        EXPECT_NEAR(gpu.bias().cpu()[0][0][2].item<double>(), -0.5 * (65504.0 * 65504.0 + others),
                    1e-6 * 65504.0 * 65504.0);
      }
    }
  }
}

}  // namespace
}  // namespace krause::testing
