// The bf16 precision (model/precision.h): oneDNN's bfloat16 linear layers (nn/dnnl_linear.h) and
// the classifier forward that uses them (CpuViT with Precision::kBf16).
//   - ToBf16 rounds as LibTorch rounds (nearest even; NaN, infinities, ties);
//   - a Bf16Linear is the exact product of the rounded operands up to fp32 accumulation, and a
//     row's bits do not depend on the other rows' values, the blocks' split or the call;
//   - the bf16 ViT forward is within bf16's tolerance of the reference (on the rounded weights),
//     with the same bits alone, in a batch and split within images;
//   - where this CPU (or ONEDNN_MAX_CPU_ISA) offers no AMX, the model falls back to
//     fp32 and says why, and serves the fp32 forward's bits of the rounded weights.
// ctest runs it three times: as the CPU is, and with ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16 and
// =AVX2 (bf16 instructions without AMX, and none: both the fp32 fallback).
#include "model/precision.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "model/nn/dnnl_linear.h"
#include "model/vit_cpu.h"
#include "tests/test_util.h"

namespace krause {
namespace {

TEST(Precision, NamesParseBothWays) {
  for (Precision p : {Precision::kFp32, Precision::kBf16}) {
    KRAUSE_ASSERT_OK_AND_ASSIGN(Precision q, ParsePrecision(PrecisionName(p), "precision"));
    EXPECT_EQ(p, q);
  }
  const auto bad = ParsePrecision("fp16", "models[0].precision");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "models[0].precision must be fp32 or bf16, got \"fp16\"");
}

TEST(ToBf16, RoundsAsLibTorchRounds) {
  std::vector<float> x = {0.0f,
                          -0.0f,
                          1.0f,
                          -1.5f,
                          3.14159f,
                          1e-40f,
                          65504.0f,
                          3.4e38f,
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity()};
  // Ties: the 17th bit set, the rest of the low half zero (round to even either way).
  for (uint32_t bits : {0x3f808000u, 0x3f818000u, 0xbf808000u, 0x3f80ffffu, 0x3f807fffu}) {
    float f;
    std::memcpy(&f, &bits, sizeof(f));
    x.push_back(f);
  }
  const at::Tensor r = at::randn({1000}) * 100;
  for (int64_t i = 0; i < r.numel(); ++i) x.push_back(r[i].item<float>());  // > 16: vector path
  std::vector<uint16_t> got(x.size());
  nn::ToBf16(x.data(), static_cast<int64_t>(x.size()), got.data());
  const at::Tensor want = at::from_blob(x.data(), {static_cast<int64_t>(x.size())}, at::kFloat)
                              .to(at::kBFloat16)
                              .contiguous();
  const auto* w = reinterpret_cast<const uint16_t*>(want.data_ptr());
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(got[i], w[i]) << "x = " << x[i];
  const float nan = std::numeric_limits<float>::quiet_NaN();
  uint16_t h = 0;
  nn::ToBf16(&nan, 1, &h);
  EXPECT_EQ(h, 0x7fc0);
}

at::Tensor Widened(const at::Tensor& t) { return t.to(at::kBFloat16).to(at::kDouble); }

TEST(Bf16Linear, IsTheRoundedProductAndARowsBitsDependOnItsOwnInputsOnly) {
  if (!nn::Bf16MatmulSupport().available) {
    EXPECT_FALSE(nn::Bf16MatmulSupport().why.empty());
    auto refused = nn::Bf16Linear::Create(nullptr, nullptr, 4, 4, 4, 4);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
    GTEST_SKIP() << nn::Bf16MatmulSupport().why;
  }
  at::manual_seed(5);
  // Rows: one block, two blocks (the last shorter), three; widths dense and padded.
  for (auto [rows, in, out, stride] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{1, 7, 5, 16},
                                       {50, 64, 192, 192},
                                       {197, 384, 64, 64},
                                       {300, 96, 40, 48}}) {
    SCOPED_TRACE(::testing::Message() << "rows " << rows << " in " << in << " out " << out);
    const at::Tensor w = at::randn({out, in}), b = at::randn({out});
    KRAUSE_ASSERT_OK_AND_ASSIGN(
        nn::Bf16Linear l,
        nn::Bf16Linear::Create(w.data_ptr<float>(), b.data_ptr<float>(), out, in, rows, stride));
    at::Tensor x = at::randn({rows, in});
    std::vector<uint16_t> xb(rows * in);
    nn::ToBf16(x.data_ptr<float>(), rows * in, xb.data());
    std::vector<float> got(rows * stride, 0.0f);
    l.Apply(xb.data(), got.data());
    const at::Tensor exact =
        at::linear(Widened(x), Widened(w), b.to(at::kDouble));  // [rows, out] in double
    double worst = 0;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < out; ++j)
        worst = std::max(worst, std::abs(got[r * stride + j] - exact[r][j].item<double>()));
    EXPECT_LE(worst, 1e-4 * std::sqrt(static_cast<double>(in)) * 10);
    // Block by block, in any order: the same bits.
    std::vector<float> blocks(rows * stride, 0.0f);
    for (int64_t blk = l.blocks() - 1; blk >= 0; --blk)
      l.Apply(xb.data(), blocks.data(), blk, blk + 1);
    EXPECT_EQ(std::memcmp(blocks.data(), got.data(), got.size() * sizeof(float)), 0);
    // Other rows' inputs changed: row 0's bits stay.
    if (rows > 1) {
      std::vector<uint16_t> other = xb;
      for (int64_t i = in; i < rows * in; ++i) other[i] ^= 0x0101;
      std::vector<float> again(rows * stride, 0.0f);
      l.Apply(other.data(), again.data());
      EXPECT_EQ(std::memcmp(again.data(), got.data(), out * sizeof(float)), 0);
    }
  }
}

