// The generation engine: batch invariance (same seeds, same images at batch sizes 1, 7 and 64
// and with sequences joining at different steps), completion prompts, cancellation, slot
// accounting under random join / cancel / finish events, validation and scoring.
// Class-conditional generation: decode_engine_conditional_test.cc; the resume guarantee and the
// sampler: decode_engine_resume_test.cc.
#include "model/engine/decode_engine.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "model/nn/dnnl_linear.h"
#include "tests/decode_engine_test.h"
#include "tests/test_util.h"

namespace krause {
namespace {

using ::krause::testing::StatusIs;
using ::testing::HasSubstr;

class EngineInvarianceTest : public ::testing::TestWithParam<std::pair<const char*, bool>> {};

// In every precision (bf16 where this CPU has AMX: its GEMMs' fixed 16-row blocks keep a row's
// bits whatever shares its block).
TEST_P(EngineInvarianceTest, SameSeedsGiveTheSameImagesAtAnyBatchSizeAndJoinStep) {
  KRAUSE_ASSERT_OK_AND_ASSIGN(
      PixelModel m, PixelModel::Create(TinyConfig(GetParam().first, GetParam().second), 5));
  const int64_t count = 64;
  std::vector<Precision> precisions = {Precision::kFp32};
  if (nn::Bf16MatmulSupport().available) precisions.push_back(Precision::kBf16);
  for (const Precision precision : precisions) {
    SCOPED_TRACE(PrecisionName(precision));
    const auto run = [&](int64_t slots, int64_t stagger) {
      return Generate(m, slots, count, stagger, nullptr, 1.0, at::kFloat, precision);
    };
    const std::vector<Outcome> alone = run(1, 0);
    const std::vector<Outcome> seven = run(7, 3);
    const std::vector<Outcome> all = run(64, 1);
    std::set<std::vector<uint8_t>> distinct;
    for (int64_t i = 0; i < count; ++i) {
      ASSERT_TRUE(alone[i].status.ok()) << alone[i].status;
      ASSERT_EQ(alone[i].pixels.size(), 20u);
      EXPECT_EQ(alone[i].done_calls, 1);
      EXPECT_EQ(alone[i].pixels, seven[i].pixels) << "seed " << i;
      EXPECT_EQ(alone[i].pixels, all[i].pixels) << "seed " << i;
      distinct.insert(alone[i].pixels);
    }
    EXPECT_GT(distinct.size(), 60u);  // seeds really differ
  }
}

INSTANTIATE_TEST_SUITE_P(Models, EngineInvarianceTest,
                         ::testing::Values(std::pair{"krause", true}, std::pair{"krause", false},
                                           std::pair{"softmax", true}),
                         [](const auto& info) {
                           return std::string(info.param.first) +
                                  (info.param.second ? "_start" : "_nostart");
                         });

TEST(DecodeEngine, CompletionKeepsThePromptAndStreamsTheRest) {
  KRAUSE_ASSERT_OK_AND_ASSIGN(PixelModel m, PixelModel::Create(TinyConfig("krause", true), 6));
  KRAUSE_ASSERT_OK_AND_ASSIGN(auto engine, DecodeEngine::Create(&m, EngineOptions{4, 0}));
  Router router(engine.get());
  const std::vector<uint8_t> prompt = {10, 20, 30, 40, 50, 60, 70};
  Outcome out;
  ASSERT_TRUE(router.Submit(Request(9, prompt), &out).ok());
  int steps = 0;
  while (engine->Busy()) {
    router.Step();
    ++steps;
  }
  ASSERT_TRUE(out.status.ok());
  EXPECT_EQ(steps, 20 - 7);  // one subpixel per step
  EXPECT_EQ(std::vector<uint8_t>(out.pixels.begin(), out.pixels.begin() + 7), prompt);
  EXPECT_EQ(std::vector<uint8_t>(out.pixels.begin() + 7, out.pixels.end()), out.streamed);
  // Greedy completion equals the argmax of the teacher-forced forward at every generated step.
  Outcome greedy;
  GenerationRequest r = Request(0, prompt);
  r.sampling.temperature = 0;
  ASSERT_TRUE(router.Submit(std::move(r), &greedy).ok());
  router.Drain();
  ASSERT_TRUE(greedy.status.ok());
  at::NoGradGuard no_grad;
  const at::Tensor x =
      at::tensor(std::vector<int64_t>(greedy.pixels.begin(), greedy.pixels.end()), at::kLong);
  const at::Tensor logits = m.Forward(x.narrow(0, 0, 19).view({1, 19}), KrauseImpl::kReference)[0];
  for (int64_t t = 7; t < 20; ++t)
    EXPECT_EQ(logits[t].argmax().item<int64_t>(), greedy.pixels[t]) << t;
}

TEST(DecodeEngine, CancelLeavesAtTheNextStepAndFreesTheSlot) {
  KRAUSE_ASSERT_OK_AND_ASSIGN(PixelModel m, PixelModel::Create(TinyConfig("krause", true), 7));
  KRAUSE_ASSERT_OK_AND_ASSIGN(auto engine, DecodeEngine::Create(&m, EngineOptions{1, 0}));
  Router router(engine.get());
  Outcome a, b;
  KRAUSE_ASSERT_OK_AND_ASSIGN(int64_t ida, router.Submit(Request(1), &a));
  KRAUSE_ASSERT_OK_AND_ASSIGN(int64_t idb, router.Submit(Request(2), &b));
  router.Step();
  EXPECT_EQ(engine->active(), 1);
  EXPECT_EQ(engine->waiting(), 1);  // the pool is full: b waits
  engine->Cancel(ida);
  const StepStats st = router.Step();
  EXPECT_EQ(st.cancelled, 1);
  EXPECT_TRUE(absl::IsCancelled(a.status));
  EXPECT_EQ(a.done_calls, 1);
  EXPECT_EQ(st.admitted, 1);  // b took the freed slot in the same step
  engine->Cancel(idb);
  engine->Cancel(ida);  // already gone: no effect
  router.Step();
  EXPECT_TRUE(absl::IsCancelled(b.status));
  EXPECT_EQ(engine->pool().in_use(), 0);
  EXPECT_FALSE(engine->Busy());
}

// Step(plan) carries the plan out and decides nothing itself: it admits exactly the plan's
// requests still waiting, in the plan's order, and the prefill positions Waiting() reports (what
// the planner budgets with) are the positions those admissions run.
TEST(DecodeEngine, StepAdmitsThePlanAndWaitingReportsThePrefillItRuns) {
  for (bool start : {true, false}) {
    SCOPED_TRACE(start ? "start token" : "no start token");
    KRAUSE_ASSERT_OK_AND_ASSIGN(PixelModel m, PixelModel::Create(TinyConfig("krause", start), 4));
    KRAUSE_ASSERT_OK_AND_ASSIGN(auto engine, DecodeEngine::Create(&m, EngineOptions{8, 0}));
    std::vector<int64_t> ids;
    for (const std::vector<uint8_t>& prompt :
         {std::vector<uint8_t>{}, std::vector<uint8_t>{7}, std::vector<uint8_t>(6, 9),
          std::vector<uint8_t>(11, 3), std::vector<uint8_t>(2, 1)}) {
      ids.push_back(engine->Submit(Request(ids.size(), prompt)).value());
    }
    const std::vector<WaitingRequest> waiting = engine->Waiting();
    ASSERT_EQ(waiting.size(), 5u);
    for (size_t i = 0; i < 5; ++i) EXPECT_EQ(waiting[i].id, ids[i]);
    // The plan's order is the step's (the planner's fair order may take a newer request first);
    // a planned request cancelled before the step is passed over.
    AdmissionPlan plan;
    plan.ids = {ids[3], ids[0], ids[1], ids[2]};
    engine->Cancel(ids[1]);
    StepOutput out = engine->Step(plan);
    EXPECT_EQ(out.admitted, (std::vector<int64_t>{ids[3], ids[0], ids[2]}));
    EXPECT_EQ(out.stats.prefill_tokens,
              waiting[0].prefill_tokens + waiting[2].prefill_tokens + waiting[3].prefill_tokens);
    EXPECT_EQ(out.stats.prefill_tokens, start ? 0 + 6 + 11 : 0 + 5 + 10);
    ASSERT_EQ(out.finished.size(), 1u);
    EXPECT_EQ(out.finished[0].id, ids[1]);
    EXPECT_TRUE(absl::IsCancelled(out.finished[0].status));
    EXPECT_EQ(engine->waiting(), 1);
    // Step() plans for itself: whatever fits.
    out = engine->Step();
    EXPECT_EQ(out.admitted, std::vector<int64_t>{ids[4]});
    EXPECT_EQ(out.stats.prefill_tokens, waiting[4].prefill_tokens);
  }
}

TEST(DecodeEngine, RandomJoinCancelFinishLeaksNoSlot) {
  KRAUSE_ASSERT_OK_AND_ASSIGN(PixelModel m, PixelModel::Create(TinyConfig("softmax", true), 8));
  KRAUSE_ASSERT_OK_AND_ASSIGN(auto engine, DecodeEngine::Create(&m, EngineOptions{5, 0}));
  Router router(engine.get());
  std::mt19937 rng(42);
  std::map<int64_t, std::unique_ptr<Outcome>> outcomes;
  for (int step = 0; step < 300; ++step) {
    const int joins = rng() % 3;
    for (int j = 0; j < joins; ++j) {
      auto o = std::make_unique<Outcome>();
      auto id = router.Submit(Request(rng()), o.get());
      ASSERT_TRUE(id.ok());
      outcomes[*id] = std::move(o);
    }
    if (!outcomes.empty() && rng() % 3 == 0) {
      auto it = outcomes.begin();
      std::advance(it, rng() % outcomes.size());
      engine->Cancel(it->first);
    }
    router.Step();
    EXPECT_LE(engine->pool().in_use(), 5);
    EXPECT_EQ(engine->pool().in_use(), engine->active());
  }
  router.Drain();
  EXPECT_EQ(engine->pool().in_use(), 0);
  int ok = 0, cancelled = 0;
  for (auto& [id, o] : outcomes) {
    EXPECT_EQ(o->done_calls, 1) << id;
    ok += o->status.ok();
    cancelled += absl::IsCancelled(o->status);
  }
  EXPECT_EQ(ok + cancelled, static_cast<int>(outcomes.size()));
  EXPECT_GT(ok, 10);
  EXPECT_GT(cancelled, 10);
}

TEST(DecodeEngine, BadRequestsAreRejectedByField) {
  KRAUSE_ASSERT_OK_AND_ASSIGN(PixelModel m, PixelModel::Create(TinyConfig("krause", true), 9));
  KRAUSE_ASSERT_OK_AND_ASSIGN(auto engine, DecodeEngine::Create(&m, EngineOptions{2, 0}));
  GenerationRequest r = Request(1, std::vector<uint8_t>(20, 0));
  EXPECT_THAT(engine->Submit(r).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("prompt has 20 subpixels; at most 19")));
  r = Request(1);
  r.sampling.top_p = 0;
  EXPECT_THAT(engine->Submit(r).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("top_p")));
  r = Request(1);
  r.sampling.temperature = -1;
  EXPECT_THAT(engine->Submit(r).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("temperature")));
  r = Request(1);
  r.sampling.top_k = 300;
  EXPECT_THAT(engine->Submit(r).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("top_k")));
  EXPECT_FALSE(engine->Busy());
  EXPECT_THAT(DecodeEngine::Create(&m, EngineOptions{8, 100}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("holds no sequence")));
}

