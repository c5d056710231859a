// The one ranking rule for edge values (model/attention/score_order.h), which the CPU kernels
// and the CUDA kernels share: -0 equals +0, NaN ranks above every number, all NaNs are one score;
// every implementation keeps exactly min(k, |N(i)|) candidates, also in a row with NaN scores,
// and ranks them as LibTorch's sort does (the reference). And the fp16 ring rule (saturation).
#include "model/attention/score_order.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "model/attention/decode.h"
#include "model/attention/krause_attention.h"
#include "test_util.h"

namespace krause::testing {
namespace {

uint32_t KeyOf(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return ScoreKey(bits);
}

float FromBits(uint32_t bits) {
  float x;
  std::memcpy(&x, &bits, sizeof(x));
  return x;
}

TEST(ScoreKey, OrdersNumbersAsFloatsDo) {
  const float inf = std::numeric_limits<float>::infinity();
  const float tiny = std::numeric_limits<float>::denorm_min();
  // Ascending, no two equal.
  const std::vector<float> ascending = {-inf, -3e38f, -2.5f, -1.0f, -tiny, 0.0f,
                                        tiny, 1e-30f, 1.0f,  2.5f,  3e38f, inf};
  for (size_t i = 0; i + 1 < ascending.size(); ++i) {
    EXPECT_LT(KeyOf(ascending[i]), KeyOf(ascending[i + 1]))
        << ascending[i] << " vs " << ascending[i + 1];
  }
  // 0 is nobody's key (the CUDA kernels mark dropped candidates with it).
  EXPECT_GT(KeyOf(-inf), 0u);
}

TEST(ScoreKey, SignedZerosAreOneScore) {
  EXPECT_EQ(KeyOf(-0.0f), KeyOf(0.0f));
  EXPECT_LT(KeyOf(-std::numeric_limits<float>::denorm_min()), KeyOf(-0.0f));
  EXPECT_GT(KeyOf(std::numeric_limits<float>::denorm_min()), KeyOf(-0.0f));
}

TEST(ScoreKey, EveryNanRanksAboveInfinityAndNansTie) {
  const float inf = std::numeric_limits<float>::infinity();
  // Quiet and signalling, both signs, the all-ones pattern.
  for (const uint32_t bits : {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u, 0xffffffffu}) {
    const float nan = FromBits(bits);
    ASSERT_TRUE(std::isnan(nan));
    EXPECT_EQ(KeyOf(nan), 0xffffffffu) << std::hex << bits;
    EXPECT_GT(KeyOf(nan), KeyOf(inf)) << std::hex << bits;
  }
}

// q, k, v [1, 1, n, d] with quantised values; key row `nan_row` holds a NaN (its score is NaN in
// every row that has it as a candidate).
struct NanInputs {
  at::Tensor q, k, v;
};
NanInputs WithNanKey(int64_t n, int64_t d, int64_t nan_row) {
  at::Generator gen = at::detail::createCPUGenerator(5);
  NanInputs in{QuantizedTensor({1, 1, n, d}, 2, gen), QuantizedTensor({1, 1, n, d}, 2, gen),
               QuantizedTensor({1, 1, n, d}, 2, gen)};
  in.k[0][0][nan_row][1] = std::numeric_limits<float>::quiet_NaN();
  return in;
}

// A NaN score is kept first (it ranks above every number) and the row keeps exactly K: the same
// selection in the reference (LibTorch's sort), the windowed path and the fused CPU kernel, in
// rows that have the NaN key and rows that do not.
TEST(EdgeScores, ANanScoreRanksFirstAndTheRowKeepsExactlyK) {
  const int64_t n = 40, d = 8, nan_row = 10;
  const NanInputs in = WithNanKey(n, d, nan_row);
  const at::Tensor ls = at::full({1}, std::log(2.5f));
  // k 4 < W 8 (selection by the radix search) and k 2 of a global row (40 candidates).
  for (const auto& [nb, top_k] :
       std::vector<std::pair<Neighbourhood, int64_t>>{{Neighbourhood::Causal(8), 4},
                                                      {Neighbourhood::Global(), 2},
                                                      {Neighbourhood::Global(), 30}}) {
    SCOPED_TRACE(nb.ToString() + " k " + std::to_string(top_k));
    KrauseOptions o;
    o.neighbourhood = nb;
    o.top_k = top_k;
    o.return_selection = true;
    o.impl = KrauseImpl::kReference;
    KRAUSE_ASSERT_OK_AND_ASSIGN(KrauseResult want, KrauseAttention(in.q, in.k, in.v, ls, o));
    for (int64_t i = 0; i < n; ++i) {
      const at::Tensor row = want.indices[0][0][i];
      const int64_t candidates =
          nb.kind == Neighbourhood::Kind::kGlobal ? n : std::min<int64_t>(i + 1, 8);
      EXPECT_EQ(row.ge(0).sum().item<int64_t>(), std::min(top_k, candidates)) << "row " << i;
      const bool sees_nan =
          nb.kind == Neighbourhood::Kind::kGlobal || (i >= nan_row && i < nan_row + 8);
      if (sees_nan) {
        EXPECT_EQ(row[0].item<int64_t>(), nan_row) << "row " << i;
      }
    }
    for (const KrauseImpl impl : {KrauseImpl::kWindowed, KrauseImpl::kFusedCpu}) {
      SCOPED_TRACE(KrauseImplName(impl));
      o.impl = impl;
      KRAUSE_ASSERT_OK_AND_ASSIGN(KrauseResult got, KrauseAttention(in.q, in.k, in.v, ls, o));
      EXPECT_TRUE(at::equal(got.indices, want.indices));
      // Rows without the NaN key are ordinary numbers, equal to the reference's.
      const at::Tensor clean = at::isnan(want.out).any(-1).logical_not();
      EXPECT_TRUE(at::allclose(got.out.masked_select(clean.unsqueeze(-1)),
                               want.out.masked_select(clean.unsqueeze(-1)), 1e-5, 1e-6));
    }
  }
}

// The CPU decode step keeps exactly K with a NaN key in its window (it kept every candidate, and
// wrote past its K selection slots), the NaN key first.
TEST(EdgeScores, TheCpuDecodeStepKeepsExactlyKWithANanKey) {
  const int64_t n = 30, d = 8, nan_row = 5, window = 8, top_k = 3;
  const NanInputs in = WithNanKey(n, d, nan_row);
  const at::Tensor ls = at::full({1}, std::log(2.5f));
  KRAUSE_ASSERT_OK_AND_ASSIGN(KrauseRingCache cache, KrauseRingCache::Create(1, 1, d, window));
  const at::Tensor slot = at::zeros({1}, at::kLong);
  for (int64_t p = 0; p < n; ++p) {
    const at::Tensor pos = at::full({1}, p, at::kLong);
    auto row = [&](const at::Tensor& x) {
      return x[0].narrow(1, p, 1).transpose(0, 1).contiguous();
    };
    DecodeSelection sel;
    KRAUSE_ASSERT_OK_AND_ASSIGN(
        at::Tensor out,
        KrauseDecodeStep(row(in.q), row(in.k), row(in.v), ls, top_k, slot, pos, &cache, &sel));
    ASSERT_EQ(sel.indices.size(-1), top_k);
    EXPECT_EQ(sel.indices.ge(0).sum().item<int64_t>(), std::min<int64_t>(top_k, p + 1)) << p;
    if (p >= nan_row && p < nan_row + window) {
      EXPECT_EQ(sel.indices[0][0][0].item<int64_t>(), nan_row) << p;
    }
  }
}

TEST(RingRounding, HalfSaturatesAtTheLargestFiniteValueAndKeepsNan) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const at::Tensor x = at::tensor({1e5f, -1e5f, 70000.0f, 65504.0f, 1.5f, -2.25f, nan});
  const at::Tensor half = KrauseRingCache::Rounded(x, at::kHalf);
  EXPECT_EQ(half.scalar_type(), at::kHalf);
  const at::Tensor back = half.to(at::kFloat);
  EXPECT_FALSE(at::isinf(back).any().item<bool>());
  const std::vector<float> want = {65504.0f, -65504.0f, 65504.0f, 65504.0f, 1.5f, -2.25f};
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(back[i].item<float>(), want[i]) << i;
  EXPECT_TRUE(std::isnan(back[6].item<float>()));
  // bf16 and fp32: plain rounding (their range is fp32's).
  EXPECT_TRUE(at::equal(KrauseRingCache::Rounded(x, at::kBFloat16).to(at::kFloat).nan_to_num(),
                        x.to(at::kBFloat16).to(at::kFloat).nan_to_num()));
  EXPECT_TRUE(at::equal(KrauseRingCache::Rounded(x, at::kFloat).nan_to_num(), x.nan_to_num()));
}

}  // namespace
}  // namespace krause::testing
