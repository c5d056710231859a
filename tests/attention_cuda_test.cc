// GPU parity (ctest label gpu): the CUDA kernels against the reference, case by case, on a CUDA
// device. Built only with KRAUSE_WITH_CUDA; every test skips without a device.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <tuple>

#include "model/attention/krause_attention.h"
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
  };
}

class CudaParity : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(CudaParity, MatchesReference) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  const auto [index, exact] = GetParam();
  const Case c = Cases()[index];
  at::Generator gen = at::detail::createCPUGenerator(1234 + index);
  // exact: quantised inputs (scores exact in fp32, so kept sets and ranks must match exactly,
  // ties included); else Gaussian inputs within the tolerance.
  auto make = [&](at::IntArrayRef shape) {
    return exact ? QuantizedTensor(shape, 3, gen) : GaussianTensor(shape, 1.0, gen);
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
  KRAUSE_ASSERT_OK_AND_ASSIGN(KrauseResult got,
                              KrauseAttention(q.to(dev), k.to(dev), v.to(dev), ls.to(dev), gpu));
  EXPECT_LE(RelativeMaxError(got.out.cpu(), want.out), 1e-5) << c.name;
  if (exact) {
    EXPECT_TRUE(at::equal(got.indices.cpu(), want.indices)) << c.name;
  }
  EXPECT_LE(RelativeMaxError(got.weights.cpu(), want.weights), 1e-5) << c.name;
  // kAuto picks the CUDA kernels for CUDA fp32 tensors without gradients.
  KrauseOptions autod = ref;
  autod.impl = KrauseImpl::kAuto;
  autod.return_selection = false;
  KRAUSE_ASSERT_OK_AND_ASSIGN(KrauseResult a,
                              KrauseAttention(q.to(dev), k.to(dev), v.to(dev), ls.to(dev), autod));
  EXPECT_TRUE(at::equal(a.out, got.out)) << c.name;
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaParity,
                         ::testing::Combine(::testing::Range(0, 8), ::testing::Bool()));

}  // namespace
}  // namespace krause::testing
