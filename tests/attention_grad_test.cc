// Gradients of the windowed (training) implementation, including d/d log_sigma, against central
// finite differences in double precision, on small cases of every neighbourhood kind.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <vector>

#include "model/attention/krause_attention.h"
#include "tests/test_util.h"

namespace krause {
namespace {

struct GradCase {
  const char* name;
  Neighbourhood nb;
  int64_t n, top_k, heads;
  bool per_head_sigma;
  internal::GridRoute route = internal::GridRoute::kAuto;  // grids: both routes are tested
};

// A fixed random projection of the output to a scalar, so every output element matters.
at::Tensor Loss(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                const at::Tensor& log_sigma, const KrauseOptions& opts, const at::Tensor& proj) {
  auto r = KrauseAttention(q, k, v, log_sigma, opts);
  EXPECT_TRUE(r.ok()) << r.status();
  return (r->out * proj).sum();
}

void PrintTo(const GradCase& c, std::ostream* os) { *os << c.name; }

class AttentionGradTest : public ::testing::TestWithParam<GradCase> {};

TEST_P(AttentionGradTest, MatchesFiniteDifferences) {
  const GradCase& c = GetParam();
  at::Generator gen = at::detail::createCPUGenerator(77);
  const int64_t b = 2, d = 4;
  auto opts64 = at::TensorOptions().dtype(at::kDouble);
  at::Tensor q = at::normal(0, 0.7, {b, c.heads, c.n, d}, gen).to(at::kDouble);
  at::Tensor k = at::normal(0, 0.7, {b, c.heads, c.n, d}, gen).to(at::kDouble);
  at::Tensor v = at::normal(0, 1.0, {b, c.heads, c.n, d}, gen).to(at::kDouble);
  at::Tensor ls = c.per_head_sigma ? at::normal(0.2, 0.2, {c.heads, 1, 1}, gen).to(at::kDouble)
                                   : at::full({}, 0.3, opts64);
  const at::Tensor proj = at::normal(0, 1.0, {b, c.heads, c.n, d}, gen).to(at::kDouble);

  KrauseOptions opts;
  opts.neighbourhood = c.nb;
  opts.top_k = c.top_k;
  opts.impl = KrauseImpl::kWindowed;
  internal::SetGridRouteForTesting(c.route);

  std::vector<at::Tensor> params = {q, k, v, ls};
  for (auto& p : params) p.set_requires_grad(true);
  at::Tensor loss = Loss(params[0], params[1], params[2], params[3], opts, proj);
  loss.backward();

  const double eps = 1e-6;
  const char* names[] = {"q", "k", "v", "log_sigma"};
  for (size_t p = 0; p < params.size(); ++p) {
    SCOPED_TRACE(names[p]);
    const at::Tensor analytic = params[p].grad().clone();
    at::Tensor base = params[p].detach().clone();
    at::Tensor numeric = at::zeros_like(base);
    auto flat = base.view({-1});
    auto num_flat = numeric.view({-1});
    at::NoGradGuard no_grad;
    for (int64_t i = 0; i < flat.numel(); ++i) {
      std::vector<at::Tensor> plus = {q.detach(), k.detach(), v.detach(), ls.detach()};
      std::vector<at::Tensor> minus = plus;
      const double x = flat[i].item<double>();
      at::Tensor bp = base.clone(), bm = base.clone();
      bp.view({-1})[i] = x + eps;
      bm.view({-1})[i] = x - eps;
      plus[p] = bp;
      minus[p] = bm;
      const double lp = Loss(plus[0], plus[1], plus[2], plus[3], opts, proj).item<double>();
      const double lm = Loss(minus[0], minus[1], minus[2], minus[3], opts, proj).item<double>();
      num_flat[i] = (lp - lm) / (2 * eps);
    }
    const double err = (analytic - numeric).abs().max().item<double>();
    const double scale = std::max(1.0, numeric.abs().max().item<double>());
    EXPECT_LE(err / scale, 1e-6) << "analytic\n" << analytic << "\nnumeric\n" << numeric;
  }
  // With two or more kept keys log_sigma really receives a gradient (the comparison above would
  // be vacuous otherwise); with k = 1 the single weight is 1 and its gradient exactly 0.
  if (c.top_k >= 2) {
    EXPECT_GT(params[3].grad().abs().sum().item<double>(), 0.0);
  }
  internal::SetGridRouteForTesting(internal::GridRoute::kAuto);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, AttentionGradTest,
    ::testing::Values(
        GradCase{"causal_w3_k2", Neighbourhood::Causal(3), 7, 2, 2, true},
        GradCase{"causal_w4_k9", Neighbourhood::Causal(4), 6, 9, 1, false},
        GradCase{"causal_w2_k1", Neighbourhood::Causal(2), 5, 1, 2, false},
        // Two query blocks of 64, the second partial.
        GradCase{"causal_w3_k2_two_blocks", Neighbourhood::Causal(3), 70, 2, 1, false},
        GradCase{"grid_3x3_r1_cls", Neighbourhood::Grid(3, 3, 1, GridMetric::kManhattan, true), 10,
                 3, 2, false},
        GradCase{"grid_3x3_r1_cls_table",
                 Neighbourhood::Grid(3, 3, 1, GridMetric::kManhattan, true), 10, 3, 2, false,
                 internal::GridRoute::kCandidateTable},
        GradCase{"grid_3x3_r1_cls_dense_rows",
                 Neighbourhood::Grid(3, 3, 1, GridMetric::kManhattan, true), 10, 3, 2, false,
                 internal::GridRoute::kDenseRows},
        GradCase{"grid_2x3_r1_cheb", Neighbourhood::Grid(2, 3, 1, GridMetric::kChebyshev, false), 6,
                 4, 2, true},
        GradCase{"grid_2x3_r1_cheb_k9_table",
                 Neighbourhood::Grid(2, 3, 1, GridMetric::kChebyshev, false), 6, 9, 2, true,
                 internal::GridRoute::kCandidateTable},
        GradCase{"grid_2x3_r1_cheb_k9_dense_rows",
                 Neighbourhood::Grid(2, 3, 1, GridMetric::kChebyshev, false), 6, 9, 2, true,
                 internal::GridRoute::kDenseRows},
        GradCase{"global_k3", Neighbourhood::Global(), 6, 3, 1, true}),
    [](const ::testing::TestParamInfo<GradCase>& info) { return info.param.name; });

// The CPU training path (fused forward, hand-written backward) against the windowed path's
// autograd, in fp32: the same outputs, selections and gradients of q, k, v and log_sigma.
using ::krause::testing::RelativeMaxError;

struct TrainCase {
  const char* name;
  Neighbourhood nb;
  int64_t n, top_k, heads, d;
  bool per_head_sigma;
};

class FusedCpuTrainTest : public ::testing::TestWithParam<TrainCase> {};

TEST_P(FusedCpuTrainTest, GradientsMatchTheWindowedPath) {
  const TrainCase& c = GetParam();
  at::Generator gen = at::detail::createCPUGenerator(5);
  const int64_t b = 3;
  const at::Tensor q0 = at::normal(0, 0.7, {b, c.heads, c.n, c.d}, gen);
  const at::Tensor k0 = at::normal(0, 0.7, {b, c.heads, c.n, c.d}, gen);
  const at::Tensor v0 = at::normal(0, 1.0, {b, c.heads, c.n, c.d}, gen);
  const at::Tensor ls0 =
      c.per_head_sigma ? at::normal(0.2, 0.2, {c.heads, 1, 1}, gen) : at::full({}, 0.3);
  const at::Tensor proj = at::normal(0, 1.0, {b, c.heads, c.n, c.d}, gen);
  struct Grads {
    at::Tensor out, indices, dq, dk, dv, dls;
  };
  auto run = [&](KrauseImpl impl) {
    std::vector<at::Tensor> p = {q0.clone(), k0.clone(), v0.clone(), ls0.clone()};
    for (auto& t : p) t.set_requires_grad(true);
    KrauseOptions o;
    o.neighbourhood = c.nb;
    o.top_k = c.top_k;
    o.impl = impl;
    o.return_selection = true;
    auto r = KrauseAttention(p[0], p[1], p[2], p[3], o);
    EXPECT_TRUE(r.ok()) << r.status();
    (r->out * proj).sum().backward();
    return Grads{r->out.detach(), r->indices, p[0].grad(), p[1].grad(), p[2].grad(), p[3].grad()};
  };
  const Grads want = run(KrauseImpl::kWindowed);
  const Grads got = run(KrauseImpl::kFusedCpuTrain);
  EXPECT_LE(RelativeMaxError(got.out, want.out), 1e-5);
  EXPECT_TRUE(at::equal(got.indices, want.indices));
  EXPECT_LE(RelativeMaxError(got.dq, want.dq), 1e-4);
  EXPECT_LE(RelativeMaxError(got.dk, want.dk), 1e-4);
  EXPECT_LE(RelativeMaxError(got.dv, want.dv), 1e-4);
  ASSERT_EQ(got.dls.sizes(), want.dls.sizes());
  EXPECT_LE(RelativeMaxError(got.dls, want.dls), 1e-4);
  EXPECT_GT(want.dls.abs().sum().item<double>(), 0.0);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, FusedCpuTrainTest,
    ::testing::Values(
        TrainCase{"causal_w56_k40_three_blocks", Neighbourhood::Causal(56), 150, 40, 2, 16, true},
        TrainCase{"causal_w8_k3_shared_sigma", Neighbourhood::Causal(8), 20, 3, 3, 8, false},
        TrainCase{"causal_k_over_window", Neighbourhood::Causal(4), 9, 7, 1, 4, true},
        TrainCase{"grid_7x7_r1_cls", Neighbourhood::Grid(7, 7, 1, GridMetric::kChebyshev, true), 50,
                  3, 2, 16, true},
        TrainCase{"global_k5", Neighbourhood::Global(), 12, 5, 2, 8, false}),
    [](const ::testing::TestParamInfo<TrainCase>& info) { return info.param.name; });

}  // namespace
}  // namespace krause
