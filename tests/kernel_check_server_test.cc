// The load-time kernel check in the server: with the fused Krause kernels broken by the fault
// hook (cpu::SetCpuKernelsForTesting), the Krause models are served on the windowed path with
// correct results, ListModels and /metrics say why, --kernel_check=strict refuses them, a forced
// implementation is checked too, and --kernel_check=off serves unchecked. Healthy kernels serve
// every model on fused_cpu.
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>

#include "model/attention/cpu_kernels.h"
#include "model/engine/decode_engine.h"
#include "server/v1/images.h"
#include "tests/server_fixture.h"

namespace krause::testing {
namespace {

using ::testing::HasSubstr;

class KernelCheckServer : public ::testing::Test {
 protected:
  void SetUp() override { models_ = WriteTinyModels("kcheck"); }
  void TearDown() override { cpu::SetCpuKernelsForTesting(nullptr); }

  absl::StatusOr<std::unique_ptr<server::KrauseServer>> Start(server::KernelCheckMode mode,
                                                              const std::string& manifest = "") {
    server::ServerOptions o = LoopbackOptions(manifest.empty() ? models_.manifest : manifest);
    o.kernel_check = mode;
    return server::KrauseServer::Start(o);
  }
  // name -> ModelInfo, through ListModels.
  static std::map<std::string, v1::ModelInfo> List(server::KrauseServer& s) {
    auto stub = Stub(ClientFor(s.port()));
    grpc::ClientContext ctx;
    v1::ListModelsResponse r;
    EXPECT_TRUE(stub->ListModels(&ctx, v1::ListModelsRequest(), &r).ok());
    std::map<std::string, v1::ModelInfo> out;
    for (const auto& m : r.models()) out[m.name()] = m;
    return out;
  }

