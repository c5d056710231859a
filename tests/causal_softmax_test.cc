// The fused CPU path of causal softmax attention (the ARM's training path) against the LibTorch
// reference: outputs and the gradients of q, k and v, per kernel variant, on shapes that cover a
// single position, tails of the 4-query groups and the 16-key score chunks, head dims that are
// and are not multiples of 8, and the bundled ARM's 784 positions. The reference is run in double
// precision, so the comparison also bounds the fused path's fp32 rounding.
#include "model/attention/causal_softmax.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <string>

#include "model/attention/cpu_kernels.h"

namespace krause {
namespace {

struct Shape {
  int64_t b, h, n, d;
};

class CausalSoftmaxTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    ASSERT_TRUE(cpu::SetCpuKernelsForTesting(cpu::CpuKernelVariantName(GetParam())));
  }
  void TearDown() override { cpu::SetCpuKernelsForTesting(nullptr); }
};

// max |a - b| / (1 + max |b|)
double RelErr(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor bd = b.to(at::kDouble);
  return (a.to(at::kDouble) - bd).abs().max().item<double>() / (1 + bd.abs().max().item<double>());
}

TEST_P(CausalSoftmaxTest, FusedMatchesReferenceOutputsAndGradients) {
  const Shape shapes[] = {{1, 1, 1, 1},  {1, 1, 2, 3},  {2, 3, 5, 4},    {1, 2, 17, 16},
                          {2, 1, 33, 5}, {1, 1, 64, 8}, {3, 2, 100, 16}, {1, 2, 784, 16}};
  for (const Shape& s : shapes) {
    SCOPED_TRACE(testing::Message() << "B " << s.b << " H " << s.h << " N " << s.n << " d " << s.d);
    at::Generator gen = at::detail::createCPUGenerator(11 + s.n);
    // Scores spread over several units, so the softmax is far from uniform.
    const at::Tensor q0 = at::normal(0, 1.5, {s.b, s.h, s.n, s.d}, gen);
    const at::Tensor k0 = at::normal(0, 1.5, {s.b, s.h, s.n, s.d}, gen);
    const at::Tensor v0 = at::normal(0, 1.0, {s.b, s.h, s.n, s.d}, gen);
    const at::Tensor proj = at::normal(0, 1.0, {s.b, s.h, s.n, s.d}, gen);

    std::vector<at::Tensor> fused = {q0.clone(), k0.clone(), v0.clone()};
    std::vector<at::Tensor> ref = {q0.to(at::kDouble), k0.to(at::kDouble), v0.to(at::kDouble)};
    for (auto* set : {&fused, &ref})
      for (at::Tensor& t : *set) t.set_requires_grad(true);
    auto out_f = CausalSoftmaxAttention(fused[0], fused[1], fused[2], KrauseImpl::kFusedCpuTrain);
    auto out_r = CausalSoftmaxAttention(ref[0], ref[1], ref[2], KrauseImpl::kReference);
    ASSERT_TRUE(out_f.ok()) << out_f.status();
    ASSERT_TRUE(out_r.ok()) << out_r.status();
    EXPECT_LT(RelErr(*out_f, *out_r), 2e-6);
    (*out_f * proj).sum().backward();
    (*out_r * proj.to(at::kDouble)).sum().backward();
    const char* names[] = {"q", "k", "v"};
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(fused[i].grad().defined()) << names[i];
      EXPECT_LT(RelErr(fused[i].grad(), ref[i].grad()), 2e-5) << "d" << names[i];
    }
  }
}

