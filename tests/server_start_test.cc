// End-to-end tests of what a manifest's settings serve (in process, on loopback ports;
// server_test.h): bf16 weights and bf16 precision for a classifier and a generator (ModelInfo,
// the kernel check and the bits of an answer say which), and the model devices checked at
// load.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <filesystem>
#include <string>
#include <vector>

#include "model/attention/cpu_kernels.h"
#include "model/vit_cpu.h"
#include "server_test.h"
#include "test_util.h"

namespace krause::testing {
namespace {

// Classify of `images` [n, H, W, C] uint8 by `model`: every image's probabilities, in order.
std::vector<float> ClassifyProbabilities(v1::KrauseService::Stub& stub, const std::string& model,
                                         const at::Tensor& images) {
  v1::ClassifyRequest req;
  req.set_model(model);
  req.set_return_probabilities(true);
  for (int64_t i = 0; i < images.size(0); ++i) *req.add_images() = RawImage(images[i]);
  grpc::ClientContext ctx;
  v1::ClassifyResponse r;
  const grpc::Status st = stub.Classify(&ctx, req, &r);
  EXPECT_TRUE(st.ok()) << st.error_message();
  std::vector<float> p;
  for (const auto& c : r.results())
    p.insert(p.end(), c.probabilities().begin(), c.probabilities().end());
  return p;
}

// "weights_dtype": "bfloat16" serves both kinds with their linear weights rounded to bfloat16:
// ModelInfo and the kernel check say so, a Classify answer has the bits of the packed forward of
// the rounded model, and a bad name is refused naming the entry and the key.
TEST(ServerStart, Bf16WeightsServeTheRoundedModelAndSaySo) {
  const TinyModels models = WriteTinyModels("bf16w");
  auto bad = server::ParseManifest(
      R"({"models": [{"name": "c", "checkpoint": "vit.safetensors", "weights_dtype": "int8"}]})",
      models.dir);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()),
              ::testing::HasSubstr("models[0].weights_dtype must be float32 or bfloat16"));
  const std::string manifest = models.dir + "/bf16w.json";
  WriteText(manifest, R"({"models": [
      {"name": "c", "checkpoint": "vit.safetensors", "weights_dtype": "bfloat16"},
      {"name": "g", "checkpoint": "karm.safetensors", "weights_dtype": "bfloat16"},
      {"name": "f", "checkpoint": "vit.safetensors", "default": false}]})");
  auto server = server::KrauseServer::Start(LoopbackOptions(manifest));
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = Stub(ClientFor((*server)->port()));
  for (const auto& [name, dtype] :
       {std::pair{"c", "bfloat16"}, {"g", "bfloat16"}, {"f", "float32"}}) {
    grpc::ClientContext ctx;
    v1::GetModelRequest req;
    req.set_name(name);
    v1::ModelInfo info;
    ASSERT_TRUE(stub->GetModel(&ctx, req, &info).ok()) << name;
    EXPECT_EQ(info.weights_dtype(), dtype) << name;
    EXPECT_EQ(info.cpu_kernels(), cpu::CpuKernels().name) << name;
    EXPECT_EQ(info.implementation(), "fused_cpu") << name;
    ASSERT_GT(info.kernel_checks_size(), 0);
    EXPECT_EQ(info.kernel_checks(0).result(), "passed") << name;
  }
  const at::Tensor images = RandomImages(4, 8, 8, 1, 11);
  auto classify = [&](const std::string& model) {
    return ClassifyProbabilities(*stub, model, images);
  };
  KRAUSE_ASSERT_OK_AND_ASSIGN(LoadedModel rounded,
                              LoadModel(models.dir + "/vit.safetensors", "cpu", at::kBFloat16));
  KRAUSE_ASSERT_OK_AND_ASSIGN(auto packed, CpuViT::Create(*rounded.vit));
  std::vector<float> want(4 * packed->classes());
  const at::Tensor chw = images.permute({0, 3, 1, 2}).contiguous();
  ASSERT_TRUE(packed->Forward(chw.data_ptr<uint8_t>(), 4, want.data()).ok());
  EXPECT_EQ(classify("c"), want);
  EXPECT_NE(classify("f"), want) << "the fp32 model answers differently";
  (*server)->Shutdown();
  std::filesystem::remove_all(models.dir);
}

