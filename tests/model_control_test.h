// The model control tests' fixture (model_control_test.cc, model_control_repository_test.cc): a
// model repository written on disk, a krause-server in process over it with --model_control poll
// or explicit (and the REST port where asked), and the calls and waits the tests share.
#pragma once

#include <ATen/ATen.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "model/util/threads.h"
#include "server/v1/images.h"
#include "server_fixture.h"

namespace krause::testing {

// Waits (polling, with a deadline) until `done` holds; the test asserts on the result.
template <typename F>
bool Eventually(F done, std::chrono::seconds limit = std::chrono::seconds(30)) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return done();
}

// protobuf's map code inlined into a ThreadSanitizer build disagrees with Debian's uninstrumented
// libprotobuf: a request with a map field (RepositoryModelLoad's and Unload's `parameters`) crashes
// there, even empty. scripts/sanitize.sh runs this test, so those gRPC calls run in the other
// builds only, and the same operations go over REST under TSan.
#if defined(__SANITIZE_THREAD__)
constexpr bool kProtobufMapsWork = false;
#else
constexpr bool kProtobufMapsWork = true;
#endif

class ModelControlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    krause::SetCpuThreads(1);
    repo_ = FreshDir("model_control");
  }
  void TearDown() override {
    server_.reset();
    std::filesystem::remove_all(repo_);
  }

  void PutVit(int version, int seed) {
    auto vit = ViT::Create(TinyViTConfig(), seed);
    ASSERT_TRUE(vit.ok());
    const std::string dir = repo_ + "/vit/" + std::to_string(version);
    std::filesystem::create_directories(dir);
    ASSERT_TRUE(SaveModel(dir + "/model.safetensors", *vit).ok());
  }
  // A 12x12x3 KARM: streams of 432 subpixels, long enough to be in flight during a swap.
  void PutKarm(int version, int seed) {
    auto karm = PixelModel::Create(TinyPixelModelConfig("krause", 12, 12, 3), seed);
    ASSERT_TRUE(karm.ok());
    const std::string dir = repo_ + "/karm/" + std::to_string(version);
    std::filesystem::create_directories(dir);
    ASSERT_TRUE(SaveModel(dir + "/model.safetensors", *karm).ok());
  }

  void Start(const std::string& mode, const std::string& auth = "", const std::string& admin = "",
             const server::WorkerHooks& hooks = {}) {
    server::ServerOptions o = LoopbackOptions("");
    o.models_dir = repo_;
    o.model_control = mode;
    if (mode == "explicit") o.load_models = load_models_;
    o.repository_poll_seconds = 3600;  // polls run through PollNow
    o.auth_tokens_file = auth;
    o.admin_tokens_file = admin;
    if (rest_) o.http_listen = "127.0.0.1:0";
    auto s = server::KrauseServer::Start(o, hooks);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(*s);
    stub_ = Stub(ClientFor(server_->port()));
  }

  grpc::Status Classify(v1::ClassifyResponse* out, const std::string& version = "") {
    v1::ClassifyRequest req;
    req.set_model("vit");
    req.set_version(version);
    req.set_return_probabilities(true);
    *req.add_images() = server::EncodeRawImage(at::full({8, 8, 1}, 77, at::kByte));
    grpc::ClientContext ctx;
    return stub_->Classify(&ctx, req, out);
  }

  // A whole Generate stream: its status and the summary's version.
  grpc::Status Generate(std::string* version, v1::KrauseService::Stub* stub = nullptr) {
    v1::GenerateRequest req;
    req.set_model("karm");
    req.set_seed(7);
    grpc::ClientContext ctx;
    auto reader = (stub ? stub : stub_.get())->Generate(&ctx, req);
    v1::GenerateResponse r;
    while (reader->Read(&r))
      if (r.has_summary()) *version = r.summary().model_version();
    return reader->Finish();
  }

  std::vector<std::string> Index(bool ready_only = false) {
    v1::RepositoryIndexRequest req;
    req.set_ready_only(ready_only);
    v1::RepositoryIndexResponse r;
    grpc::ClientContext ctx;
    const grpc::Status st = stub_->RepositoryIndex(&ctx, req, &r);
    EXPECT_TRUE(st.ok()) << st.error_message();
    std::vector<std::string> out;
    for (const auto& e : r.models())
      out.push_back(e.name() + "@" + e.version() + " " +
                    v1::RepositoryEntry::State_Name(e.state()));
    return out;
  }

  grpc::Status Load(const std::string& name, const std::string& version = "",
                    v1::LoadModelResponse* out = nullptr) {
    v1::LoadModelRequest req;
    req.set_name(name);
    req.set_version(version);
    v1::LoadModelResponse r;
    grpc::ClientContext ctx;
    return stub_->LoadModel(&ctx, req, out ? out : &r);
  }
  grpc::Status Unload(const std::string& name, const std::string& version = "") {
    v1::UnloadModelRequest req;
    req.set_name(name);
    req.set_version(version);
    v1::UnloadModelResponse r;
    grpc::ClientContext ctx;
    return stub_->UnloadModel(&ctx, req, &r);
  }

  std::string repo_;
  bool rest_ = false;                             // Start() with the REST port on
  std::vector<std::string> load_models_ = {"*"};  // explicit mode: what Start() loads
  std::unique_ptr<server::KrauseServer> server_;
  std::unique_ptr<v1::KrauseService::Stub> stub_;
};

}  // namespace krause::testing
