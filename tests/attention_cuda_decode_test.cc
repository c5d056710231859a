// GPU parity (ctest label gpu) of the CUDA decode step against the CPU decode step: across the
// ring wrap, distinct sigmas per head, head dimensions over 64, many sequences times heads,
// windows over 256, and bf16 / fp16 caches (on the rounded keys and values; fp16 saturating).
// Built only with KRAUSE_WITH_CUDA; every test skips without a device.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "attention_cuda_test.h"
#include "model/attention/decode.h"
#include "model/attention/krause_attention.h"
#include "test_util.h"

namespace krause::testing {
namespace {

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