// "precision": "bf16" serves a classifier's linear layers as oneDNN bf16 GEMMs on the rounded
// weights (or, without AMX, the fp32 forward of those weights, saying why):
// ModelInfo, the kernel check, /metrics and the bits of a Classify say which. Bad names and a
// contradicting weights_dtype are refused naming the model.
TEST(ServerStart, Bf16PrecisionServesAClassifierAndSaysHow) {
  const TinyModels models = WriteTinyModels("bf16p");
  auto parse = [&](const std::string& entry) {
    return server::ParseManifest(
               R"({"models": [{"name": "c", "checkpoint": "vit.safetensors", )" + entry + "}]}",
               models.dir)
        .status();
  };
  EXPECT_THAT(std::string(parse(R"("precision": "fp16")").message()),
              ::testing::HasSubstr("models[0].precision must be fp32 or bf16, got \"fp16\""));
  EXPECT_THAT(std::string(parse(R"("precision": "bf16", "weights_dtype": "float32")").message()),
              ::testing::HasSubstr("models[0].precision bf16 rounds the weights to bfloat16"));
  const std::string manifest = models.dir + "/bf16p.json";
  WriteText(manifest, R"({"models": [
      {"name": "c", "checkpoint": "vit.safetensors", "precision": "bf16"},
      {"name": "f", "checkpoint": "vit.safetensors", "default": false}]})");
  auto server = server::KrauseServer::Start(LoopbackOptions(manifest));
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = Stub(ClientFor((*server)->port()));
  const bool bf16 = nn::Bf16MatmulSupport().available;
  for (const std::string name : {"c", "f"}) {
    grpc::ClientContext ctx;
    v1::GetModelRequest req;
    req.set_name(name);
    v1::ModelInfo info;
    ASSERT_TRUE(stub->GetModel(&ctx, req, &info).ok()) << name;
    const bool asked = name == "c";
    EXPECT_EQ(info.precision(), asked && bf16 ? "bf16" : "fp32") << name;
    EXPECT_EQ(info.precision_fallback(), asked && !bf16 ? nn::Bf16MatmulSupport().why : "");
    EXPECT_EQ(info.linear_kernels(), asked && bf16 ? "onednn " + nn::Bf16MatmulSupport().impl
                                                   : std::string(cpu::CpuKernels().name));
    EXPECT_EQ(info.weights_dtype(), asked ? "bfloat16" : "float32") << name;
    ASSERT_EQ(info.kernel_checks_size(), 1);
    EXPECT_EQ(info.kernel_checks(0).result(), "passed") << name;
    EXPECT_EQ(info.kernel_checks(0).tolerance(), asked && bf16 ? 2e-2 : 1e-4) << name;
  }
  EXPECT_THAT((*server)->metrics().Scrape(),
              ::testing::HasSubstr(
                  absl::StrCat("krause_model_precision{model=\"c\",version=\"1\",precision=\"",
                               bf16 ? "bf16" : "fp32", "\"")));
  const at::Tensor images = RandomImages(4, 8, 8, 1, 12);
  const std::vector<float> got = ClassifyProbabilities(*stub, "c", images);
  KRAUSE_ASSERT_OK_AND_ASSIGN(LoadedModel rounded,
                              LoadModel(models.dir + "/vit.safetensors", "cpu", at::kBFloat16));
  KRAUSE_ASSERT_OK_AND_ASSIGN(auto packed, CpuViT::Create(*rounded.vit, Precision::kBf16));
  std::vector<float> want(4 * packed->classes());
  const at::Tensor chw = images.permute({0, 3, 1, 2}).contiguous();
  ASSERT_TRUE(packed->Forward(chw.data_ptr<uint8_t>(), 4, want.data()).ok());
  EXPECT_EQ(got, want);
  (*server)->Shutdown();
  std::filesystem::remove_all(models.dir);
}

