// A versioned model repository served at start-up (--models_dir REPO, --model_control none):
// the policy's versions are all served, a request without a version gets the newest and one
// with a version gets exactly that one (different weights, different answers), every reply and
// ModelInfo names its version, an unknown version is NOT_FOUND naming the served ones, and a
// corrupt version is skipped with its reason while the others serve.
#include <ATen/ATen.h>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "model/util/threads.h"
#include "server/v1/images.h"
#include "server_fixture.h"
#include "test_util.h"

namespace krause::testing {
namespace {

namespace fs = std::filesystem;
namespace v1 = krause::v1;

class RepositoryServing : public ::testing::Test {
 protected:
  void SetUp() override {
    krause::SetCpuThreads(1);
    repo_ = FreshDir("repository_serving");
    for (int v : {1, 2}) {
      auto vit = ViT::Create(TinyViTConfig(), /*seed=*/10 + v);
      ASSERT_TRUE(vit.ok());
      fs::create_directories(repo_ + "/vit/" + std::to_string(v));
      ASSERT_TRUE(SaveModel(repo_ + "/vit/" + std::to_string(v) + "/model.safetensors", *vit).ok());
    }
    fs::create_directories(repo_ + "/vit/3");
    WriteText(repo_ + "/vit/3/model.safetensors", "not a checkpoint");
    WriteText(repo_ + "/vit/config.json",
              R"({"max_batch_size": 8, "version_policy": {"latest": 3}})");
    auto karm = PixelModel::Create(TinyPixelModelConfig("krause", 6, 6, 1), 2);
    ASSERT_TRUE(karm.ok());
    fs::create_directories(repo_ + "/karm/1");
    WriteText(repo_ + "/karm/config.json", R"({"temperature": 0.5, "top_k": 3})");
    ASSERT_TRUE(SaveModel(repo_ + "/karm/1/model.safetensors", *karm).ok());
    server::ServerOptions o = LoopbackOptions("");
    o.models_dir = repo_;
    auto s = server::KrauseServer::Start(o);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(*s);
    stub_ = Stub(ClientFor(server_->port()));
  }

  grpc::Status Classify(const std::string& version, v1::ClassifyResponse* out) {
    v1::ClassifyRequest req;
    req.set_model("vit");
    req.set_version(version);
    req.set_return_probabilities(true);
    *req.add_images() = server::EncodeRawImage(at::full({8, 8, 1}, 77, at::kByte));
    grpc::ClientContext ctx;
    return stub_->Classify(&ctx, req, out);
  }

  std::string repo_;
  std::unique_ptr<server::KrauseServer> server_;
  std::unique_ptr<v1::KrauseService::Stub> stub_;
};

TEST_F(RepositoryServing, EveryPolicyVersionServesAndRepliesNameTheirVersion) {
  v1::ListModelsResponse list;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->ListModels(&ctx, v1::ListModelsRequest(), &list).ok());
  }
  std::vector<std::string> served;
  for (const auto& m : list.models()) served.push_back(m.name() + "@" + m.version());
  // Version 3 does not load: skipped, the others serve.
  EXPECT_EQ(served, (std::vector<std::string>{"karm@1", "vit@1", "vit@2"}));

  v1::ClassifyResponse newest, first, again;
  ASSERT_TRUE(Classify("", &newest).ok());
  ASSERT_TRUE(Classify("1", &first).ok());
  ASSERT_TRUE(Classify("2", &again).ok());
  EXPECT_EQ(newest.model_version(), "2");
  EXPECT_EQ(first.model_version(), "1");
  EXPECT_EQ(again.model_version(), "2");
  // Different weights answer: the probabilities differ between versions, not within one.
  EXPECT_NE(newest.results(0).probabilities(0), first.results(0).probabilities(0));
  EXPECT_EQ(newest.results(0).probabilities(0), again.results(0).probabilities(0));

  v1::ClassifyResponse none;
  const grpc::Status st = Classify("3", &none);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(st.error_message(), ::testing::HasSubstr("versions served: 1, 2"));

  v1::GetModelRequest get;
  get.set_name("vit");
  get.set_version("1");
  v1::ModelInfo info;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->GetModel(&ctx, get, &info).ok());
  }
  EXPECT_EQ(info.version(), "1");
  EXPECT_EQ(info.max_batch_size(), 8u);  // from config.json

  v1::GenerateRequest gen;
  gen.set_model("karm");
  gen.set_seed(1);
  grpc::ClientContext ctx;
  auto reader = stub_->Generate(&ctx, gen);
  v1::GenerateResponse msg;
  std::string version;
  while (reader->Read(&msg))
    if (msg.has_summary()) version = msg.summary().model_version();
  ASSERT_TRUE(reader->Finish().ok());
  EXPECT_EQ(version, "1");
}

// The model's sampling defaults (config.json here) fill what a request leaves unset: the same
// pixels as a request that sends them, other pixels than the engine's own defaults.
TEST_F(RepositoryServing, SamplingDefaultsFillUnsetFields) {
  auto pixels = [&](std::function<void(v1::GenerateRequest*)> set) {
    v1::GenerateRequest gen;
    gen.set_model("karm");
    gen.set_seed(5);
    gen.set_num_images(2);
    set(&gen);
    grpc::ClientContext ctx;
    auto reader = stub_->Generate(&ctx, gen);
    v1::GenerateResponse msg;
    std::string out(2 * 36, '\0');
    while (reader->Read(&msg))
      for (const auto& r : msg.rows())
        out.replace(r.image() * 36 + r.first_row() * 6, r.pixels().size(), r.pixels());
    EXPECT_TRUE(reader->Finish().ok());
    return out;
  };
  const std::string unset = pixels([](v1::GenerateRequest*) {});
  const std::string explicit_defaults = pixels([](v1::GenerateRequest* g) {
    g->set_temperature(0.5);
    g->set_top_k(3);
  });
  const std::string engine_defaults = pixels([](v1::GenerateRequest* g) {
    g->set_temperature(1.0);
    g->set_top_k(256);
  });
  EXPECT_EQ(unset, explicit_defaults);
  EXPECT_NE(unset, engine_defaults);

  v1::GetModelRequest get;
  get.set_name("karm");
  v1::ModelInfo info;
  grpc::ClientContext ctx;
  ASSERT_TRUE(stub_->GetModel(&ctx, get, &info).ok());
  EXPECT_EQ(info.default_temperature(), 0.5f);
  EXPECT_EQ(info.default_top_k(), 3u);
  EXPECT_FALSE(info.has_default_top_p());
  EXPECT_FALSE(info.has_default_guidance());
}

}  // namespace
}  // namespace krause::testing
