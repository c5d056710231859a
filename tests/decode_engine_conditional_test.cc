// The generation engine with class-conditional models: each class batch invariant and changing
// the image, greedy images the forward's argmax given the class (with and without a prompt),
// classifier-free guidance (batch invariant, its two slots, its validation), the classes
// validated against the model, and scoring given the classes.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "model/engine/decode_engine.h"
#include "tests/decode_engine_test.h"
#include "tests/test_util.h"

namespace krause {
namespace {

using ::krause::testing::StatusIs;
using ::testing::HasSubstr;

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

}  // namespace
}  // namespace krause
