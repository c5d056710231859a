// Bad arguments give InvalidArgument naming the argument; nothing aborts.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "model/attention/krause_attention.h"
#include "tests/test_util.h"

namespace krause {
namespace {

using ::krause::testing::StatusIs;
using ::krause::testing::StatusOf;
using ::testing::HasSubstr;

KrauseOptions Causal(int64_t w, int64_t k, KrauseImpl impl = KrauseImpl::kAuto) {
  KrauseOptions o;
  o.neighbourhood = Neighbourhood::Causal(w);
  o.top_k = k;
  o.impl = impl;
  return o;
}

TEST(AttentionValidation, RejectsBadArgumentsByName) {
  const at::Tensor x = at::ones({1, 2, 5, 4});
  const at::Tensor ls = at::zeros({});
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  EXPECT_THAT(StatusOf(KrauseAttention(x, at::ones({1, 2, 6, 4}), x, ls, Causal(2, 1))),
              StatusIs(kInvalid, HasSubstr("k has shape [1, 2, 6, 4]")));
  EXPECT_THAT(StatusOf(KrauseAttention(x, x, at::ones({1, 2, 5, 3}), ls, Causal(2, 1))),
              StatusIs(kInvalid, HasSubstr("v has shape")));
  EXPECT_THAT(StatusOf(KrauseAttention(at::ones({2, 5, 4}), x, x, ls, Causal(2, 1))),
              StatusIs(kInvalid, HasSubstr("q must have shape [B, H, N, d]")));
  EXPECT_THAT(StatusOf(KrauseAttention(x, x, x, ls, Causal(2, 0))),
              StatusIs(kInvalid, HasSubstr("top_k must be >= 1, got 0")));
  EXPECT_THAT(StatusOf(KrauseAttention(x, x, x, ls, Causal(0, 1))),
              StatusIs(kInvalid, HasSubstr("neighbourhood.window must be >= 1")));
  EXPECT_THAT(StatusOf(KrauseAttention(x, x, x, at::full({}, INFINITY), Causal(2, 1))),
              StatusIs(kInvalid, HasSubstr("log_sigma must be finite")));
  EXPECT_THAT(StatusOf(KrauseAttention(x, x, x, at::full({}, NAN), Causal(2, 1))),
              StatusIs(kInvalid, HasSubstr("log_sigma must be finite")));
  EXPECT_THAT(StatusOf(KrauseAttention(x, x, x, at::full({}, -100.0f), Causal(2, 1))),
              StatusIs(kInvalid, HasSubstr("1/sigma^2")));
  EXPECT_THAT(StatusOf(KrauseAttention(x, x, x, at::zeros({3}), Causal(2, 1))),
              StatusIs(kInvalid, HasSubstr("log_sigma must hold 1 value (shared) or H = 2")));
  EXPECT_THAT(StatusOf(KrauseAttention(x, x, x.to(at::kDouble), ls, Causal(2, 1))),
              StatusIs(kInvalid, HasSubstr("v is Double")));
  EXPECT_THAT(
      StatusOf(KrauseAttention(x.to(at::kInt), x.to(at::kInt), x.to(at::kInt), ls, Causal(2, 1))),
      StatusIs(kInvalid, HasSubstr("q must be a floating-point tensor")));
  EXPECT_THAT(StatusOf(KrauseAttention(x.to(at::kDouble), x.to(at::kDouble), x.to(at::kDouble), ls,
                                       Causal(2, 1, KrauseImpl::kFusedCpu))),
              StatusIs(kInvalid, HasSubstr("fused_cpu needs fp32 CPU tensors")));
  // kCuda on CPU tensors: refused by name, whether or not the build has CUDA kernels.
  EXPECT_THAT(StatusOf(KrauseAttention(x, x, x, ls, Causal(2, 1, KrauseImpl::kCuda))),
              StatusIs(kInvalid, HasSubstr("impl cuda")));

  KrauseOptions grid;
  grid.neighbourhood = Neighbourhood::Grid(2, 2, 1, GridMetric::kManhattan, false);
  EXPECT_THAT(StatusOf(KrauseAttention(x, x, x, ls, grid)),
              StatusIs(kInvalid, HasSubstr("needs N = 4 tokens, but q/k/v have N = 5")));
  grid.neighbourhood = Neighbourhood::Grid(2, 2, -1, GridMetric::kManhattan, true);
  EXPECT_THAT(StatusOf(KrauseAttention(x, x, x, ls, grid)),
              StatusIs(kInvalid, HasSubstr("neighbourhood.radius")));
  grid.neighbourhood = Neighbourhood::Grid(0, 5, 1, GridMetric::kManhattan, false);
  EXPECT_THAT(StatusOf(KrauseAttention(x, x, x, ls, grid)),
              StatusIs(kInvalid, HasSubstr("neighbourhood.rows")));
  EXPECT_THAT(StatusOf(KrauseAttention(at::Tensor(), x, x, ls, Causal(2, 1))),
              StatusIs(kInvalid, HasSubstr("q is undefined")));
}

TEST(AttentionValidation, EmptyInputsGiveEmptyOutputs) {
  for (KrauseImpl impl : {KrauseImpl::kReference, KrauseImpl::kWindowed, KrauseImpl::kFusedCpu}) {
    KrauseOptions o = Causal(3, 2, impl);
    o.return_selection = true;
    auto r = KrauseAttention(at::ones({2, 1, 0, 4}), at::ones({2, 1, 0, 4}), at::ones({2, 1, 0, 4}),
                             at::zeros({}), o);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->out.sizes(), (std::vector<int64_t>{2, 1, 0, 4}));
  }
}

TEST(AttentionValidation, AutoPicksFusedForInferenceAndWindowedForTraining) {
  at::Tensor q = at::randn({1, 1, 6, 4});
  KrauseOptions o = Causal(3, 2);
  auto inference = KrauseAttention(q, q, q, at::zeros({}), o);
  ASSERT_TRUE(inference.ok());
  at::Tensor qg = q.clone().set_requires_grad(true);
  auto training = KrauseAttention(qg, qg, qg, at::zeros({}), o);
  ASSERT_TRUE(training.ok());
  EXPECT_TRUE(training->out.requires_grad());  // went through the differentiable path
  EXPECT_FALSE(inference->out.requires_grad());
  EXPECT_TRUE(at::allclose(training->out.detach(), inference->out, 1e-5, 1e-6));
}

}  // namespace
}  // namespace krause