// The heads split off a [B, N, H * d] projection are strided views; the fused path takes them as
// they come and gives the contiguous inputs' results bit for bit.
TEST_P(CausalSoftmaxTest, StridedInputsGiveTheContiguousResult) {
  at::Generator gen = at::detail::createCPUGenerator(5);
  const at::Tensor x = at::normal(0, 1, {2, 21, 3 * 2 * 8}, gen);
  auto heads = [&](int64_t part) {
    return x.narrow(2, part * 16, 16).view({2, 21, 2, 8}).transpose(1, 2);  // [B, H, N, d]
  };
  const at::Tensor q = heads(0), k = heads(1), v = heads(2);
  ASSERT_FALSE(q.is_contiguous());
  auto strided = CausalSoftmaxAttention(q, k, v, KrauseImpl::kFusedCpuTrain);
  auto dense = CausalSoftmaxAttention(q.contiguous(), k.contiguous(), v.contiguous(),
                                      KrauseImpl::kFusedCpuTrain);
  ASSERT_TRUE(strided.ok() && dense.ok());
  EXPECT_TRUE(at::equal(*strided, *dense));
}

INSTANTIATE_TEST_SUITE_P(Variants, CausalSoftmaxTest,
                         ::testing::Range(0, cpu::NumCpuKernelVariants()),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return std::string(cpu::CpuKernelVariantName(i.param));
                         });

TEST(CausalSoftmaxRouteTest, AutoFusesOnlyFp32CpuTraining) {
  EXPECT_EQ(*ChooseSoftmaxRoute(KrauseImpl::kAuto, true, true), SoftmaxRoute::kFusedCpu);
  EXPECT_EQ(*ChooseSoftmaxRoute(KrauseImpl::kAuto, true, false), SoftmaxRoute::kReference);
  EXPECT_EQ(*ChooseSoftmaxRoute(KrauseImpl::kAuto, false, true), SoftmaxRoute::kReference);
  EXPECT_EQ(*ChooseSoftmaxRoute(KrauseImpl::kReference, true, true), SoftmaxRoute::kReference);
  EXPECT_EQ(*ChooseSoftmaxRoute(KrauseImpl::kWindowed, true, true), SoftmaxRoute::kReference);
  EXPECT_EQ(*ChooseSoftmaxRoute(KrauseImpl::kFusedCpuTrain, true, false), SoftmaxRoute::kFusedCpu);
  const auto bad = ChooseSoftmaxRoute(KrauseImpl::kFusedCpuTrain, false, true);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("fp32 CPU"), std::string::npos) << bad.status();
}

TEST(CausalSoftmaxRouteTest, BadInputsAreInvalidArgumentNamingTheTensor) {
  const at::Tensor q = at::zeros({1, 2, 5, 4});
  auto wrong_shape = CausalSoftmaxAttention(q, at::zeros({1, 2, 6, 4}), q);
  ASSERT_FALSE(wrong_shape.ok());
  EXPECT_EQ(wrong_shape.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(wrong_shape.status().message().find("k has shape"), std::string::npos);
  auto wrong_rank = CausalSoftmaxAttention(q, q, at::zeros({2, 5, 4}));
  ASSERT_FALSE(wrong_rank.ok());
  EXPECT_NE(wrong_rank.status().message().find("v must be [B, H, N, d]"), std::string::npos);
  auto wrong_dtype = CausalSoftmaxAttention(q, q, q.to(at::kDouble));
  ASSERT_FALSE(wrong_dtype.ok());
  EXPECT_NE(wrong_dtype.status().message().find("v must have q's dtype"), std::string::npos);
  auto fused_double = CausalSoftmaxAttention(q.to(at::kDouble), q.to(at::kDouble),
                                             q.to(at::kDouble), KrauseImpl::kFusedCpuTrain);
  ASSERT_FALSE(fused_double.ok());
  EXPECT_EQ(fused_double.status().code(), absl::StatusCode::kInvalidArgument);
  auto empty = CausalSoftmaxAttention(at::zeros({1, 1, 0, 4}), at::zeros({1, 1, 0, 4}),
                                      at::zeros({1, 1, 0, 4}));
  ASSERT_FALSE(empty.ok());
}

}  // namespace
}  // namespace krause
