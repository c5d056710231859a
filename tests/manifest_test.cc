// The model manifest (server/core/options.h): every error ParseManifest can return, with the entry,
// the key and the limit it names; defaults for absent keys; checkpoint paths resolved against
// the manifest's folder; the images-per-request limit once the model's kind is known.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "model/loader.h"
#include "server/core/options.h"
#include "server/core/served_classifier.h"
#include "server/core/served_generator.h"
#include "tests/test_util.h"

namespace krause::server {
namespace {

using ::krause::testing::StatusIs;
using ::testing::HasSubstr;

// One entry {"name": "m", "checkpoint": "m.safetensors", EXTRA}.
std::string Entry(const std::string& extra) {
  return R"({"models": [{"name": "m", "checkpoint": "m.safetensors")" +
         (extra.empty() ? "" : ", " + extra) + "}]}";
}

struct BadManifest {
  std::string json;
  std::string message;  // a part of the error message
};

TEST(Manifest, EveryErrorNamesWhatIsWrong) {
  const std::vector<BadManifest> cases = {
      // The document.
      {"", "expected a JSON object {\"models\": [...]}"},
      {"[1, 2]", "expected a JSON object"},
      {R"({"model": []})", "expected a JSON object"},
      {R"({"models": {"name": "m"}})", "expected a JSON object"},
      {R"({"models": []})", "manifest: models is empty"},
      {R"({"models": [7]})", "manifest: models[0] is not an object"},
      // Keys and types.
      {Entry(R"("max_batch": 4)"),
       "models[0]: unknown key \"max_batch\" (known: attention_impl, checkpoint,"},
      {Entry(R"("attention_impl": "reference")"),
       "models[0].attention_impl must be auto, cuda, fused_cpu, windowed, got \"reference\""},
      {Entry(R"("attention_impl": 1)"), "models[0].attention_impl must be a string"},
      {Entry(R"("max_sequences": 2.5)"),
       "models[0].max_sequences must be an integer, got number 2.5"},
      {Entry(R"("max_sequences": "8")"), "models[0].max_sequences must be an integer, got string"},
      {Entry(R"("max_waiting": 18446744073709551615)"),
       "models[0].max_waiting is too large: 18446744073709551615"},
      {Entry(R"("default": 1)"), "models[0].default must be true or false, got number"},
      {Entry(R"("device": 0)"), "models[0].device must be a string, got number"},
      {R"({"models": [{"checkpoint": "m.safetensors"}]})",
       "models[0].name must match [A-Za-z0-9._-]{1,64}, got \"\""},
      {R"({"models": [{"name": "a b", "checkpoint": "m.safetensors"}]})",
       "models[0].name must match [A-Za-z0-9._-]{1,64}, got \"a b\""},
      {R"({"models": [{"name": ")" + std::string(65, 'x') + R"(", "checkpoint": "m"}]})",
       "models[0].name must match"},
      {R"({"models": [{"name": "m", "checkpoint": "a"}, {"name": "m", "checkpoint": "b"}]})",
       "models[1].name \"m\" is repeated"},
      {R"({"models": [{"name": "m"}]})", "models[0].checkpoint is required"},
      // Ranges: each limit at both ends.
      {Entry(R"("max_batch_size": 0)"), "models[0].max_batch_size must be in [1, 4096], got 0"},
      {Entry(R"("max_batch_size": 4097)"), "max_batch_size must be in [1, 4096], got 4097"},
      {Entry(R"("max_queue_delay_ms": -1)"), "max_queue_delay_ms must be in [0, 10000], got -1"},
      {Entry(R"("max_queue_delay_ms": 10001)"), "max_queue_delay_ms must be in [0, 10000]"},
      {Entry(R"("max_queued_images": 0)"), "max_queued_images must be in [1, 1048576], got 0"},
      {Entry(R"("max_queued_images": 1048577)"), "max_queued_images must be in [1, 1048576]"},
      {Entry(R"("max_sequences": 0)"), "max_sequences must be in [1, 4096], got 0"},
      {Entry(R"("max_sequences": 4097)"), "max_sequences must be in [1, 4096], got 4097"},
      {Entry(R"("max_waiting": -1)"), "max_waiting must be in [0, 1048576], got -1"},
      {Entry(R"("max_waiting": 1048577)"), "max_waiting must be in [0, 1048576]"},
      {Entry(R"("max_images_per_request": -1)"),
       "max_images_per_request must be in [0, 4096], got -1"},
      {Entry(R"("max_images_per_request": 4097)"), "max_images_per_request must be in [0, 4096]"},
      {Entry(R"("kv_cache_dtype": "fp8")"),
       "models[0].kv_cache_dtype must be float32, bfloat16 or float16, got \"fp8\""},
      // Sampling defaults: numbers (top_k an integer); their ranges are the model's check.
      {Entry(R"("temperature": "hot")"), "models[0].temperature must be a number, got string"},
      {Entry(R"("guidance": true)"), "models[0].guidance must be a number, got boolean"},
      {Entry(R"("top_k": 2.5)"), "models[0].top_k must be an integer, got number 2.5"},
  };
  for (const BadManifest& c : cases) {
    EXPECT_THAT(ParseManifest(c.json, "/srv/models").status(),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.message)))
        << c.json;
  }
}

