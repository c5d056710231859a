// The CPU kernels alone and the sampler's fast ranking: GELU against the erf formula in every
// variant; bfloat16 linear weights give the fp32 kernels' bits on the rounded weights at odd
// shapes; the AVX-512 variant gives the AVX2 variant's bits; SamplePixel draws exactly what
// SamplePixelReference draws.
#include "model/attention/cpu_kernels.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "model/engine/sampling.h"
#include "model/nn/packed.h"
#include "tests/test_util.h"

namespace krause {
namespace {

TEST(CpuKernels, GeluMatchesTheErfFormulaInEveryVariant) {
  // Lengths with and without a tail of fewer than 8; values across the whole useful range.
  for (int v = 0; v < cpu::NumCpuKernelVariants(); ++v) {
    ASSERT_TRUE(cpu::SetCpuKernelsForTesting(cpu::CpuKernelVariantName(v)));
    for (int64_t n : {1, 7, 8, 13, 128, 1027}) {
      std::vector<float> x(n), y(n);
      for (int64_t i = 0; i < n; ++i) x[i] = -12.0f + 24.0f * static_cast<float>(i) / n;
      cpu::CpuKernels().gelu(x.data(), n, y.data());
      for (int64_t i = 0; i < n; ++i) {
        const double want = 0.5 * x[i] * (1.0 + std::erf(x[i] / std::sqrt(2.0)));
        ASSERT_NEAR(y[i], want, 2e-6 * std::max(1.0, std::abs(static_cast<double>(x[i]))))
            << cpu::CpuKernelVariantName(v) << " x " << x[i];
      }
    }
  }
  cpu::SetCpuKernelsForTesting(nullptr);
}

TEST(CpuKernels, Bf16LinearWeightsGiveTheFp32KernelsBitsOnTheRoundedWeights) {
  // Row counts through every row group (6, 4, 1) and tail; widths with a padded last chunk.
  at::manual_seed(9);
  for (int64_t in : {1, 7, 48, 129}) {
    for (int64_t out : {5, 16, 33}) {
      const at::Tensor w = at::randn({out, in}) * 0.3, b = at::randn({out});
      const at::Tensor rounded = w.to(at::kBFloat16).to(at::kFloat);
      const nn::PackedLinear half = nn::PackLinear({w}, {b}, cpu::Elem::kBFloat16);
      const nn::PackedLinear full = nn::PackLinear({rounded}, {b});
      ASSERT_TRUE(half.wt.empty());
      ASSERT_EQ(half.wt16.size(), full.wt.size());
      for (int v = 0; v < cpu::NumCpuKernelVariants(); ++v) {
        ASSERT_TRUE(cpu::SetCpuKernelsForTesting(cpu::CpuKernelVariantName(v)));
        for (int64_t rows : {1, 3, 4, 6, 11, 13}) {
          SCOPED_TRACE(::testing::Message() << cpu::CpuKernelVariantName(v) << " in " << in
                                            << " out " << out << " rows " << rows);
          const at::Tensor x = at::randn({rows, in});
          std::vector<float> got(rows * half.out_pad), want(rows * full.out_pad);
          half.Apply(x.data_ptr<float>(), rows, got.data());
          full.Apply(x.data_ptr<float>(), rows, want.data());
          ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
          // And it is the layer: within fp32 rounding of x W^T + b in double.
          const at::Tensor exact =
              at::linear(x.to(at::kDouble), rounded.to(at::kDouble), b.to(at::kDouble));
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t j = 0; j < out; ++j)
              ASSERT_NEAR(got[r * half.out_pad + j], exact[r][j].item<double>(), 1e-4);
        }
      }
    }
  }
  cpu::SetCpuKernelsForTesting(nullptr);
}

// The avx512 variant (512-bit linear tiles, 16-wide GELU) gives the avx2 variant's bits: the same
// multiply-adds in the same order per element. Linear rows through every tile (12, 4, 1 rows; two
// chunks and one), fp32 and bf16 weights; GELU; the table prefill and the dense softmax.
TEST(CpuKernels, TheAvx512VariantGivesTheAvx2VariantsBits) {
  if (cpu::NumCpuKernelVariants() < 3) GTEST_SKIP() << "this CPU or build has no avx512 variant";
  ASSERT_STREQ(cpu::CpuKernelVariantName(1), "avx2");
  ASSERT_STREQ(cpu::CpuKernelVariantName(2), "avx512");
  at::manual_seed(11);
  // What `run` writes under each variant, compared bit for bit.
  auto same = [](const std::function<std::vector<float>()>& run) {
    std::vector<float> got[2];
    for (int v : {1, 2}) {
      EXPECT_TRUE(cpu::SetCpuKernelsForTesting(cpu::CpuKernelVariantName(v)));
      got[v - 1] = run();
    }
    cpu::SetCpuKernelsForTesting(nullptr);
    return got[0].size() == got[1].size() &&
           std::memcmp(got[0].data(), got[1].data(), got[0].size() * sizeof(float)) == 0;
  };
  for (int64_t in : {1, 7, 48, 129, 384}) {
    for (int64_t out : {5, 16, 33, 48, 80}) {
      const at::Tensor w = at::randn({out, in}) * 0.3, b = at::randn({out});
      for (cpu::Elem elem : {cpu::Elem::kFloat32, cpu::Elem::kBFloat16}) {
        const nn::PackedLinear l = nn::PackLinear({w}, {b}, elem);
        for (int64_t rows : {1, 3, 4, 11, 12, 13, 17, 29}) {
          const at::Tensor x = at::randn({rows, in});
          EXPECT_TRUE(same([&] {
            std::vector<float> o(rows * l.out_pad);
            l.Apply(x.data_ptr<float>(), rows, o.data());
            // and a chunk range that starts on an odd chunk
            if (l.chunks() > 2) l.Apply(x.data_ptr<float>(), rows, o.data(), 1, l.chunks());
            return o;
          })) << "in "
              << in << " out " << out << " rows " << rows << " bf16 "
              << (elem == cpu::Elem::kBFloat16);
        }
      }
    }
  }
  for (int64_t n : {1, 8, 15, 16, 17, 40, 1027}) {
    const at::Tensor x = at::randn({n}) * 4;
    EXPECT_TRUE(same([&] {
      std::vector<float> y(n);
      cpu::CpuKernels().gelu(x.data_ptr<float>(), n, y.data());
      return y;
    })) << "gelu n "
        << n;
  }
  // Dense (not causal) softmax attention over n keys.
  for (int64_t n : {5, 50, 197}) {
    const int64_t d = 64, stride = cpu::RoundUpToChunk(n);
    const at::Tensor q = at::randn({n, d}), k = at::randn({n, d}), v = at::randn({n, d});
    at::Tensor kt = at::zeros({d, stride});
    kt.narrow(1, 0, n).copy_(k.t());
    EXPECT_TRUE(same([&] {
      std::vector<float> out(n * d), lse(n), scratch(cpu::SoftmaxScratchFloats(n));
      cpu::SoftmaxSlice s{};
      s.q = q.data_ptr<float>();
      s.k = k.data_ptr<float>();
      s.kt = kt.data_ptr<float>();
      s.v = v.data_ptr<float>();
      s.scale = 0.125f;
      s.n = n;
      s.d = d;
      s.stride = stride;
      s.out = out.data();
      s.lse = lse.data();
      s.causal = false;
      cpu::CpuKernels().softmax_forward(s, 0, n, scratch.data());
      return out;
    })) << "softmax n "
        << n;
  }
}

TEST(SamplePixel, DrawsWhatTheReferenceDraws) {
  std::mt19937 rng(3);
  std::vector<float> logits(256);
  int64_t cases = 0;
  for (int round = 0; round < 300; ++round) {
    // Logit families: spread, few distinct values (ties), signed zeros, one dominant value.
    for (int i = 0; i < 256; ++i) {
      switch (round % 4) {
        case 0:
          logits[i] = std::normal_distribution<float>(0, 3)(rng);
          break;
        case 1:
          logits[i] = static_cast<float>(static_cast<int>(rng() % 5) - 2);
          break;
        case 2:
          logits[i] = rng() % 2 ? 0.0f : -0.0f;
          if (rng() % 8 == 0) logits[i] = std::ldexp(1.0f, -(static_cast<int>(rng() % 30)));
          break;
        default:
          logits[i] = i == static_cast<int>(round % 256) ? 12.0f : -static_cast<float>(rng() % 7);
      }
    }
    for (double temperature : {0.0, 0.7, 1.0, 1.8}) {
      for (int64_t top_k : {0, 1, 5, 256}) {
        for (double top_p : {1.0, 0.9, 0.3}) {
          SamplingParams p;
          p.temperature = temperature;
          p.top_k = top_k;
          p.top_p = top_p;
          p.seed = rng();
          const uint64_t index = rng() % 784;
          ASSERT_EQ(SamplePixel(logits.data(), p, index),
                    SamplePixelReference(logits.data(), p, index))
              << "round " << round << " T " << temperature << " k " << top_k << " p " << top_p;
          ++cases;
        }
      }
    }
  }
  EXPECT_EQ(cases, 300 * 4 * 4 * 3);
}

}  // namespace
}  // namespace krause