// CUDA graphs apply to a KARM on a GPU only: on the CPU the engine ignores the option (and keeps
// its batch-invariant images), and DecodeGraphs says why and steps eagerly.
TEST(DecodeEngine, CudaGraphsStayOffOnTheCpu) {
  const PixelModel m = PixelModel::Create(TinyConfig("krause", true), 3).value();
  EXPECT_FALSE(DecodeGraphs::Supported(m));
  KRAUSE_ASSERT_OK_AND_ASSIGN(auto engine, DecodeEngine::Create(&m, EngineOptions{2, 0, true}));
  EXPECT_EQ(engine->graphs(), nullptr);

  auto eager_cache = PixelKvCache::Create(m.config(), 2).value();
  auto graph_cache = PixelKvCache::Create(m.config(), 2).value();
  const PixelDecodeWeights packed = PackForDecode(m);
  DecodeGraphs graphs(&m, &graph_cache, &packed, 2);
  EXPECT_FALSE(graphs.enabled());
  EXPECT_THAT(graphs.reason(), HasSubstr("GPU"));
  const at::Tensor u = at::tensor({7, 9}, at::kLong), pos = at::tensor({0, 0}, at::kLong),
                   slots = at::tensor({1, 0}, at::kLong);
  at::NoGradGuard no_grad;
  for (int step = 0; step < 3; ++step) {
    EXPECT_TRUE(at::equal(graphs.Step(u, pos + step, slots),
                          m.DecodeStep(u, pos + step, slots, &eager_cache, &packed)));
  }
  EXPECT_EQ(graphs.eager_steps(), 3);
  EXPECT_EQ(graphs.replays(), 0);
}

