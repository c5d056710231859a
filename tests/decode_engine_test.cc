// The generation engine: batch invariance (same seeds, same images at batch sizes 1, 7 and 64
// and with sequences joining at different steps), completion prompts, cancellation, slot
// accounting under random join / cancel / finish events, validation and scoring.
#include "model/engine/decode_engine.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <random>

#include "model/nn/dnnl_linear.h"
#include "tests/test_util.h"

namespace krause {
namespace {

using ::krause::testing::StatusIs;
using ::testing::HasSubstr;

PixelModelConfig TinyConfig(const std::string& attention, bool start) {
  PixelModelConfig c;
  c.attention = ParseAttentionKind(attention).value();
  c.height = 4;
  c.width_px = 5;
  c.channels = 1;  // 20 subpixels
  c.d_model = 32;
  c.depth = 2;
  c.heads = 4;
  c.window = 6;
  c.top_k = 4;
  c.start_token = start;
  return c;
}

struct Outcome {
  absl::Status status;
  std::vector<uint8_t> pixels;
  std::vector<uint8_t> streamed;
  int done_calls = 0;
};

GenerationRequest Request(uint64_t seed, std::vector<uint8_t> prompt = {}) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.sampling.seed = seed;
  r.sampling.temperature = 1.0;
  r.sampling.top_p = 0.95;
  return r;
}

// Drives an engine and hands each step's output to the Outcome of its request, by id (what the
// server's worker does for its calls).
class Router {
 public:
  explicit Router(DecodeEngine* engine) : engine_(engine) {}
  absl::StatusOr<int64_t> Submit(GenerationRequest r, Outcome* out) {
    const int64_t offset = static_cast<int64_t>(r.prompt.size());
    auto id = engine_->Submit(std::move(r));
    if (id.ok()) routes_[*id] = {out, offset};
    return id;
  }
  StepStats Step() {
    const StepOutput o = engine_->Step();
    for (const StepOutput::Pixel& p : o.pixels) {
      const Route& r = routes_.at(p.id);
      // In order, right after the prompt (x_0 of a start-less model without prompt is index 0).
      EXPECT_EQ(p.index, r.offset + static_cast<int64_t>(r.out->streamed.size()));
      r.out->streamed.push_back(p.value);
    }
    for (const StepOutput::Finished& f : o.finished) {
      Outcome* out = routes_.at(f.id).out;
      out->status = f.status;
      out->pixels = f.image;
      ++out->done_calls;
      if (f.status.ok()) {
        EXPECT_EQ(f.sampled, static_cast<int64_t>(f.image.size()) - routes_.at(f.id).offset);
      }
    }
    return o.stats;
  }
  void Drain() {
    while (engine_->Busy()) Step();
  }

