// GPU serving paths (ctest label gpu): the generators' decode engine and scoring with the model on
// a CUDA device, against the same model on the CPU. Built only with KRAUSE_WITH_CUDA; every test
// skips without a device.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "model/engine/decode_engine.h"
#include "model/engine/kv_cache.h"
#include "model/karm.h"

namespace krause::testing {
namespace {

ArmConfig SmallArm(const std::string& attention) {
  ArmConfig c;
  c.attention = attention;
  c.height = 8;
  c.width_px = 8;
  c.channels = 3;  // 192 subpixels: the KARM ring (W 32) wraps several times
  c.width = 32;
  c.depth = 2;
  c.heads = 2;
  c.window = 32;
  c.top_k = 12;
  return c;
}

// The same weights on the CPU and on the GPU.
struct Pair {
  Arm cpu, gpu;
};

Pair MakePair(const std::string& attention) {
  Arm cpu = Arm::Create(SmallArm(attention), 7).value();
  Arm gpu = Arm::Create(SmallArm(attention), 7).value();
  gpu.parameters().To(at::Device(at::kCUDA));
  return {std::move(cpu), std::move(gpu)};
}

class EngineCuda : public ::testing::TestWithParam<std::string> {};

// Teacher-forced incremental decoding: prefill prompts of different lengths into different slots,
// then decode steps over all sequences at once; the GPU logits follow the CPU's.
TEST_P(EngineCuda, PrefillAndDecodeStepsMatchTheCpu) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  Pair m = MakePair(GetParam());
  const ArmConfig& c = m.cpu.config();
  const int64_t n = c.seq_len(), seqs = 3;
  auto cpu_cache = ArmKvCache::Create(c, 4).value();
  auto gpu_cache = ArmKvCache::Create(c, 4, at::Device(at::kCUDA)).value();
  at::manual_seed(11);
  const at::Tensor tokens = at::randint(0, 256, {seqs, n}, at::kLong);
  const std::vector<int64_t> prefix = {1, 5, 40}, slot = {3, 0, 2};
  for (int64_t s = 0; s < seqs; ++s) {
    const at::Tensor u = tokens[s].narrow(0, 0, prefix[s]);
    const at::Tensor a = m.cpu.Prefill(u, slot[s], &cpu_cache);
    const at::Tensor b = m.gpu.Prefill(u, slot[s], &gpu_cache).cpu();
    EXPECT_TRUE(at::allclose(a, b, 1e-4, 1e-4)) << "prefill " << s;
  }
  double worst = 0;
  for (int64_t step = 0; step + prefix.back() < n; ++step) {
    std::vector<int64_t> u(seqs), pos(seqs);
    for (int64_t s = 0; s < seqs; ++s) {
      pos[s] = prefix[s] + step;
      u[s] = tokens[s][pos[s]].item<int64_t>();
    }
    const at::Tensor ut = at::tensor(u, at::kLong), pt = at::tensor(pos, at::kLong),
                     st = at::tensor(slot, at::kLong);
    const at::Tensor a = m.cpu.DecodeStep(ut, pt, st, &cpu_cache);
    const at::Tensor b = m.gpu.DecodeStep(ut, pt, st, &gpu_cache);
    ASSERT_TRUE(b.is_cuda());
    worst = std::max(worst, (a - b.cpu()).abs().max().item<double>());
  }
  EXPECT_LT(worst, 1e-3) << "largest logit difference over all steps";
}

// The engine on the GPU: images come out whole, prompts are kept, the same requests give the
// same images again, and every slot is free at the end.
TEST_P(EngineCuda, EngineGeneratesReproduciblyAndFreesSlots) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  Pair m = MakePair(GetParam());
  const int64_t n = m.gpu.config().seq_len();
  auto run = [&](int64_t requests) {
    auto engine = DecodeEngine::Create(&m.gpu, EngineOptions{4, 0}).value();
    EXPECT_TRUE(engine->device().is_cuda());
    std::vector<std::vector<uint8_t>> images(requests);
    for (int64_t i = 0; i < requests; ++i) {
      GenerationRequest r;
      r.sampling.seed = 100 + i;
      if (i % 2 == 1) r.prompt = std::vector<uint8_t>(10, static_cast<uint8_t>(i));
      r.on_done = [&images, i](absl::Status st, std::vector<uint8_t> px) {
        EXPECT_TRUE(st.ok()) << st;
        images[i] = std::move(px);
      };
      EXPECT_TRUE(engine->Submit(std::move(r)).ok());
    }
    while (engine->Busy()) engine->Step();
    EXPECT_EQ(engine->pool().in_use(), 0);
    return images;
  };
  const auto first = run(6), second = run(6);
  for (int64_t i = 0; i < 6; ++i) {
    ASSERT_EQ(static_cast<int64_t>(first[i].size()), n) << i;
    EXPECT_EQ(first[i], second[i]) << "request " << i;
    if (i % 2 == 1) {
      EXPECT_EQ(std::vector<uint8_t>(first[i].begin(), first[i].begin() + 10),
                std::vector<uint8_t>(10, static_cast<uint8_t>(i)));
    }
  }
}

TEST_P(EngineCuda, ScoringMatchesTheCpu) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  Pair m = MakePair(GetParam());
  at::manual_seed(5);
  const at::Tensor images = at::randint(0, 256, {3, m.cpu.config().seq_len()}, at::kLong);
  const auto a = ScoreBitsPerDim(m.cpu, images).value();
  const auto b = ScoreBitsPerDim(m.gpu, images).value();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-4 * a[i]) << i;
}

INSTANTIATE_TEST_SUITE_P(Models, EngineCuda, ::testing::Values("krause", "softmax"));

}  // namespace
}  // namespace krause::testing