ViTConfig SmallConfig(AttentionKind attention) {
  ViTConfig cfg;
  cfg.attention = attention;
  cfg.image_size = 16;
  cfg.patch = 4;  // 16 patches + CLS
  cfg.channels = 3;
  cfg.d_model = 64;
  cfg.heads = 2;
  cfg.depth = 2;
  cfg.mlp = 128;
  cfg.classes = 10;
  cfg.radius = 1;
  cfg.top_k = 3;
  cfg.mean = {0.4, 0.5, 0.6};
  cfg.std = {0.2, 0.25, 0.3};
  return cfg;
}

at::Tensor Forward(const CpuViT& p, const at::Tensor& pixels, CpuViT::Split split) {
  at::Tensor out = at::empty({pixels.size(0), p.classes()});
  const absl::Status st = p.Forward(pixels.contiguous().data_ptr<uint8_t>(), pixels.size(0),
                                    out.data_ptr<float>(), split);
  EXPECT_TRUE(st.ok()) << st;
  return out;
}

TEST(CpuViTBf16, IsCloseToTheReferenceBatchInvariantOrFallsBackToFp32) {
  for (AttentionKind kind : {AttentionKind::kKrause, AttentionKind::kSoftmax}) {
    SCOPED_TRACE(AttentionKindName(kind));
    KRAUSE_ASSERT_OK_AND_ASSIGN(ViT m, ViT::Create(SmallConfig(kind), 3));
    // bf16 serves the rounded weights (the manifest's precision rounds them at load).
    ASSERT_TRUE(m.parameters().RoundLinear(at::kBFloat16).ok());
    KRAUSE_ASSERT_OK_AND_ASSIGN(auto bf16, CpuViT::Create(m, Precision::kBf16));
    const at::Tensor pixels = at::randint(0, 256, {6, 3, 16, 16}, at::kByte);
    const int threads = at::get_num_threads();
    at::set_num_threads(2);
    const at::Tensor got = Forward(*bf16, pixels, CpuViT::Split::kAuto);
    EXPECT_TRUE(at::equal(Forward(*bf16, pixels, CpuViT::Split::kWithinImage), got));
    EXPECT_TRUE(at::equal(Forward(*bf16, pixels, CpuViT::Split::kImages), got));
    for (int64_t i : {0, 5}) {
      EXPECT_TRUE(at::equal(Forward(*bf16, pixels.narrow(0, i, 1), CpuViT::Split::kAuto),
                            got.narrow(0, i, 1)))
          << i;
    }
    at::set_num_threads(threads);
    if (!nn::Bf16MatmulSupport().available) {
      EXPECT_EQ(bf16->precision(), Precision::kFp32);
      EXPECT_EQ(bf16->fallback(), nn::Bf16MatmulSupport().why);
      KRAUSE_ASSERT_OK_AND_ASSIGN(auto fp32, CpuViT::Create(m));
      EXPECT_TRUE(at::equal(got, Forward(*fp32, pixels, CpuViT::Split::kAuto)));
      continue;
    }
    EXPECT_EQ(bf16->precision(), Precision::kBf16);
    EXPECT_TRUE(bf16->fallback().empty());
    EXPECT_NE(bf16->linear_kernels().find("onednn"), std::string::npos);
    at::NoGradGuard no_grad;
    const at::Tensor want = at::softmax(m.Forward(NormalizePixels(m.config(), pixels)), -1);
    // bf16 activations: about 3 significant digits per product, fp32 sums.
    EXPECT_LE((got - want).abs().max().item<double>(), 2e-2);
    EXPECT_TRUE(at::equal(got.argmax(1), want.argmax(1)));
  }
}

}  // namespace
}  // namespace krause