 private:
  struct Route {
    Outcome* out;
    int64_t offset;  // prompt length
  };
  DecodeEngine* engine_;
  std::map<int64_t, Route> routes_;
};

// Generates `count` images with seeds 0..count-1; request i is submitted at step i * stagger,
// with class label_of(i) when given (and then `guidance` for the images with a class).
std::vector<Outcome> Generate(const PixelModel& m, int64_t slots, int64_t count, int64_t stagger,
                              const std::function<int64_t(int64_t)>& label_of = nullptr,
                              double guidance = 1.0, at::ScalarType cache_dtype = at::kFloat,
                              Precision precision = Precision::kFp32) {
  EngineOptions options{slots, 0};
  options.cache_dtype = cache_dtype;
  options.precision = precision;
  auto engine = DecodeEngine::Create(&m, options);
  EXPECT_TRUE(engine.ok());
  EXPECT_EQ((*engine)->precision(), precision) << (*engine)->precision_fallback();
  Router router(engine->get());
  std::vector<Outcome> out(count);
  int64_t submitted = 0, step = 0;
  while (submitted < count || (*engine)->Busy()) {
    while (submitted < count && submitted * stagger <= step) {
      GenerationRequest r = Request(submitted);
      if (label_of) r.label = label_of(submitted);
      if (r.label >= 0) r.guidance = guidance;
      EXPECT_TRUE(router.Submit(std::move(r), &out[submitted]).ok());
      ++submitted;
    }
    const StepStats st = router.Step();
    EXPECT_LE(st.batch, slots);
    ++step;
  }
  EXPECT_EQ((*engine)->pool().in_use(), 0);
  return out;
}

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
// requests still waiting, oldest first, and the prefill positions Waiting() reports (what the
// planner budgets with) are the positions those admissions run.
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
    // A plan that passes over the oldest request admits nothing: no request overtakes an older
    // one.
    AdmissionPlan skip_oldest;
    skip_oldest.ids = {ids[1]};
    StepOutput out = engine->Step(skip_oldest);
    EXPECT_TRUE(out.admitted.empty());
    EXPECT_EQ(engine->waiting(), 5);
    // A planned request cancelled before the step is passed over; the rest are admitted.
    AdmissionPlan plan;
    plan.ids = {ids[0], ids[1], ids[2], ids[3]};
    engine->Cancel(ids[1]);
    out = engine->Step(plan);
    EXPECT_EQ(out.admitted, (std::vector<int64_t>{ids[0], ids[2], ids[3]}));
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

// Class-conditional models: a class embedding (scaled up from its initialisation so that every
// class changes the draws) conditions every position.
PixelModel ConditionalModel(const std::string& attention, uint64_t seed) {
  PixelModelConfig c = TinyConfig(attention, true);
  c.classes = 3;
  c.labels = {"zero", "one", "two"};
  PixelModel m = PixelModel::Create(c, seed).value();
  at::NoGradGuard no_grad;
  m.parameters().Get("class_emb.weight").mul_(40);
  return m;
}

class ConditionalEngineTest : public ::testing::TestWithParam<const char*> {};

TEST_P(ConditionalEngineTest, EachClassIsBatchInvariantAndTheClassChangesTheImage) {
  const PixelModel m = ConditionalModel(GetParam(), 5);
  const int64_t count = 24;
  auto label_of = [](int64_t i) { return i % 4 - 1; };  // -1 (none), 0, 1, 2
  const std::vector<Outcome> alone = Generate(m, 1, count, 0, label_of);
  const std::vector<Outcome> batched = Generate(m, 7, count, 2, label_of);
  const std::vector<Outcome> other = Generate(m, 7, count, 0, [](int64_t i) { return i % 3; });
  int differ = 0;
  for (int64_t i = 0; i < count; ++i) {
    ASSERT_TRUE(alone[i].status.ok()) << alone[i].status;
    EXPECT_EQ(alone[i].pixels, batched[i].pixels) << "image " << i;
    if (label_of(i) != i % 3) differ += alone[i].pixels != other[i].pixels;
  }
  EXPECT_GE(differ, 15);  // same seed, another class: another image (18 such images)
}

TEST_P(ConditionalEngineTest, GreedyImagesAreTheForwardsArgmaxGivenTheClassWithAndWithoutPrompt) {
  // Greedy decoding through the engine (prefill + packed steps) must pick, at every position,
  // the argmax of the LibTorch forward over the image so far with the same class.
  const PixelModel m = ConditionalModel(GetParam(), 7);
  const int64_t n = m.config().seq_len();
  auto engine = DecodeEngine::Create(&m, EngineOptions{4, 0}).value();
  Router router(engine.get());
  std::vector<Outcome> out(4);
  const std::vector<uint8_t> prompt = {10, 200, 30, 40, 250};
  for (int64_t i = 0; i < 4; ++i) {
    GenerationRequest r = Request(i, i % 2 ? prompt : std::vector<uint8_t>());
    r.sampling.temperature = 0;
    r.label = i < 3 ? i : -1;
    ASSERT_TRUE(router.Submit(std::move(r), &out[i]).ok());
  }
  router.Drain();
  at::NoGradGuard no_grad;
  for (int64_t i = 0; i < 4; ++i) {
    ASSERT_TRUE(out[i].status.ok()) << out[i].status;
    ASSERT_EQ(static_cast<int64_t>(out[i].pixels.size()), n);
    const at::Tensor x =
        at::tensor(std::vector<int64_t>(out[i].pixels.begin(), out[i].pixels.end()), at::kLong)
            .view({1, n});
    const at::Tensor cls = at::full({1}, i < 3 ? i : m.config().null_class(), at::kLong);
    const at::Tensor argmax = m.Forward(x.narrow(1, 0, n - 1), KrauseImpl::kAuto, cls).argmax(-1);
    const int64_t first = i % 2 ? static_cast<int64_t>(prompt.size()) : 0;
    EXPECT_TRUE(at::equal(argmax.narrow(1, first, n - first), x.narrow(1, first, n - first)))
        << "image " << i;
    if (i % 2) {
      EXPECT_EQ(std::vector<uint8_t>(out[i].pixels.begin(), out[i].pixels.begin() + 5), prompt);
    }
  }
}

TEST_P(ConditionalEngineTest, GuidedImagesAreBatchInvariantAndDifferFromUnguidedOnes) {
  const PixelModel m = ConditionalModel(GetParam(), 5);
  const int64_t count = 16;
  auto label_of = [](int64_t i) { return i % 4 - 1; };  // -1 (none: unguided), 0, 1, 2
  // Two slots: one guided image at a time; seven: guided and plain ones joining every step.
  const std::vector<Outcome> alone = Generate(m, 2, count, 0, label_of, 2.5);
  const std::vector<Outcome> batched = Generate(m, 7, count, 1, label_of, 2.5);
  const std::vector<Outcome> plain = Generate(m, 7, count, 0, label_of, 1.0);
  int differ = 0;
  for (int64_t i = 0; i < count; ++i) {
    ASSERT_TRUE(alone[i].status.ok()) << alone[i].status;
    EXPECT_EQ(alone[i].pixels, batched[i].pixels) << "image " << i;
    if (label_of(i) < 0) {
      EXPECT_EQ(alone[i].pixels, plain[i].pixels) << "image " << i;  // no class: unguided
    } else {
      differ += alone[i].pixels != plain[i].pixels;
    }
  }
  EXPECT_GE(differ, 10);  // of 12 images with a class
}

TEST_P(ConditionalEngineTest, GreedyGuidedImagesAreTheArgmaxOfTheGuidedForward) {
  // With guidance g the engine picks, at every position, the argmax of u + g (c - u), c and u
  // the LibTorch forward's logits over the image so far with the class and with the null class.
  // (The test model's strong class embedding makes g > 1 pick c's argmax; g = 0.25, closer to
  // u, picks other values.)
  const PixelModel m = ConditionalModel(GetParam(), 7);
  const int64_t n = m.config().seq_len();
  const double guidance[3] = {0.25, 2.5, 0.25};
  auto engine = DecodeEngine::Create(&m, EngineOptions{5, 0}).value();
  Router router(engine.get());
  std::vector<Outcome> out(3);
  const std::vector<uint8_t> prompt = {10, 200, 30, 40, 250};
  for (int64_t i = 0; i < 3; ++i) {
    GenerationRequest r = Request(i, i == 1 ? prompt : std::vector<uint8_t>());
    r.sampling.temperature = 0;
    r.label = i;
    r.guidance = guidance[i];
    ASSERT_TRUE(router.Submit(std::move(r), &out[i]).ok());
  }
  router.Drain();
  at::NoGradGuard no_grad;
  for (int64_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(out[i].status.ok()) << out[i].status;
    const at::Tensor x =
        at::tensor(std::vector<int64_t>(out[i].pixels.begin(), out[i].pixels.end()), at::kLong)
            .view({1, n});
    const at::Tensor in = x.narrow(1, 0, n - 1);
    const at::Tensor c = m.Forward(in, KrauseImpl::kAuto, at::full({1}, i, at::kLong));
    const at::Tensor u =
        m.Forward(in, KrauseImpl::kAuto, at::full({1}, m.config().null_class(), at::kLong));
    const at::Tensor argmax = (u + guidance[i] * (c - u)).argmax(-1);
    const at::Tensor plain = c.argmax(-1);
    const int64_t first = i == 1 ? static_cast<int64_t>(prompt.size()) : 0;
    EXPECT_TRUE(at::equal(argmax.narrow(1, first, n - first), x.narrow(1, first, n - first)))
        << "image " << i;
    if (guidance[i] < 1) {
      EXPECT_FALSE(at::equal(plain.narrow(1, first, n - first), x.narrow(1, first, n - first)))
          << "image " << i << ": guidance changed nothing";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, ConditionalEngineTest, ::testing::Values("krause", "softmax"));

TEST(ConditionalEngine, AGuidedRequestTakesTwoSlotsAndWaitsForThem) {
  const PixelModel m = ConditionalModel("krause", 3);
  auto engine = DecodeEngine::Create(&m, EngineOptions{3, 0}).value();
  Router router(engine.get());
  std::vector<Outcome> out(3);
  GenerationRequest a = Request(1);
  GenerationRequest b = Request(2, {1, 2, 3, 4, 5});
  GenerationRequest c = Request(3, {1, 2, 3});
  a.label = 0;
  a.guidance = 2;
  b.label = 1;
  b.guidance = 0.5;
  c.label = 2;  // unguided
  const int64_t a_id = router.Submit(std::move(a), &out[0]).value();
  const int64_t b_id = router.Submit(std::move(b), &out[1]).value();
  const int64_t c_id = router.Submit(std::move(c), &out[2]).value();
  // Costs as admission sees them: b's prompt prefilled into both its slots (5 each).
  const std::vector<WaitingRequest> waiting = engine->Waiting();
  ASSERT_EQ(waiting.size(), 3u);
  EXPECT_EQ(waiting[0].prefill_tokens, 0);
  EXPECT_EQ(waiting[1].prefill_tokens, 10);
  EXPECT_EQ(waiting[2].prefill_tokens, 3);
  EXPECT_EQ(PlanAdmission(waiting, AdmissionBudget{5}).ids,
            (std::vector<int64_t>{a_id, b_id, c_id}));
  EXPECT_EQ(PlanAdmission(waiting, AdmissionBudget{3}).ids,
            (std::vector<int64_t>{a_id}));  // b does not fit
  StepStats st = router.Step();
  // a holds 2 slots; b needs 2 and waits with one free, and c waits behind it (oldest first).
  EXPECT_EQ(st.admitted, 1);
  EXPECT_EQ(st.batch, 2);  // a's row and its guide row
  EXPECT_EQ(engine->pool().in_use(), 2);
  EXPECT_EQ(engine->waiting(), 2);
  EXPECT_EQ(PlanAdmission(engine->Waiting(), AdmissionBudget{engine->free_slots()}).ids,
            std::vector<int64_t>{});
  while (engine->active() > 0 && engine->waiting() == 2) router.Step();
  // a finished: b (2 slots) and c (1) run together, 3 rows.
  st = router.Step();
  EXPECT_EQ(engine->pool().in_use(), 3);
  EXPECT_EQ(st.batch, 3);
  EXPECT_EQ(st.prefill_tokens, 2 * 5 + 3);  // [START, prompt] but the last input, per slot
  engine->Cancel(b_id);
  router.Step();
  EXPECT_EQ(engine->pool().in_use(), 1);  // b left with both its slots
  router.Drain();
  EXPECT_EQ(engine->pool().in_use(), 0);
  EXPECT_TRUE(out[0].status.ok());
  EXPECT_TRUE(absl::IsCancelled(out[1].status));
  EXPECT_TRUE(out[2].status.ok());
}

TEST(ConditionalEngine, GuidanceIsValidated) {
  const PixelModel m = ConditionalModel("krause", 3);
  auto engine = DecodeEngine::Create(&m, EngineOptions{2, 0}).value();
  auto single = DecodeEngine::Create(&m, EngineOptions{1, 0}).value();
  GenerationRequest r = Request(1);
  r.label = 1;
  for (double bad : {-0.5, 20.5, std::nan("")}) {
    r.guidance = bad;
    EXPECT_THAT(engine->Submit(r).status(), StatusIs(absl::StatusCode::kInvalidArgument,
                                                     HasSubstr("guidance must be in [0, 20]")));
  }
  r.guidance = 3;
  EXPECT_THAT(single->Submit(r).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("needs 2 cache slots")));
  r.label = -1;
  EXPECT_THAT(engine->Submit(r).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("needs a class")));
  EXPECT_FALSE(engine->Busy());
  EXPECT_FALSE(single->Busy());
}

TEST(ConditionalEngine, ClassesAreValidatedAgainstTheModel) {
  const PixelModel cond = ConditionalModel("krause", 3);
  const PixelModel plain = PixelModel::Create(TinyConfig("krause", true), 3).value();
  auto ce = DecodeEngine::Create(&cond, EngineOptions{2, 0}).value();
  auto pe = DecodeEngine::Create(&plain, EngineOptions{2, 0}).value();
  GenerationRequest r = Request(1);
  r.label = 3;
  EXPECT_THAT(ce->Submit(r).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("class 3 is outside [0, 3)")));
  r.label = 0;
  EXPECT_THAT(pe->Submit(r).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("unconditional")));
  EXPECT_FALSE(ce->Busy());
  EXPECT_FALSE(pe->Busy());
  // Labels by name.
  EXPECT_EQ(cond.config().ClassOfLabel("two").value(), 2);
  EXPECT_THAT(
      cond.config().ClassOfLabel("three").status(),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("valid labels: zero, one, two")));
  EXPECT_THAT(plain.config().ClassOfLabel("zero").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("unconditional")));
}

