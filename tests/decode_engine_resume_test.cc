// The generation engine's resume guarantee (a completion from any prefix of an image is the
// uninterrupted image), and the sampler its draws rest on: guidance's logits, greedy, top-k and
// top-p draws, and the counter-based uniforms that make them deterministic.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <vector>

#include "model/engine/decode_engine.h"
#include "model/engine/sampling.h"
#include "tests/decode_engine_test.h"
#include "tests/test_util.h"

namespace krause {
namespace {

// The resume guarantee (docs/api.md, "Resuming a stream"): completing image i from any number of
// its first subpixels, with its seed and the same settings, gives the uninterrupted image byte for
// byte: for KARM and ARM, with and without a start token, conditional and guided, at several
// sampling settings; every prefix length of a 20-subpixel image whose window is 6 (prompts
// across the ring's wraps and longer than the window). It holds because a CPU prefill is the
// packed prefill, bit for bit the decode steps it replaces (cpu_decoder_test).
TEST(ResumeGuarantee, ACompletionFromAnyPrefixIsTheUninterruptedImage) {
  struct Case {
    const char* attention;
    bool start;
    int64_t classes;
    double guidance, temperature, top_p;
    int64_t top_k;
    at::ScalarType cache = at::kFloat;       // the KARM's rings: bf16 rings resume exactly too
    Precision precision = Precision::kFp32;  // bf16 (where the CPU has AMX) resumes exactly too
  };
  const Case cases[] = {
      {"krause", true, 0, 1.0, 1.0, 1.0, 0},
      {"krause", false, 0, 1.0, 0.9, 0.95, 0},
      {"softmax", true, 0, 1.0, 1.1, 1.0, 30},
      {"softmax", false, 0, 1.0, 1.0, 0.9, 0},
      {"krause", true, 3, 1.0, 1.0, 0.95, 0},
      {"krause", true, 3, 2.5, 1.0, 0.9, 0},
      {"softmax", true, 3, 1.5, 0.8, 1.0, 50},
      {"krause", true, 0, 1.0, 0.0, 1.0, 0},
      {"krause", false, 0, 1.0, 0.9, 0.95, 0, at::kBFloat16},
      {"krause", true, 3, 2.5, 1.0, 0.9, 0, at::kBFloat16},
      {"krause", true, 3, 2.5, 1.0, 0.9, 0, at::kFloat, Precision::kBf16},
      {"softmax", false, 0, 1.0, 1.0, 0.9, 0, at::kFloat, Precision::kBf16},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message()
                 << c.attention << (c.start ? " start" : " no start") << " classes " << c.classes
                 << " guidance " << c.guidance << " temperature " << c.temperature << " cache "
                 << c10::toString(c.cache) << " " << PrecisionName(c.precision));
    PixelModelConfig config = TinyConfig(c.attention, c.start);
    config.classes = c.classes;
    KRAUSE_ASSERT_OK_AND_ASSIGN(PixelModel m, PixelModel::Create(config, 11));
    if (c.classes > 0) {
      at::NoGradGuard no_grad;
      m.parameters().Get("class_emb.weight").mul_(40);
    }
    EngineOptions o;
    o.max_sequences = 128;
    o.cache_dtype = c.cache;
    o.precision = c.precision;
    KRAUSE_ASSERT_OK_AND_ASSIGN(auto engine, DecodeEngine::Create(&m, o));
    const auto request = [&](int64_t i, std::vector<uint8_t> prompt) {
      GenerationRequest r;
      r.prompt = std::move(prompt);
      r.sampling.seed = 100 + i;
      r.sampling.temperature = c.temperature;
      r.sampling.top_p = c.top_p;
      r.sampling.top_k = c.top_k;
      if (c.classes > 0) {
        r.label = i % c.classes;
        r.guidance = c.guidance;
      }
      return r;
    };
    std::vector<std::vector<uint8_t>> images;
    for (int64_t i = 0; i < 3; ++i) ASSERT_TRUE(engine->Submit(request(i, {})).ok());
    for (auto& [id, f] : RunUntilIdle(engine.get())) {
      ASSERT_TRUE(f.status.ok()) << f.status;
      images.push_back(f.image);
    }
    const int64_t n = config.seq_len();
    std::map<int64_t, std::pair<int64_t, int64_t>> asked;  // request id -> (image, prefix)
    for (int64_t i = 0; i < 3; ++i) {
      for (int64_t k = 1; k < n; ++k) {
        const std::vector<uint8_t> prefix(images[i].begin(), images[i].begin() + k);
        KRAUSE_ASSERT_OK_AND_ASSIGN(const int64_t id, engine->Submit(request(i, prefix)));
        asked[id] = {i, k};
      }
    }
    int64_t checked = 0;
    for (auto& [id, f] : RunUntilIdle(engine.get())) {
      ASSERT_TRUE(f.status.ok()) << f.status;
      const auto [i, k] = asked.at(id);
      EXPECT_EQ(f.image, images[i]) << "image " << i << " resumed after " << k << " subpixels";
      ++checked;
    }
    EXPECT_EQ(checked, 3 * (n - 1));
  }
}

TEST(Sampling, GuideLogitsExtrapolatesFromTheUnconditionalLogits) {
  std::vector<float> c(256), u(256), out(256);
  for (int v = 0; v < 256; ++v) {
    c[v] = 0.25f * static_cast<float>(v % 7);
    u[v] = -0.5f * static_cast<float>(v % 3);
  }
  GuideLogits(c.data(), u.data(), 1.0, out.data());
  EXPECT_EQ(out, c);
  GuideLogits(c.data(), u.data(), 0.0, out.data());
  EXPECT_EQ(out, u);
  GuideLogits(c.data(), u.data(), 3.0, out.data());
  for (int v = 0; v < 256; ++v) EXPECT_FLOAT_EQ(out[v], u[v] + 3.0f * (c[v] - u[v])) << v;
}

TEST(Sampling, GreedyTopKTopPAndCounterDeterminism) {
  std::vector<float> logits(256, 0.0f);
  logits[7] = 10.0f;  // p(7) = 0.72, p(9) = 0.27, each other value 3e-5
  logits[9] = 9.0f;
  SamplingParams p;
  p.temperature = 0;
  EXPECT_EQ(SamplePixel(logits.data(), p, 0), 7);
  p.temperature = 1.0;
  p.top_k = 2;
  for (uint64_t i = 0; i < 200; ++i) {
    const uint8_t v = SamplePixel(logits.data(), p, i);
    EXPECT_TRUE(v == 7 || v == 9);
  }
  p.top_k = 0;
  p.top_p = 0.5;  // value 7 alone holds more than half the mass
  for (uint64_t i = 0; i < 50; ++i) EXPECT_EQ(SamplePixel(logits.data(), p, i), 7);
  EXPECT_EQ(CounterUniform(3, 17), CounterUniform(3, 17));
  EXPECT_NE(CounterUniform(3, 17), CounterUniform(3, 18));
  EXPECT_NE(CounterUniform(3, 17), CounterUniform(4, 17));
}

}  // namespace
}  // namespace krause