// Reduced-precision caches: bf16 rings for a KARM on the CPU or a GPU, fp16 rings on a GPU only;
// the ARM's cache is fp32. A bf16 engine's images are batch invariant like an fp32 one's.
TEST(DecodeEngine, Bf16RingsServeAKarmOnTheCpuOtherReducedCachesAreRefused) {
  const PixelModel karm = PixelModel::Create(TinyConfig("krause", true), 3).value();
  const PixelModel arm = PixelModel::Create(TinyConfig("softmax", true), 3).value();
  EngineOptions bf16{2, 0}, fp16{2, 0};
  bf16.cache_dtype = at::kBFloat16;
  fp16.cache_dtype = at::kHalf;
  KRAUSE_ASSERT_OK_AND_ASSIGN(auto engine, DecodeEngine::Create(&karm, bf16));
  EXPECT_EQ(engine->bytes_per_sequence(),
            PixelKvCache::BytesPerSequence(karm.config(), at::kBFloat16));
  EXPECT_THAT(DecodeEngine::Create(&karm, fp16).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("CUDA device")));
  EXPECT_THAT(DecodeEngine::Create(&arm, bf16).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("ARM's KV cache is float32")));
  const std::vector<Outcome> alone = Generate(karm, 1, 4, 0, nullptr, 1.0, at::kBFloat16);
  const std::vector<Outcome> together = Generate(karm, 4, 4, 1, nullptr, 1.0, at::kBFloat16);
  const std::vector<Outcome> fp32 = Generate(karm, 4, 4, 1);
  int64_t differ = 0;
  for (size_t i = 0; i < alone.size(); ++i) {
    ASSERT_TRUE(alone[i].status.ok()) << alone[i].status;
    EXPECT_EQ(alone[i].pixels, together[i].pixels) << "image " << i;
    differ += alone[i].pixels != fp32[i].pixels;
  }
  // Rounded keys and values are other numbers: some draws come out differently.
  EXPECT_GT(differ, 0);
  // Half the key/value bytes per sequence (biases stay fp32).
  EXPECT_LT(PixelKvCache::BytesPerSequence(karm.config(), at::kBFloat16),
            PixelKvCache::BytesPerSequence(karm.config()));
}

TEST(Scoring, BitsPerDimMatchesTheModelAndRejectsBadImages) {
  KRAUSE_ASSERT_OK_AND_ASSIGN(PixelModel m, PixelModel::Create(TinyConfig("krause", true), 10));
  const at::Tensor imgs = at::randint(0, 256, {3, 20}, at::kLong);
  KRAUSE_ASSERT_OK_AND_ASSIGN(std::vector<double> bpd, ScoreBitsPerDim(m, imgs.to(at::kByte)));
  ASSERT_EQ(bpd.size(), 3u);
  at::NoGradGuard no_grad;
  EXPECT_NEAR(bpd[1], m.NllPerImage(imgs)[1].item<double>() / std::log(2.0), 1e-5);
  EXPECT_THAT(ScoreBitsPerDim(m, at::zeros({2, 19}, at::kLong)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("[B, 20]")));
  EXPECT_THAT(ScoreBitsPerDim(m, at::full({1, 20}, 300, at::kLong)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("[0, 255]")));
}

}  // namespace
}  // namespace krause
