// The serving core's shared rules (server/core/operations.h), which every front end uses: the
// seed rule (ImageSeed), the resolution of a generation request (the model's defaults, the
// explicit "off" of top-k, the limits and the fields they name, the seeds of a resumed run), and
// the order of a classification's classes. Pure functions: no server, no model.
#include "server/core/operations.h"

#include <gtest/gtest.h>

#include <set>

#include "server/core/errors.h"

namespace krause::server {
namespace {

ModelInfo Generator() {
  ModelInfo m;
  m.name = "karm";
  m.kind = ModelKind::kGenerator;
  m.classes = 10;
  m.max_images_per_request = 8;
  m.default_temperature = 0.9;
  m.default_top_p = 0.95;
  m.default_top_k = 40;
  m.default_guidance = 2.0;
  return m;
}

std::vector<uint64_t> Seeds(const GeneratePlan& p) {
  std::vector<uint64_t> out;
  for (const GenerationRequest& r : p.images) out.push_back(r.sampling.seed);
  return out;
}

// The model's classes: an index is its own row (0..9), a label none.
absl::StatusOr<int64_t> Classes(bool by_name, const std::string&, int64_t index,
                                const std::string& field) {
  if (by_name || index < 0 || index >= 10) return InvalidField(field, field + ": no such class");
  return index;
}

absl::StatusOr<GeneratePlan> ResolveOn(const GenerateSettings& g) {
  return ResolveGenerate(g, Generator(), Classes);
}

GeneratePlan Resolve(const GenerateSettings& g) {
  auto p = ResolveOn(g);
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? *p : GeneratePlan{};
}

TEST(ImageSeeds, CallsWithSeedsSevenAndEightShareNoImage) {
  GenerateSettings a;
  a.num_images = 4;
  a.seed = 7;
  GenerateSettings b = a;
  b.seed = 8;
  std::set<uint64_t> all;
  for (uint64_t s : Seeds(Resolve(a))) all.insert(s);
  for (uint64_t s : Seeds(Resolve(b))) all.insert(s);
  EXPECT_EQ(all.size(), 8u);  // under seed + i they would share three of four
  // Stepped seeds 0..63, 8 images each: 512 distinct streams.
  std::set<uint64_t> stepped;
  for (uint64_t seed = 0; seed < 64; ++seed)
    for (uint64_t i = 0; i < 8; ++i) stepped.insert(ImageSeed(seed, i));
  EXPECT_EQ(stepped.size(), 512u);
}

TEST(ImageSeeds, ImageZeroKeepsTheSeedAndARunResumesWithItsOwnStreams) {
  EXPECT_EQ(ImageSeed(12345, 0), 12345u);
  GenerateSettings whole;
  whole.num_images = 5;
  whole.seed = 99;
  const std::vector<uint64_t> all = Seeds(Resolve(whole));
  EXPECT_EQ(all[0], 99u);
  // Images 2..4 asked again (a resume): the call's seed, first_image 2.
  GenerateSettings run = whole;
  run.num_images = 3;
  run.first_image = 2;
  const GeneratePlan p = Resolve(run);
  EXPECT_EQ(Seeds(p), std::vector<uint64_t>(all.begin() + 2, all.end()));
  EXPECT_EQ(p.seed, 99u);
  EXPECT_EQ(p.first_image, 2u);
  // A one-image call with an image's own seed is that image's stream.
  GenerateSettings one;
  one.seed = all[3];
  EXPECT_EQ(Seeds(Resolve(one)), std::vector<uint64_t>{all[3]});
}

TEST(ResolveGenerate, UnsetSettingsTakeTheModelsDefaultsAndTopKZeroIsOff) {
  GenerateSettings ask;
  ask.num_images = 2;
  ask.image_classes = {3, -1};
  ask.seed = 1;
  GeneratePlan p = Resolve(ask);
  ASSERT_EQ(p.images.size(), 2u);
  EXPECT_DOUBLE_EQ(p.images[0].sampling.temperature, 0.9);
  EXPECT_DOUBLE_EQ(p.images[0].sampling.top_p, 0.95);
  EXPECT_EQ(p.images[0].sampling.top_k, 40);
  EXPECT_DOUBLE_EQ(p.images[0].guidance, 2.0);  // a class: the model's guidance
  EXPECT_DOUBLE_EQ(p.images[1].guidance, 1.0);  // none: no guidance
  EXPECT_EQ(p.images[0].label, 3);
  EXPECT_EQ(p.images[1].label, -1);
  EXPECT_EQ(p.passes, 2);
  ask.top_k = 0;  // explicit: off, not the default
  ask.temperature = 0.5;
  p = Resolve(ask);
  EXPECT_EQ(p.images[0].sampling.top_k, 0);
  EXPECT_DOUBLE_EQ(p.images[0].sampling.temperature, 0.5);
}

TEST(ResolveGenerate, ErrorsNameTheSettingAndTheLimit) {
  struct Case {
    GenerateSettings ask;
    std::string field, text;
  };
  GenerateSettings many;
  many.num_images = 9;
  GenerateSettings hot;
  hot.temperature = 101;
  GenerateSettings wide;
  wide.top_k = 300;
  GenerateSettings guided;
  guided.guidance = 3;  // no class
  for (const Case& c : std::vector<Case>{{many, "num_images", "allows at most 8"},
                                         {hot, "temperature", "temperature"},
                                         {wide, "top_k", "top_k"},
                                         {guided, "guidance", "karm was given none"}}) {
    auto p = ResolveOn(c.ask);
    ASSERT_FALSE(p.ok()) << c.field;
    EXPECT_TRUE(absl::IsInvalidArgument(p.status()));
    EXPECT_NE(p.status().message().find(c.text), std::string::npos) << p.status();
    const ErrorDetails d = DetailsOf(p.status());
    ASSERT_EQ(d.fields.size(), 1u) << p.status();
    EXPECT_EQ(d.fields[0].first, c.field);
  }
}

TEST(ResolveGenerate, TheOutputModeTheIntervalAndTheTimeout) {
  GenerateSettings g;
  EXPECT_EQ(Resolve(g).output, GenerateOutput::kRows);
  EXPECT_EQ(Resolve(g).interval, std::chrono::milliseconds(100));
  g.stream_rows = false;
  g.update_interval_ms = 50;
  g.timeout_us = 7;
  GeneratePlan p = Resolve(g);
  EXPECT_EQ(p.output, GenerateOutput::kProgress);
  EXPECT_EQ(p.interval, std::chrono::milliseconds(50));
  EXPECT_EQ(p.timeout, std::chrono::microseconds(7));
  g.answer_once = true;  // whatever stream_rows says
  EXPECT_EQ(Resolve(g).output, GenerateOutput::kFinal);
}

TEST(ResolveGenerate, TheClassAndThePromptAreResolvedHereInTheOrderEveryFrontEndShares) {
  GenerateSettings g;
  g.num_images = 2;
  g.class_index = 4;
  GeneratePlan p = Resolve(g);
  EXPECT_EQ(p.images[0].label, 4);
  EXPECT_EQ(p.images[1].label, 4);
  // Wrong in three ways: the image count is named first, then the interval, then the prompt.
  GenerateSettings bad;
  bad.num_images = 9;
  bad.update_interval_ms = 5;
  bad.prompt_rows = 2;
  bad.class_index = 99;
  std::vector<std::string> fields;
  for (int i = 0; i < 4; ++i) {
    auto r = ResolveOn(bad);
    ASSERT_FALSE(r.ok());
    const ErrorDetails d = DetailsOf(r.status());
    ASSERT_EQ(d.fields.size(), 1u) << r.status();
    fields.push_back(d.fields[0].first);
    if (i == 0) bad.num_images = 1;
    if (i == 1) bad.update_interval_ms = 0;
    if (i == 2) bad.prompt_rows = 0;
  }
  EXPECT_EQ(fields, (std::vector<std::string>{"num_images", "update_interval_ms", "prompt_rows",
                                              "class_index"}));
}

TEST(TopClasses, HighestFirstTiesToTheLowerIndex) {
  const float row[] = {0.1f, 0.3f, 0.3f, 0.05f, 0.25f};
  EXPECT_EQ(TopClasses(row, 5, 3), (std::vector<int64_t>{1, 2, 4}));
  EXPECT_EQ(TopClasses(row, 5, 9).size(), 5u);  // clipped to the classes
  ModelInfo m;
  m.labels = {"a", "b"};
  EXPECT_EQ(ClassName(m, 1), "b");
  EXPECT_EQ(ClassName(m, 4), "4");
}

}  // namespace
}  // namespace krause::server
