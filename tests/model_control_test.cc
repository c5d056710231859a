// Model control end to end (server/core/model_control.h, --model_control poll|explicit): versions
// swapped under load without a failed call or a mixed reply, the old version freed after its
// last call (its KV gauge back to 0), a corrupt version that changes nothing, unloading with
// streams in flight, admin tokens, the modes' refusals, loads of one model at once, reloads of
// changed files. Outcomes are decided by replies and states, never by sleeping: polls run
// through ModelControl::PollNow, and waits poll a condition with a deadline.
// The model repository extension of the Open Inference Protocol and explicit mode's start-up
// loads: model_control_repository_test.cc.
#include "model_control_test.h"

#include <ATen/ATen.h>

#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "inference/grpc_predict_v2.grpc.pb.h"
#include "server/core/served_generator.h"
#include "test_util.h"

namespace krause::testing {
namespace {

namespace fs = std::filesystem;
namespace v1 = krause::v1;
using ::testing::HasSubstr;

// The gauge line of `family` for a model version ("" when absent).
std::string GaugeLine(const std::string& scrape, const std::string& family,
                      const std::string& model, const std::string& version) {
  const std::string head = family + "{model=\"" + model + "\",version=\"" + version + "\"} ";
  const size_t at = scrape.find(head);
  if (at == std::string::npos) return "";
  return scrape.substr(at + head.size(), scrape.find('\n', at) - at - head.size());
}

TEST_F(ModelControlTest, PolledNewVersionSwapsUnderLoadWithoutAFailedCallOrAMix) {
  PutVit(1, 11);
  PutKarm(1, 21);
  Start("poll");
  std::atomic<bool> stop{false}, switched{false};
  std::mutex mu;
  std::vector<std::string> failures;
  int before[3] = {0, 0, 0}, after[3] = {0, 0, 0};  // calls by version, by start time
  const auto note = [&](bool started_after, const grpc::Status& st, const std::string& v) {
    std::lock_guard<std::mutex> lock(mu);
    if (!st.ok()) failures.push_back(st.error_message());
    const int i = v == "1" ? 1 : v == "2" ? 2 : 0;
    (started_after ? after : before)[i]++;
  };
  std::vector<std::thread> load;
  load.emplace_back([&] {
    while (!stop) {
      const bool started_after = switched;
      v1::ClassifyResponse r;
      const grpc::Status st = Classify(&r);
      note(started_after, st, r.model_version());
    }
  });
  for (int t = 0; t < 2; ++t)
    load.emplace_back([&] {
      auto stub = Stub(ClientFor(server_->port()));
      while (!stop) {
        const bool started_after = switched;
        std::string version;
        const grpc::Status st = Generate(&version, stub.get());
        note(started_after, st, version);
      }
    });
  ASSERT_TRUE(Eventually([&] {
    std::lock_guard<std::mutex> lock(mu);
    return before[1] >= 10;
  }));
  PutVit(2, 12);
  PutKarm(2, 22);
  server_->model_control()->PollNow();  // loads 2, then retires 1
  switched = true;
  ASSERT_TRUE(Eventually([&] {
    std::lock_guard<std::mutex> lock(mu);
    return after[2] >= 10;
  }));
  stop = true;
  for (auto& t : load) t.join();
  EXPECT_TRUE(failures.empty()) << failures.size() << " failed, first: " << failures[0];
  EXPECT_EQ(before[0] + after[0], 0) << "a reply without a version";
  EXPECT_EQ(after[1], 0) << "a call started after the switch was answered by version 1";
  EXPECT_GT(after[2], 0);
  // Version 1 is freed after its last call: UNAVAILABLE, and its cache gauges read 0.
  ASSERT_TRUE(Eventually([&] {
    const auto idx = Index();
    return std::count(idx.begin(), idx.end(), "karm@1 UNAVAILABLE") == 1 &&
           std::count(idx.begin(), idx.end(), "vit@1 UNAVAILABLE") == 1;
  })) << ::testing::PrintToString(Index());
  EXPECT_EQ(Index(/*ready_only=*/true), (std::vector<std::string>{"karm@2 READY", "vit@2 READY"}));
  const std::string scrape = server_->metrics().Scrape();
  EXPECT_EQ(GaugeLine(scrape, "krause_kv_cache_bytes", "karm", "1"), "0");
  EXPECT_NE(GaugeLine(scrape, "krause_kv_cache_bytes", "karm", "2"), "0");
  EXPECT_NE(GaugeLine(scrape, "krause_kv_cache_bytes", "karm", "2"), "");
}

TEST_F(ModelControlTest, ThePollTimerAppliesARemovedVersion) {
  PutVit(1, 11);
  PutVit(2, 12);
  server::ServerOptions o = LoopbackOptions("");
  o.models_dir = repo_;
  o.model_control = "poll";
  o.repository_poll_seconds = 0.05;
  auto s = server::KrauseServer::Start(o);
  ASSERT_TRUE(s.ok()) << s.status();
  server_ = std::move(*s);
  stub_ = Stub(ClientFor(server_->port()));
  v1::ClassifyResponse r;
  ASSERT_TRUE(Classify(&r).ok());
  EXPECT_EQ(r.model_version(), "2");
  fs::remove_all(repo_ + "/vit/2");  // the policy (latest 1) falls back to version 1
  ASSERT_TRUE(Eventually([&] { return Classify(&r).ok() && r.model_version() == "1"; }));
}

TEST_F(ModelControlTest, ACorruptVersionFailsWithItsReasonAndChangesNothing) {
  PutVit(2, 12);
  Start("explicit");
  fs::create_directories(repo_ + "/vit/3");
  WriteText(repo_ + "/vit/3/model.safetensors", "not a checkpoint");
  const grpc::Status st = Load("vit");
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(st.error_message(), HasSubstr("vit version 3 failed to load"));
  EXPECT_EQ(Index(), (std::vector<std::string>{"vit@2 READY", "vit@3 FAILED"}));
  v1::RepositoryIndexResponse idx;
  grpc::ClientContext ctx;
  ASSERT_TRUE(stub_->RepositoryIndex(&ctx, v1::RepositoryIndexRequest(), &idx).ok());
  EXPECT_THAT(idx.models(1).reason(), HasSubstr("model.safetensors"));
  v1::ClassifyResponse r;
  ASSERT_TRUE(Classify(&r).ok());
  EXPECT_EQ(r.model_version(), "2");
  // A poll does not retry it until its files change (explicit mode: only on request).
  server_->model_control()->PollNow();
  EXPECT_EQ(Index(), (std::vector<std::string>{"vit@2 READY", "vit@3 FAILED"}));
  // Fixed files load.
  fs::remove(repo_ + "/vit/3/model.safetensors");
  PutVit(3, 13);
  ASSERT_TRUE(Load("vit").ok());
  EXPECT_EQ(Index(/*ready_only=*/true), (std::vector<std::string>{"vit@3 READY"}));
}

TEST_F(ModelControlTest, UnloadWithStreamsInFlightLetsThemFinish) {
  PutKarm(1, 21);
  // The decode thread is held after its first step until the unload is done: the streams are
  // in flight for certain.
  std::mutex mu;
  std::condition_variable cv;
  bool hold = false;  // from after the start-up (its warm-up runs a step too)
  server::WorkerHooks hooks;
  hooks.on_decode_step = [&](const std::string&, const server::DecodeEvent&) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return !hold; });
  };
  Start("explicit", "", "", hooks);
  {
    std::lock_guard<std::mutex> lock(mu);
    hold = true;
  }
  std::vector<std::unique_ptr<grpc::ClientContext>> ctxs;
  std::vector<std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>>> readers;
  for (int i = 0; i < 3; ++i) {
    v1::GenerateRequest req;
    req.set_model("karm");
    req.set_seed(i);
    ctxs.push_back(std::make_unique<grpc::ClientContext>());
    readers.push_back(stub_->Generate(ctxs.back().get(), req));
  }
  auto karm = server_->registry().Find<server::ServedGenerator>("karm");
  ASSERT_TRUE(karm.ok());
  // Each call holds a reference to the version it resolved (its book): the registry's, ours and
  // three calls'.
  ASSERT_TRUE(Eventually([&] { return karm->use_count() >= 5; })) << karm->use_count();
  karm->reset();
  ASSERT_TRUE(Unload("karm").ok());
  std::string version;
  const grpc::Status refused = Generate(&version);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(refused.error_message(), HasSubstr("model karm is unloaded"));
  EXPECT_EQ(Index(), (std::vector<std::string>{"karm@1 UNLOADING"}));
  {
    std::lock_guard<std::mutex> lock(mu);
    hold = false;
  }
  cv.notify_all();
  for (auto& reader : readers) {
    v1::GenerateResponse r;
    std::string v;
    while (reader->Read(&r))
      if (r.has_summary()) v = r.summary().model_version();
    EXPECT_TRUE(reader->Finish().ok());
    EXPECT_EQ(v, "1");
  }
  ASSERT_TRUE(Eventually([&] { return Index() == std::vector<std::string>{"karm@1 UNAVAILABLE"}; }))
      << ::testing::PrintToString(Index());
  EXPECT_EQ(Unload("karm").error_code(), grpc::StatusCode::NOT_FOUND);
  ASSERT_TRUE(Load("karm").ok());
  ASSERT_TRUE(Generate(&version).ok());
  EXPECT_EQ(version, "1");
}