TEST(Manifest, AbsentKeysTakeTheDefaultsAndPathsResolveAgainstTheManifestFolder) {
  KRAUSE_ASSERT_OK_AND_ASSIGN(
      std::vector<ModelSpec> specs,
      ParseManifest(R"({"models": [{"name": "a", "checkpoint": "sub/../a.safetensors"},
        {"name": "b", "checkpoint": "/abs/b.safetensors", "device": "cuda", "default": true,
         "max_batch_size": 8, "max_queue_delay_ms": 3, "max_queued_images": 9,
         "max_sequences": 2, "max_waiting": 0, "max_images_per_request": 8,
         "cuda_graphs": true, "kv_cache_dtype": "bfloat16"}]})",
                    "/srv/models"));
  ASSERT_EQ(specs.size(), 2u);
  const ModelSpec defaults;
  const ModelSpec& a = specs[0];
  EXPECT_EQ(a.name, "a");
  EXPECT_EQ(a.checkpoint, "/srv/models/a.safetensors");
  EXPECT_EQ(a.device, defaults.device);
  EXPECT_EQ(a.is_default, defaults.is_default);
  EXPECT_EQ(a.max_batch_size, defaults.max_batch_size);
  EXPECT_EQ(a.max_queue_delay_ms, defaults.max_queue_delay_ms);
  EXPECT_EQ(a.max_queued_images, defaults.max_queued_images);
  EXPECT_EQ(a.max_sequences, defaults.max_sequences);
  EXPECT_EQ(a.max_waiting, defaults.max_waiting);
  EXPECT_EQ(a.max_images_per_request, defaults.max_images_per_request);
  EXPECT_EQ(a.cuda_graphs, defaults.cuda_graphs);
  EXPECT_EQ(a.kv_cache_dtype, defaults.kv_cache_dtype);
  const ModelSpec& b = specs[1];
  EXPECT_EQ(b.checkpoint, "/abs/b.safetensors");  // absolute: kept
  EXPECT_EQ(b.device, "cuda");
  EXPECT_TRUE(b.is_default);
  EXPECT_EQ(b.max_batch_size, 8);
  EXPECT_EQ(b.max_queue_delay_ms, 3);
  EXPECT_EQ(b.max_queued_images, 9);
  EXPECT_EQ(b.max_sequences, 2);
  EXPECT_EQ(b.max_waiting, 0);
  EXPECT_EQ(b.max_images_per_request, 8);
  EXPECT_TRUE(b.cuda_graphs);
  EXPECT_EQ(b.kv_cache_dtype, KvCacheDtype::kBFloat16);
  // No folder: relative paths stay relative.
  KRAUSE_ASSERT_OK_AND_ASSIGN(std::vector<ModelSpec> here, ParseManifest(Entry(""), ""));
  EXPECT_EQ(here[0].checkpoint, "m.safetensors");
}

