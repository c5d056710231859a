// GPU parity (ctest label gpu): the CUDA kernels against the reference, case by case, on a CUDA
// device. Built only with KRAUSE_WITH_CUDA; every test skips without a device.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

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

struct Case {
  const char* name;
  Neighbourhood nb;
  int64_t n, top_k, d;
};

std::vector<Case> Cases() {
  return {
      {"causal_w1", Neighbourhood::Causal(1), 9, 1, 16},
      {"causal_w4_k2", Neighbourhood::Causal(4), 33, 2, 16},
      {"causal_w128_k96", Neighbourhood::Causal(128), 300, 96, 32},
      {"causal_w256_k192", Neighbourhood::Causal(256), 700, 192, 64},
      {"causal_k_over_w", Neighbourhood::Causal(8), 20, 11, 16},
      {"grid_manhattan_cls", Neighbourhood::Grid(8, 8, 1, GridMetric::kManhattan, true), 65, 2, 16},
      {"grid_chebyshev_r2", Neighbourhood::Grid(14, 14, 2, GridMetric::kChebyshev, false), 196, 8,
       32},
      {"global", Neighbourhood::Global(), 50, 7, 16},
      // d not a multiple of 4 (no vector loads) and d over 32 (two elements per lane).
      {"causal_w16_d18", Neighbourhood::Causal(16), 40, 5, 18},
      {"causal_w32_d36", Neighbourhood::Causal(32), 70, 9, 36},
      // 300 candidates per row: more than a warp kernel row takes, so kAuto runs the block one.
      {"global_wide", Neighbourhood::Global(), 300, 40, 16},
  };
}

// Forces one CUDA kernel variant for a scope.
class ForceKernel {
 public:
  explicit ForceKernel(internal::CudaKernel k) { internal::SetCudaKernelForTesting(k); }
  ~ForceKernel() { internal::SetCudaKernelForTesting(internal::CudaKernel::kAuto); }
};

const char* KernelName(internal::CudaKernel k) {
  return k == internal::CudaKernel::kWarp ? "warp" : "block";
}

class CudaParity : public ::testing::TestWithParam<std::tuple<int, bool, internal::CudaKernel>> {};

TEST_P(CudaParity, MatchesReference) {
  KRAUSE_SKIP_WITHOUT_CUDA();
  const auto [index, exact, kernel] = GetParam();
  const Case c = Cases()[index];
  SCOPED_TRACE(KernelName(kernel));
  at::Generator gen = at::detail::createCPUGenerator(1234 + index);
  // exact: quantised inputs (scores exact in fp32, so kept sets and ranks must match exactly,
  // ties included); else Gaussian inputs within the tolerance.
  auto make = [&](at::IntArrayRef shape) {
    return exact ? QuantizedTensor(shape, 3, gen) : GaussianTensor(shape, 0.3, gen);
  };
  const at::Tensor q = make({2, 3, c.n, c.d}), k = make({2, 3, c.n, c.d}),
                   v = make({2, 3, c.n, c.d});
  const at::Tensor ls = at::full({3}, std::log(2.5f));
  KrauseOptions ref;
  ref.neighbourhood = c.nb;
  ref.top_k = c.top_k;
  ref.return_selection = true;
  ref.impl = KrauseImpl::kReference;
  KRAUSE_ASSERT_OK_AND_ASSIGN(KrauseResult want, KrauseAttention(q, k, v, ls, ref));
  KrauseOptions gpu = ref;
  gpu.impl = KrauseImpl::kCuda;
  const at::Device dev(at::kCUDA);
  KrauseResult got;
  {
    const ForceKernel force(kernel);
    KRAUSE_ASSERT_OK_AND_ASSIGN(got,
                                KrauseAttention(q.to(dev), k.to(dev), v.to(dev), ls.to(dev), gpu));
  }
  EXPECT_LE(RelativeMaxError(got.out.cpu(), want.out), 1e-5) << c.name;
  if (exact) {
    EXPECT_TRUE(at::equal(got.indices.cpu(), want.indices)) << c.name;
  }
  EXPECT_LE(RelativeMaxError(got.weights.cpu(), want.weights), 1e-5) << c.name;
  // kAuto picks the CUDA kernels for CUDA fp32 tensors without gradients, and of those the
  // warp kernel where a row fits it.
  const int64_t width = MaxCandidates(c.nb, c.n);
  const internal::CudaKernel automatic =
      width <= 256 ? internal::CudaKernel::kWarp : internal::CudaKernel::kBlock;
  // (Not when KRAUSE_CUDA_KERNEL steers kAuto: the device check re-runs the tests so.)
  if (kernel == automatic && std::getenv("KRAUSE_CUDA_KERNEL") == nullptr) {
    KrauseOptions autod = ref;
    autod.impl = KrauseImpl::kAuto;
    autod.return_selection = false;
    KRAUSE_ASSERT_OK_AND_ASSIGN(
        KrauseResult a, KrauseAttention(q.to(dev), k.to(dev), v.to(dev), ls.to(dev), autod));
    EXPECT_TRUE(at::equal(a.out, got.out)) << c.name;
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
      if (cases[i].top_k < 64 && MaxCandidates(cases[i].nb, cases[i].n) <= 128) {
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

INSTANTIATE_TEST_SUITE_P(Kernels, CudaDecode,
                         ::testing::Values(internal::CudaKernel::kBlock,
                                           internal::CudaKernel::kWarp),
                         [](const ::testing::TestParamInfo<internal::CudaKernel>& info) {
                           return std::string(KernelName(info.param));
                         });

}  // namespace
}  // namespace krause::testing