// A generator in "precision": "bf16": its decode steps, prefills and Score run the packed step's
// bf16 GEMMs (CpuDecoder) on the rounded weights, or without AMX fp32, saying why. ModelInfo and
// the kernel check say which; a Score has the bits of CpuDecoder::BitsPerDim in that precision;
// a generation's start names the numerics a resume must match.
TEST(ServerStart, Bf16PrecisionServesAGeneratorAndSaysHow) {
  const TinyModels models = WriteTinyModels("bf16g");
  const std::string manifest = models.dir + "/bf16g.json";
  WriteText(
      manifest,
      R"({"models": [{"name": "g", "checkpoint": "karm.safetensors", "precision": "bf16"}]})");
  auto server = server::KrauseServer::Start(LoopbackOptions(manifest));
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = Stub(ClientFor((*server)->port()));
  const bool bf16 = nn::Bf16MatmulSupport().available;
  {
    grpc::ClientContext ctx;
    v1::GetModelRequest req;
    req.set_name("g");
    v1::ModelInfo info;
    ASSERT_TRUE(stub->GetModel(&ctx, req, &info).ok());
    EXPECT_EQ(info.precision(), bf16 ? "bf16" : "fp32");
    EXPECT_EQ(info.precision_fallback(), bf16 ? "" : nn::Bf16MatmulSupport().why);
    EXPECT_EQ(info.linear_kernels(), bf16 ? "onednn " + nn::Bf16MatmulSupport().impl
                                          : std::string(cpu::CpuKernels().name));
    EXPECT_EQ(info.weights_dtype(), "bfloat16");
    ASSERT_EQ(info.kernel_checks_size(), 1);
    EXPECT_EQ(info.kernel_checks(0).result(), "passed");
    EXPECT_EQ(info.kernel_checks(0).tolerance(), bf16 ? 0.25 : 2e-3);
  }
  const at::Tensor images = RandomImages(3, 6, 6, 1, 4);
  v1::ScoreRequest req;
  req.set_model("g");
  for (int i = 0; i < 3; ++i) *req.add_images() = RawImage(images[i]);
  grpc::ClientContext ctx;
  v1::ScoreResponse r;
  ASSERT_TRUE(stub->Score(&ctx, req, &r).ok());
  KRAUSE_ASSERT_OK_AND_ASSIGN(LoadedModel rounded,
                              LoadModel(models.dir + "/karm.safetensors", "cpu", at::kBFloat16));
  KRAUSE_ASSERT_OK_AND_ASSIGN(auto packed,
                              CpuDecoder::Create(*rounded.pixel, {}, Precision::kBf16));
  at::NoGradGuard no_grad;
  const auto want =
      ScoreBitsPerDim(*rounded.pixel, images.reshape({3, -1}), {}, KrauseImpl::kAuto, packed.get());
  ASSERT_TRUE(want.ok()) << want.status();
  ASSERT_EQ(r.bits_per_dim_size(), 3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(r.bits_per_dim(i), (*want)[i]) << i;
  // A generation runs and its start names the precision.
  grpc::ClientContext gctx;
  v1::GenerateRequest g;
  g.set_model("g");
  g.set_seed(3);
  auto reader = stub->Generate(&gctx, g);
  v1::GenerateResponse m;
  ASSERT_TRUE(reader->Read(&m));
  ASSERT_TRUE(m.has_start());
  EXPECT_THAT(m.start().numerics(), ::testing::StartsWith(bf16 ? "bf16 " : "fp32 "));
  while (reader->Read(&m)) {
  }
  EXPECT_TRUE(reader->Finish().ok());
  (*server)->Shutdown();
  std::filesystem::remove_all(models.dir);
}

// A model on a device that is not there, or a device that does not exist, stops the start with
// an error naming the model and the device; nothing listens.
TEST(ServerStart, ModelDevicesAreCheckedAtLoad) {
  const TinyModels models = WriteTinyModels("device");
  auto start_with = [&](const std::string& model, const std::string& device) {
    const std::string manifest = models.dir + "/device.json";
    WriteText(manifest, R"({"models": [{"name": "m", "checkpoint": ")" + model +
                            R"(.safetensors", "device": ")" + device + R"("}]})");
    return server::KrauseServer::Start(LoopbackOptions(manifest)).status();
  };
  for (const std::string model : {"vit", "karm"}) {
    const absl::Status bad = start_with(model, "tpu");
    EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(bad.message()), ::testing::HasSubstr("model m:"));
    EXPECT_THAT(std::string(bad.message()), ::testing::HasSubstr("\"tpu\""));
    if (!at::hasCUDA()) {
      const absl::Status no_gpu = start_with(model, "cuda");
      EXPECT_EQ(no_gpu.code(), absl::StatusCode::kFailedPrecondition) << no_gpu;
      EXPECT_THAT(std::string(no_gpu.message()), ::testing::HasSubstr("model m:"));
      EXPECT_THAT(std::string(no_gpu.message()), ::testing::HasSubstr("no CUDA device"));
    }
  }
  // The bundled models take --device (ServerOptions::device) for all of them.
  auto bundled = server::BundledManifest(models.dir, "cuda:1");
  ASSERT_TRUE(bundled.ok()) << bundled.status();
  ASSERT_FALSE(bundled->empty());
  for (const server::ModelSpec& spec : *bundled) EXPECT_EQ(spec.device, "cuda:1") << spec.name;
  // And --cuda_graphs (ServerOptions::cuda_graphs).
  auto graphed = server::BundledManifest(models.dir, "cpu", true);
  ASSERT_TRUE(graphed.ok()) << graphed.status();
  for (const server::ModelSpec& spec : *graphed) EXPECT_TRUE(spec.cuda_graphs) << spec.name;
  // "cuda_graphs" is a generator's option (a bool); on the CPU it changes nothing.
  auto graphs = server::ParseManifest(
      R"({"models": [{"name": "g", "checkpoint": "karm.safetensors", "cuda_graphs": true}]})",
      models.dir);
  ASSERT_TRUE(graphs.ok()) << graphs.status();
  EXPECT_TRUE((*graphs)[0].cuda_graphs);
  auto not_bool = server::ParseManifest(
      R"({"models": [{"name": "g", "checkpoint": "karm.safetensors", "cuda_graphs": "yes"}]})",
      models.dir);
  EXPECT_EQ(not_bool.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(not_bool.status().message()), ::testing::HasSubstr("models[0]"));
  WriteText(
      models.dir + "/graphs.json",
      R"({"models": [{"name": "g", "checkpoint": "karm.safetensors", "cuda_graphs": true}]})");
  auto started = server::KrauseServer::Start(LoopbackOptions(models.dir + "/graphs.json"));
  EXPECT_TRUE(started.ok()) << started.status();
  // "kv_cache_dtype": one of three names; bf16 rings serve a KARM on the CPU too, fp16 ones need
  // a GPU, so on the CPU that start fails naming the model.
  auto bad_dtype = server::ParseManifest(
      R"({"models": [{"name": "g", "checkpoint": "karm.safetensors", "kv_cache_dtype": "fp8"}]})",
      models.dir);
  EXPECT_EQ(bad_dtype.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad_dtype.status().message()),
              ::testing::HasSubstr("models[0].kv_cache_dtype"));
  // A manifest of one model `name` (checkpoint `model`) with "kv_cache_dtype": `dtype`, started.
  auto start_cached = [&](const std::string& name, const std::string& model,
                          const std::string& dtype) {
    const std::string manifest = models.dir + "/" + name + "_" + dtype + ".json";
    WriteText(manifest, R"({"models": [{"name": ")" + name + R"(", "checkpoint": ")" + model +
                            R"(.safetensors", "kv_cache_dtype": ")" + dtype + R"("}]})");
    return server::KrauseServer::Start(LoopbackOptions(manifest));
  };
  // Refused at the start: INVALID_ARGUMENT naming the model and saying why.
  auto expect_refused = [](const absl::Status& st, const std::string& model,
                           const std::string& why) {
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_THAT(std::string(st.message()), ::testing::HasSubstr("model " + model + ":"));
    EXPECT_THAT(std::string(st.message()), ::testing::HasSubstr(why));
  };
  expect_refused(start_cached("c", "vit", "float16").status(), "c", "a generator's option");
  if (!at::hasCUDA())
    expect_refused(start_cached("g", "karm", "float16").status(), "g", "CUDA device");
  // An ARM's cache is float32 on any device.
  expect_refused(start_cached("a", "arm", "bfloat16").status(), "a", "ARM's KV cache is float32");
  auto cpu_bf16 = start_cached("g", "karm", "bfloat16");
  ASSERT_TRUE(cpu_bf16.ok()) << cpu_bf16.status();
  {  // shown as served
    grpc::ClientContext ctx;
    v1::GetModelRequest req;
    req.set_name("g");
    v1::ModelInfo info;
    ASSERT_TRUE(Stub(ClientFor((*cpu_bf16)->port()))->GetModel(&ctx, req, &info).ok());
    EXPECT_EQ(info.kv_cache_dtype(), "bfloat16");
    EXPECT_EQ(info.implementation(), "fused_cpu");
  }
  std::filesystem::remove_all(models.dir);
}

}  // namespace
}  // namespace krause::testing