  TinyModels models_;
};

TEST_F(KernelCheckServer, HealthyKernelsServeEveryModelOnFusedCpu) {
  auto s = Start(server::KernelCheckMode::kFallback);
  ASSERT_TRUE(s.ok()) << s.status();
  for (const auto& [name, m] : List(**s)) {
    EXPECT_EQ(m.implementation(), "fused_cpu") << name;
    ASSERT_EQ(m.kernel_checks_size(), 1) << name;
    EXPECT_EQ(m.kernel_checks(0).result(), "passed") << name;
    EXPECT_LE(m.kernel_checks(0).max_abs_diff(), m.kernel_checks(0).tolerance()) << name;
    EXPECT_GT(m.kernel_checks(0).seconds(), 0) << name;
  }
  EXPECT_THAT((*s)->metrics().Scrape(),
              HasSubstr("krause_kernel_check{model=\"vit\",version=\"1\",implementation="
                        "\"fused_cpu\",device=\"cpu\",result=\"passed\"} 1"));
}

TEST_F(KernelCheckServer, WrongValuesFallBackToTheWindowedPathWithCorrectResults) {
  ASSERT_TRUE(cpu::SetCpuKernelsForTesting("fault_values"));
  auto s = Start(server::KernelCheckMode::kFallback);
  ASSERT_TRUE(s.ok()) << s.status();
  const auto models = List(**s);
  for (const char* krause : {"vit", "karm", "karm-big", "karm-cond"}) {
    const v1::ModelInfo& m = models.at(krause);
    EXPECT_EQ(m.implementation(), "windowed") << krause;
    ASSERT_EQ(m.kernel_checks_size(), 2) << krause;
    EXPECT_EQ(m.kernel_checks(0).implementation(), "fused_cpu");
    EXPECT_EQ(m.kernel_checks(0).result(), "mismatch") << krause;
    EXPECT_GT(m.kernel_checks(0).max_abs_diff(), m.kernel_checks(0).tolerance());
    EXPECT_EQ(m.kernel_checks(1).implementation(), "windowed");
    EXPECT_EQ(m.kernel_checks(1).result(), "passed") << krause;
  }
  EXPECT_EQ(models.at("arm").implementation(), "fused_cpu");  // softmax: no Krause kernel

  const std::string metrics = (*s)->metrics().Scrape();
  EXPECT_THAT(metrics, HasSubstr("krause_kernel_check{model=\"vit\",version=\"1\",implementation="
                                 "\"fused_cpu\",device=\"cpu\",result=\"mismatch\"} 1"));
  EXPECT_THAT(metrics, HasSubstr("krause_kernel_check{model=\"vit\",version=\"1\",implementation="
                                 "\"windowed\",device=\"cpu\",result=\"passed\"} 1"));

  // Classify answers what the reference operator computes.
  auto stub = Stub(ClientFor((*s)->port()));
  at::Generator gen = at::detail::createCPUGenerator(5);
  const at::Tensor images = at::randint(0, 256, {3, 8, 8, 1}, gen, at::kLong).to(at::kByte);
  v1::ClassifyRequest req;
  req.set_model("vit");
  req.set_return_probabilities(true);
  for (int i = 0; i < 3; ++i) *req.add_images() = server::EncodeRawImage(images[i]);
  grpc::ClientContext ctx;
  v1::ClassifyResponse r;
  ASSERT_TRUE(stub->Classify(&ctx, req, &r).ok());
  auto vit = LoadModel(models_.dir + "/vit.safetensors");
  ASSERT_TRUE(vit.ok());
  at::NoGradGuard no_grad;
  const at::Tensor want = at::softmax(
      vit->vit->Forward(NormalizePixels(vit->vit->config(), images.permute({0, 3, 1, 2})),
                        KrauseImpl::kReference),
      -1);
  ASSERT_EQ(r.results_size(), 3);
  for (int i = 0; i < 3; ++i)
    for (int k = 0; k < 3; ++k)
      EXPECT_NEAR(r.results(i).probabilities(k), want[i][k].item<float>(), 1e-5) << i << " " << k;

  // Score answers the reference's bits per dimension.
  auto karm = LoadModel(models_.dir + "/karm.safetensors");
  ASSERT_TRUE(karm.ok());
  const at::Tensor raster = at::randint(0, 256, {2, 36}, gen, at::kLong);
  v1::ScoreRequest sreq;
  sreq.set_model("karm");
  for (int i = 0; i < 2; ++i)
    *sreq.add_images() = server::EncodeRawImage(raster[i].view({6, 6, 1}).to(at::kByte));
  grpc::ClientContext sctx;
  v1::ScoreResponse sr;
  ASSERT_TRUE(stub->Score(&sctx, sreq, &sr).ok());
  auto bpd = ScoreBitsPerDim(*karm->pixel, raster, {}, KrauseImpl::kReference);
  ASSERT_TRUE(bpd.ok());
  ASSERT_EQ(sr.bits_per_dim_size(), 2);
  for (int i = 0; i < 2; ++i) EXPECT_NEAR(sr.bits_per_dim(i), (*bpd)[i], 1e-5);

  // Generate completes on the fallback.
  v1::GenerateRequest g;
  g.set_model("karm-cond");
  g.set_label("one");
  g.set_num_images(2);
  g.set_seed(3);
  grpc::ClientContext gctx;
  auto reader = stub->Generate(&gctx, g);
  v1::GenerateResponse resp;
  int done = 0;
  while (reader->Read(&resp)) done += resp.images_size();
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_EQ(done, 2);
}

TEST_F(KernelCheckServer, AThrowingKernelFallsBackAndSaysWhy) {
  ASSERT_TRUE(cpu::SetCpuKernelsForTesting("fault_throw"));
  auto s = Start(server::KernelCheckMode::kFallback);
  ASSERT_TRUE(s.ok()) << s.status();
  const v1::ModelInfo m = List(**s).at("vit");
  EXPECT_EQ(m.implementation(), "windowed");
  ASSERT_EQ(m.kernel_checks_size(), 2);
  EXPECT_EQ(m.kernel_checks(0).result(), "error");
  EXPECT_THAT(m.kernel_checks(0).detail(), HasSubstr("fault injected"));
}

TEST_F(KernelCheckServer, StrictRefusesAModelWhoseKernelFails) {
  ASSERT_TRUE(cpu::SetCpuKernelsForTesting("fault_values"));
  auto s = Start(server::KernelCheckMode::kStrict);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.status().message(),
              HasSubstr("model vit: the kernel check (--kernel_check=strict)"));
  EXPECT_THAT(s.status().message(), HasSubstr("fused_cpu on cpu mismatch: max |diff|"));
}

TEST_F(KernelCheckServer, AForcedImplementationIsCheckedToo) {
  const std::string manifest = models_.dir + "/forced.json";
  WriteText(manifest, R"({"models": [
    {"name": "vit", "checkpoint": "vit.safetensors", "attention_impl": "windowed"},
    {"name": "karm", "checkpoint": "karm.safetensors", "attention_impl": "fused_cpu"}]})");
  {
    auto s = Start(server::KernelCheckMode::kFallback, manifest);
    ASSERT_TRUE(s.ok()) << s.status();
    const auto models = List(**s);
    EXPECT_EQ(models.at("vit").implementation(), "windowed");
    ASSERT_EQ(models.at("vit").kernel_checks_size(), 1);
    EXPECT_EQ(models.at("vit").kernel_checks(0).result(), "passed");
    EXPECT_EQ(models.at("karm").implementation(), "fused_cpu");
  }
  // Forced onto a faulty kernel: not served, even with fallback.
  ASSERT_TRUE(cpu::SetCpuKernelsForTesting("fault_values"));
  auto s = Start(server::KernelCheckMode::kFallback, manifest);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("model karm: the kernel check"));
  // A forced implementation the device cannot run is refused by name.
  WriteText(manifest, R"({"models": [
    {"name": "vit", "checkpoint": "vit.safetensors", "attention_impl": "cuda"}]})");
  auto cuda = Start(server::KernelCheckMode::kFallback, manifest);
  ASSERT_FALSE(cuda.ok());
  EXPECT_THAT(cuda.status().message(),
              HasSubstr("attention_impl cuda cannot serve a model on cpu"));
}

TEST_F(KernelCheckServer, OffServesTheFirstImplementationUnchecked) {
  auto s = Start(server::KernelCheckMode::kOff);
  ASSERT_TRUE(s.ok()) << s.status();
  const v1::ModelInfo m = List(**s).at("vit");
  EXPECT_EQ(m.implementation(), "fused_cpu");
  ASSERT_EQ(m.kernel_checks_size(), 1);
  EXPECT_EQ(m.kernel_checks(0).result(), "unchecked");
}

}  // namespace
}  // namespace krause::testing
