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

GeneratePlan Resolve(GenerateAsk ask) {
  auto p = ResolveGenerate(Generator(), std::move(ask));
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? *p : GeneratePlan{};
}

TEST(ImageSeeds, CallsWithSeedsSevenAndEightShareNoImage) {
  GenerateAsk a;
  a.images = 4;
  a.seed = 7;
  GenerateAsk b = a;
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
  GenerateAsk whole;
  whole.images = 5;
  whole.seed = 99;
  const std::vector<uint64_t> all = Seeds(Resolve(whole));
  EXPECT_EQ(all[0], 99u);
  // Images 2..4 asked again (a resume): the call's seed, first_image 2.
  GenerateAsk run = whole;
  run.images = 3;
  run.first_image = 2;
  const GeneratePlan p = Resolve(run);
  EXPECT_EQ(Seeds(p), std::vector<uint64_t>(all.begin() + 2, all.end()));
  EXPECT_EQ(p.seed, 99u);
  EXPECT_EQ(p.first_image, 2u);
  // A one-image call with an image's own seed is that image's stream.
  GenerateAsk one;
  one.seed = all[3];
  EXPECT_EQ(Seeds(Resolve(one)), std::vector<uint64_t>{all[3]});
}

TEST(ResolveGenerate, UnsetSettingsTakeTheModelsDefaultsAndTopKZeroIsOff) {
  GenerateAsk ask;
  ask.images = 2;
  ask.classes = {3, -1};
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
    GenerateAsk ask;
    std::string field, text;
  };
  GenerateAsk many;
  many.images = 9;
  GenerateAsk hot;
  hot.temperature = 101;
  GenerateAsk wide;
  wide.top_k = 300;
  GenerateAsk guided;
  guided.guidance = 3;  // no class
  for (const Case& c : std::vector<Case>{{many, "num_images", "allows at most 8"},
                                         {hot, "temperature", "temperature"},
                                         {wide, "top_k", "top_k"},
                                         {guided, "guidance", "karm was given none"}}) {
    auto p = ResolveGenerate(Generator(), c.ask);
    ASSERT_FALSE(p.ok()) << c.field;
    EXPECT_TRUE(absl::IsInvalidArgument(p.status()));
    EXPECT_NE(p.status().message().find(c.text), std::string::npos) << p.status();
    const ErrorDetails d = DetailsOf(p.status());
    ASSERT_EQ(d.fields.size(), 1u) << p.status();
    EXPECT_EQ(d.fields[0].first, c.field);
  }
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