TEST_F(ModelControlTest, ModelControlNeedsAnAdminToken) {
  PutVit(1, 11);
  const std::string serving = repo_ + "/tokens", admin = repo_ + "/admin";
  WriteText(serving, "serve-token\n");
  WriteText(admin, "admin-token\n");
  Start("explicit", serving, admin);
  const auto index_with = [&](const std::string& token) {
    grpc::ClientContext ctx;
    if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
    v1::RepositoryIndexResponse r;
    return stub_->RepositoryIndex(&ctx, v1::RepositoryIndexRequest(), &r).error_code();
  };
  EXPECT_EQ(index_with("serve-token"), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(index_with(""), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(index_with("nope"), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(index_with("admin-token"), grpc::StatusCode::OK);
  {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer serve-token");
    v1::UnloadModelRequest req;
    req.set_name("vit");
    v1::UnloadModelResponse r;
    EXPECT_EQ(stub_->UnloadModel(&ctx, req, &r).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  }
  // Nothing changed; an admin token serves too.
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", "Bearer admin-token");
  v1::ListModelsResponse list;
  ASSERT_TRUE(stub_->ListModels(&ctx, v1::ListModelsRequest(), &list).ok());
  EXPECT_EQ(list.models_size(), 1);
}

TEST_F(ModelControlTest, ModesRefuseWhatTheyDoNotAllow) {
  PutVit(1, 11);
  for (const std::string mode : {"none", "poll"}) {
    Start(mode);
    const grpc::Status st = Load("vit");
    EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << mode;
    EXPECT_THAT(st.error_message(), HasSubstr("--model_control explicit"));
    EXPECT_EQ(Unload("vit").error_code(), grpc::StatusCode::FAILED_PRECONDITION) << mode;
    EXPECT_EQ(Index(), (std::vector<std::string>{"vit@1 READY"})) << mode;
    server_.reset();
  }
  // A manifest's models are fixed: explicit control is refused at start-up.
  const TinyModels t = WriteTinyModels("model_control_manifest");
  server::ServerOptions o = LoopbackOptions(t.manifest);
  o.model_control = "explicit";
  auto s = server::KrauseServer::Start(o);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("needs a versioned repository"));
  o.model_control = "sometimes";
  EXPECT_THAT(server::KrauseServer::Start(o).status().message(),
              HasSubstr("not none, poll or explicit"));
  fs::remove_all(t.dir);
}

TEST_F(ModelControlTest, BadRequestsNameTheProblem) {
  PutVit(1, 11);
  Start("explicit");
  EXPECT_EQ(Load("").error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Load("vit", "x1").error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Load("vit", "0").error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  const grpc::Status unknown = Load("nope");
  EXPECT_EQ(unknown.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(unknown.error_message(), HasSubstr("nope is not in the repository"));
  EXPECT_EQ(Load("vit", "9").error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(Unload("nope").error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(Unload("vit", "9").error_code(), grpc::StatusCode::NOT_FOUND);
  fs::create_directories(repo_ + "/vit");
  WriteText(repo_ + "/vit/config.json", R"({"max_batch_size": "eight"})");
  const grpc::Status bad_config = Load("vit");
  EXPECT_EQ(bad_config.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(bad_config.error_message(), HasSubstr("max_batch_size"));
  EXPECT_EQ(Index(), (std::vector<std::string>{"vit@ FAILED", "vit@1 READY"}));
  v1::ClassifyResponse r;
  EXPECT_TRUE(Classify(&r).ok());
}

TEST_F(ModelControlTest, ConcurrentLoadsOfOneModelLeaveOneCopy) {
  PutVit(1, 11);
  Start("explicit");
  PutVit(2, 12);
  std::vector<std::thread> loads;
  std::atomic<int> ok{0};
  for (int i = 0; i < 4; ++i)
    loads.emplace_back([&] {
      auto stub = Stub(ClientFor(server_->port()));
      v1::LoadModelRequest req;
      req.set_name("vit");
      v1::LoadModelResponse r;
      grpc::ClientContext ctx;
      if (stub->LoadModel(&ctx, req, &r).ok()) ++ok;
    });
  for (auto& t : loads) t.join();
  EXPECT_EQ(ok, 4);  // one loads, the others wait and find it loaded
  v1::ListModelsResponse list;
  grpc::ClientContext ctx;
  ASSERT_TRUE(stub_->ListModels(&ctx, v1::ListModelsRequest(), &list).ok());
  ASSERT_EQ(list.models_size(), 1);
  EXPECT_EQ(list.models(0).version(), "2");
}

TEST_F(ModelControlTest, ChangedFilesReloadTheSameVersion) {
  PutVit(1, 11);
  Start("explicit");
  v1::ClassifyResponse a, b, c;
  ASSERT_TRUE(Classify(&a).ok());
  ASSERT_TRUE(Load("vit").ok());  // unchanged: nothing reloads
  ASSERT_TRUE(Classify(&b).ok());
  EXPECT_EQ(a.results(0).probabilities(0), b.results(0).probabilities(0));
  fs::remove(repo_ + "/vit/1/model.safetensors");
  PutVit(1, 99);
  ASSERT_TRUE(Load("vit").ok());
  ASSERT_TRUE(Classify(&c).ok());
  EXPECT_EQ(c.model_version(), "1");
  EXPECT_NE(a.results(0).probabilities(0), c.results(0).probabilities(0));
}

TEST_F(ModelControlTest, AnUnloadedModelIsNotReadyInTheOpenInferenceProtocol) {
  PutVit(1, 11);
  Start("explicit");
  auto channel = client::MakeChannel(ClientFor(server_->port()));
  ASSERT_TRUE(channel.ok());
  auto oip = inference::GRPCInferenceService::NewStub(*channel);
  const auto ready = [&] {
    inference::ModelReadyRequest req;
    req.set_name("vit");
    inference::ModelReadyResponse r;
    grpc::ClientContext ctx;
    EXPECT_TRUE(oip->ModelReady(&ctx, req, &r).ok());
    return r.ready();
  };
  EXPECT_TRUE(ready());
  ASSERT_TRUE(Unload("vit").ok());
  EXPECT_FALSE(ready());
  ASSERT_TRUE(Load("vit").ok());
  EXPECT_TRUE(ready());
}

TEST_F(ModelControlTest, ALoadWithNothingThePolicyCanLoadFails) {
  PutVit(1, 11);
  Start("explicit");
  WriteText(repo_ + "/vit/config.json", R"({"version_policy": {"specific": [7]}})");
  const grpc::Status st = Load("vit");
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(st.error_message(), HasSubstr("no version its version_policy can load"));
  v1::ClassifyResponse r;
  ASSERT_TRUE(Classify(&r).ok());  // version 1 still serves
  EXPECT_EQ(r.model_version(), "1");
}

}  // namespace
}  // namespace krause::testing