TEST(Manifest, ReadManifestNamesTheFileInItsErrors) {
  EXPECT_THAT(
      ReadManifest("/nonexistent/manifest.json").status(),
      StatusIs(absl::StatusCode::kNotFound, HasSubstr("/nonexistent/manifest.json: cannot open")));
  const std::string path = ::testing::TempDir() + "/manifest_test.json";
  std::ofstream(path) << R"({"models": [{"name": "m"}]})";
  EXPECT_THAT(ReadManifest(path).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr(path + ": manifest: models[0].checkpoint is required")));
}

TEST(Manifest, ImagesPerRequestDependsOnTheKindTheCheckpointHas) {
  ModelSpec s;
  s.name = "m";
  s.max_batch_size = 8;
  EXPECT_EQ(ServedClassifier::ImagesPerRequest(s).value(), 8);  // 0: a batch
  EXPECT_EQ(ServedGenerator::ImagesPerRequest(s), defaults::kGeneratorImagesPerRequest);
  s.max_images_per_request = 8;
  EXPECT_EQ(ServedClassifier::ImagesPerRequest(s).value(), 8);
  s.max_images_per_request = 9;
  EXPECT_THAT(
      ServedClassifier::ImagesPerRequest(s).status(),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("model m: max_images_per_request (9) is over max_batch_size (8)")));
  // A generator has no batches to split: max_batch_size does not bound it.
  EXPECT_EQ(ServedGenerator::ImagesPerRequest(s), 9);
}

// Sampling defaults: the checkpoint's metadata, overridden key by key by the spec, checked with
// a request's rules when the model is served.
TEST(Manifest, SamplingDefaultsComeFromTheCheckpointAndTheSpec) {
  PixelModelConfig c;
  c.height = 4;
  c.width_px = 4;
  c.channels = 1;
  c.d_model = 8;
  c.depth = 1;
  c.heads = 1;
  c.classes = 2;
  c.labels = {"a", "b"};
  auto pixel = PixelModel::Create(c, 1);
  ASSERT_TRUE(pixel.ok()) << pixel.status();
  LoadedModel m;
  m.path = "g.safetensors";
  m.pixel = std::make_shared<PixelModel>(std::move(*pixel));
  m.metadata["sampling_defaults"] = R"({"guidance": 2, "top_p": 0.95})";
  ModelSpec s;
  s.name = "g";
  auto d = ServedGenerator::Defaults(s, m);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->guidance, 2.0);
  EXPECT_EQ(d->top_p, 0.95);
  EXPECT_FALSE(d->temperature.has_value());
  s.sampling.top_p = 0.5;
  s.sampling.top_k = 4;
  d = ServedGenerator::Defaults(s, m);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->top_p, 0.5);
  EXPECT_EQ(d->top_k, 4);
  EXPECT_EQ(d->guidance, 2.0);
  s.sampling.top_p = 1.5;
  EXPECT_THAT(ServedGenerator::Defaults(s, m).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("model g: sampling default: top_p must be in (0, 1]")));
  s.sampling.top_p.reset();
  m.metadata["sampling_defaults"] = "[1]";
  EXPECT_THAT(ServedGenerator::Defaults(s, m).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("metadata sampling_defaults is not a JSON object")));
  m.metadata.erase("sampling_defaults");
  c.classes = 0;
  c.labels.clear();
  auto uncond = PixelModel::Create(c, 1);
  ASSERT_TRUE(uncond.ok());
  m.pixel = std::make_shared<PixelModel>(std::move(*uncond));
  s.sampling.guidance = 3;
  EXPECT_THAT(ServedGenerator::Defaults(s, m).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("guidance needs a conditional model")));
}

}  // namespace
}  // namespace krause::server