TEST(ConditionalScoring, BitsPerDimGivenTheClassesMatchTheModel) {
  const PixelModel m = ConditionalModel("krause", 11);
  const at::Tensor imgs = at::randint(0, 256, {4, 20}, at::kLong);
  KRAUSE_ASSERT_OK_AND_ASSIGN(std::vector<double> given, ScoreBitsPerDim(m, imgs, {2, -1, 0, 1}));
  KRAUSE_ASSERT_OK_AND_ASSIGN(std::vector<double> none, ScoreBitsPerDim(m, imgs));
  at::NoGradGuard no_grad;
  const at::Tensor rows = at::tensor(std::vector<int64_t>{2, 3, 0, 1}, at::kLong);  // 3: null
  const at::Tensor ref = m.NllPerImage(imgs, KrauseImpl::kAuto, rows) / std::log(2.0);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(given[i], ref[i].item<double>(), 1e-5) << i;
  EXPECT_EQ(given[1], none[1]);  // -1 is the null class, as no classes at all
  EXPECT_NE(given[0], none[0]);
  EXPECT_THAT(ScoreBitsPerDim(m, imgs, {0, 1}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("2 classes for 4 images")));
  EXPECT_THAT(ScoreBitsPerDim(m, imgs, {0, 1, 5, 0}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("labels[2]: class 5")));
  const PixelModel plain = PixelModel::Create(TinyConfig("krause", true), 3).value();
  EXPECT_THAT(ScoreBitsPerDim(plain, imgs, {0, 0, 0, 0}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("unconditional")));
  // An unconditional model given "no class" for every image scores as without classes.
  EXPECT_EQ(ScoreBitsPerDim(plain, imgs, {-1, -1, -1, -1}).value(),
            ScoreBitsPerDim(plain, imgs).value());
}

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
