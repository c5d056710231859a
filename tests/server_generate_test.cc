// End-to-end tests of krause-server's Generate (in process, on loopback ports; server_test.h):
// streamed rows, images and summary, rate-limited messages, completion, validation, client
// cancel, deadlines, full queues and the start of a call that waits for a slot; generation over
// REST whose client leaves or whose timeout passes; the statistics of the calls over every
// protocol; and Score against the model.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <unistd.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "inference/grpc_predict_v2.grpc.pb.h"
#include "model/engine/decode_engine.h"
#include "server_test.h"
#include "test_util.h"

namespace krause::testing {
namespace {

TEST_F(ServerTest, GenerateStreamsRowsImagesAndSummary) {
  v1::GenerateRequest req;
  req.set_num_images(3);
  req.set_seed(11);
  req.set_update_interval_ms(10);
  const Stream s = RunGenerate(*stub_, req);
  ASSERT_TRUE(s.status.ok()) << s.status.error_message();
  ASSERT_FALSE(s.messages.empty());
  const auto rows = RowsOf(s);
  const auto pngs = PngsOf(s);
  ASSERT_EQ(rows.size(), 3u);
  ASSERT_EQ(pngs.size(), 3u);
  for (uint32_t i = 0; i < 3; ++i) {
    EXPECT_EQ(rows.at(i).size(), 36u);
    EXPECT_EQ(rows.at(i), pngs.at(i)) << "streamed rows and the final PNG agree";
  }
  const auto& last = s.messages.back();
  ASSERT_TRUE(last.has_summary());
  for (size_t i = 0; i + 1 < s.messages.size(); ++i) EXPECT_FALSE(s.messages[i].has_summary());
  EXPECT_EQ(last.summary().model(), "karm");
  EXPECT_EQ(last.summary().images(), 3u);
  EXPECT_EQ(last.summary().pixels_generated(), 3u * 36);
  EXPECT_EQ(last.summary().seed(), 11u);
  EXPECT_GT(last.summary().flops_executed(), 0);
  EXPECT_EQ(last.progress().pixels_done(), last.progress().pixels_total());
  EXPECT_EQ(last.progress().images_done(), 3u);
  // Progress never goes back.
  for (size_t i = 1; i < s.messages.size(); ++i)
    EXPECT_GE(s.messages[i].progress().pixels_done(), s.messages[i - 1].progress().pixels_done());

  // Image i draws from its own stream, whatever else runs: image 1 alone (the call's seed with
  // first_image 1, or its own seed as a one-image call) gives the same pixels, and so does the
  // same model driven directly through the engine.
  const uint64_t own = server::ImageSeed(11, 1);
  v1::GenerateRequest one;
  one.set_seed(own);
  const Stream alone = RunGenerate(*stub_, one);
  ASSERT_TRUE(alone.status.ok());
  EXPECT_EQ(PngsOf(alone).at(0), pngs.at(1));
  EXPECT_EQ(alone.messages.back().images(0).seed(), own);
  v1::GenerateRequest resumed;
  resumed.set_seed(11);
  resumed.set_first_image(1);
  const Stream again = RunGenerate(*stub_, resumed);
  ASSERT_TRUE(again.status.ok());
  EXPECT_EQ(PngsOf(again).at(0), pngs.at(1));
  EXPECT_EQ(again.messages.front().start().first_image(), 1u);
  auto m = LoadModel(models_.dir + "/karm.safetensors");
  ASSERT_TRUE(m.ok());
  auto engine = DecodeEngine::Create(m->pixel.get(), EngineOptions{});
  ASSERT_TRUE(engine.ok());
  GenerationRequest g;
  g.sampling.seed = own;
  at::NoGradGuard no_grad;
  ASSERT_TRUE((*engine)->Submit(std::move(g)).ok());
  auto finished = RunUntilIdle(engine->get());
  ASSERT_EQ(finished.size(), 1u);
  EXPECT_TRUE(finished.begin()->second.status.ok());
  const std::vector<uint8_t> direct = finished.begin()->second.image;
  EXPECT_EQ(std::string(direct.begin(), direct.end()), pngs.at(1));
}

TEST_F(ServerTest, GenerateRateLimitsMessages) {
  v1::GenerateRequest req;
  req.set_model("karm-big");  // 768 subpixels: hundreds of steps
  req.set_update_interval_ms(10000);
  const Stream s = RunGenerate(*stub_, req);
  ASSERT_TRUE(s.status.ok());
  // Far fewer messages than rows: rows are chunked.
  EXPECT_LE(s.messages.size(), 3u);
  EXPECT_EQ(RowsOf(s).at(0).size(), 768u);
  v1::GenerateRequest quiet = req;
  quiet.set_stream_rows(false);
  quiet.set_update_interval_ms(10);
  const Stream q = RunGenerate(*stub_, quiet);
  ASSERT_TRUE(q.status.ok());
  EXPECT_TRUE(RowsOf(q).empty());
  EXPECT_EQ(PngsOf(q).size(), 1u);
}

TEST_F(ServerTest, CompletionKeepsThePromptRows) {
  const at::Tensor prompt = RandomImages(1, 6, 6, 1, 9)[0];
  auto png = EncodePng(prompt);
  ASSERT_TRUE(png.ok());
  v1::GenerateRequest req;
  req.set_model("arm");
  req.set_num_images(2);
  req.mutable_prompt()->set_png(*png);
  req.set_prompt_rows(4);
  const Stream s = RunGenerate(*stub_, req);
  ASSERT_TRUE(s.status.ok()) << s.status.error_message();
  const std::string want(reinterpret_cast<const char*>(prompt.data_ptr<uint8_t>()), 24);
  for (const auto& [i, px] : PngsOf(s)) EXPECT_EQ(px.substr(0, 24), want) << i;
  EXPECT_EQ(s.messages.back().summary().pixels_generated(), 2u * 12);
  // A prompt taller than needed is fine (only its first rows count).
  const at::Tensor tall = RandomImages(1, 6, 6, 1, 10)[0];
  req.mutable_prompt()->clear_png();
  *req.mutable_prompt() = RawImage(tall);
  req.set_prompt_rows(1);
  const Stream t = RunGenerate(*stub_, req);
  ASSERT_TRUE(t.status.ok());
  EXPECT_EQ(PngsOf(t).at(0).substr(0, 6),
            std::string(reinterpret_cast<const char*>(tall.data_ptr<uint8_t>()), 6));
}

TEST_F(ServerTest, GenerateValidation) {
  struct Case {
    std::function<void(v1::GenerateRequest*)> make;
    grpc::StatusCode code;
    std::string message;
    std::string field = "";  // google.rpc.BadRequest's field (INVALID_ARGUMENT)
  };
  const at::Tensor wide = RandomImages(1, 6, 7, 1, 1)[0];
  const at::Tensor ok = RandomImages(1, 6, 6, 1, 1)[0];
  const std::vector<Case> cases = {
      {[](v1::GenerateRequest* r) { r->set_num_images(9); }, grpc::StatusCode::INVALID_ARGUMENT,
       "num_images is 9; model karm allows at most 8", "num_images"},
      {[](v1::GenerateRequest* r) { r->set_temperature(-1); }, grpc::StatusCode::INVALID_ARGUMENT,
       "temperature must be in [0, 100]", "temperature"},
      {[](v1::GenerateRequest* r) { r->set_top_p(0); }, grpc::StatusCode::INVALID_ARGUMENT,
       "top_p must be in (0, 1]", "top_p"},
      {[](v1::GenerateRequest* r) { r->set_top_k(300); }, grpc::StatusCode::INVALID_ARGUMENT,
       "top_k must be in [0, 256]", "top_k"},
      {[](v1::GenerateRequest* r) { r->set_update_interval_ms(5); },
       grpc::StatusCode::INVALID_ARGUMENT, "update_interval_ms", "update_interval_ms"},
      {[](v1::GenerateRequest* r) { r->set_prompt_rows(2); }, grpc::StatusCode::INVALID_ARGUMENT,
       "prompt_rows is 2 but there is no prompt", "prompt_rows"},
      {[&](v1::GenerateRequest* r) {
         *r->mutable_prompt() = RawImage(wide);
         r->set_prompt_rows(2);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "takes prompts of width 6", "prompt"},
      {[&](v1::GenerateRequest* r) {
         *r->mutable_prompt() = RawImage(ok);
         r->set_prompt_rows(6);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "prompt_rows must be in [1, 5]", "prompt_rows"},
      {[&](v1::GenerateRequest* r) { r->mutable_prompt()->set_png("junk"); },
       grpc::StatusCode::INVALID_ARGUMENT, "prompt.png is not a readable PNG", "prompt.png"},
      {[](v1::GenerateRequest* r) { r->set_model("vit"); }, grpc::StatusCode::FAILED_PRECONDITION,
       "not a generator"},
      {[](v1::GenerateRequest* r) { r->set_model("x"); }, grpc::StatusCode::NOT_FOUND,
       "not served"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    v1::GenerateRequest req;
    cases[i].make(&req);
    const Stream s = RunGenerate(*stub_, req);
    EXPECT_EQ(s.status.error_code(), cases[i].code) << i << ": " << s.status.error_message();
    EXPECT_THAT(s.status.error_message(), ::testing::HasSubstr(cases[i].message)) << i;
    EXPECT_TRUE(s.messages.empty()) << i;
    const server::ErrorDetails d = server::DetailsOf(s.status);
    if (cases[i].code == grpc::StatusCode::INVALID_ARGUMENT) {
      ASSERT_EQ(d.fields.size(), 1u) << i;
      EXPECT_EQ(d.fields[0].first, cases[i].field) << i;
    }
  }
  EXPECT_TRUE(SlotsFree("karm"));
}

TEST_F(ServerTest, ClientCancelStopsGenerationAndFreesTheSlot) {
  grpc::ClientContext ctx;
  v1::GenerateRequest req;
  req.set_model("karm-big");
  req.set_update_interval_ms(10);
  auto reader = stub_->Generate(&ctx, req);
  v1::GenerateResponse m;
  ASSERT_TRUE(reader->Read(&m));
  EXPECT_EQ(Worker("karm-big").active(), 1);
  ctx.TryCancel();
  while (reader->Read(&m)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(SlotsFree("karm-big"));
  // The one slot serves the next call.
  v1::GenerateRequest next;
  next.set_model("karm-big");
  next.set_stream_rows(false);
  EXPECT_TRUE(RunGenerate(*stub_, next).status.ok());
}

// A REST generation whose client goes away is cancelled: its cache slot is free again at the
// next decode step (the slots gauge back to 0), long before the image would have been done (768
// steps of 20 ms: 15 s; SlotsFree waits 5 s at most), and the slot serves the next call.
TEST_F(ServerTest, RestGenerationWhoseClientLeavesFreesItsSlots) {
  server_->Shutdown();
  server::ServerOptions o = LoopbackOptions(models_.manifest);
  o.http_listen = "127.0.0.1:0";
  StartServer(o, {}, milliseconds(20));
  const int fd = SendHttp(server_->http_port(),
                          InferPost("karm-big", R"({"inputs": [], "parameters": {"seed": 3}})"));
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(Eventually([&] { return Worker("karm-big").active() == 1; }));
  close(fd);  // the client leaves mid-generation
  EXPECT_TRUE(SlotsFree("karm-big"));
  const auto g = Served<server::ServedGenerator>("karm-big").Gauges();
  ASSERT_TRUE(g.cache.has_value());
  EXPECT_EQ(g.cache->slots_in_use, 0);
  // The slot serves the next call.
  v1::GenerateRequest next;
  next.set_model("karm-big");
  next.set_num_images(1);
  grpc::ClientContext ctx;
  auto reader = stub_->Generate(&ctx, next);
  v1::GenerateResponse m;
  ASSERT_TRUE(reader->Read(&m));
  EXPECT_TRUE(Eventually([&] { return Worker("karm-big").active() == 1; }));
  ctx.TryCancel();
  while (reader->Read(&m)) {
  }
  reader->Finish();
}

// A REST inference has a deadline: its `timeout` parameter (microseconds), else the server's
// default; past it the work stops (the slot is freed) and the reply is 504.
TEST_F(ServerTest, RestGenerationStopsAtItsTimeoutParameter) {
  server_->Shutdown();
  server::ServerOptions o = LoopbackOptions(models_.manifest);
  o.http_listen = "127.0.0.1:0";
  StartServer(o, {}, milliseconds(20));
  const int fd = SendHttp(server_->http_port(), InferPost("karm-big", R"({"inputs": [],
      "parameters": {"timeout": 50000}})"));
  ASSERT_GE(fd, 0);
  const std::string reply = ReadAll(fd);
  close(fd);
  EXPECT_NE(reply.find("HTTP/1.1 504"), std::string::npos) << reply;
  EXPECT_NE(reply.find("deadline exceeded"), std::string::npos) << reply;
  EXPECT_TRUE(SlotsFree("karm-big"));
}

// The statistics extension counts the inference calls made, through every protocol, per model
// version: successes and failures with their time, images, queue waits, and the batches that ran
// them (their sizes adding up to the images); gRPC and REST give the same figures.
TEST_F(ServerTest, StatisticsCountTheCallsMadeOverEveryProtocol) {
  server_->Shutdown();
  server::ServerOptions o = LoopbackOptions(models_.manifest);
  o.http_listen = "127.0.0.1:0";
  StartServer(o);
  const at::Tensor images = RandomImages(3, 8, 8, 1, 5);
  for (int call = 0; call < 2; ++call) {  // two krause.v1 Classify calls of 3 images
    v1::ClassifyRequest req;
    req.set_model("vit");
    for (int i = 0; i < 3; ++i) *req.add_images() = RawImage(images[i]);
    v1::ClassifyResponse r;
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->Classify(&ctx, req, &r).ok());
  }
  {  // one that fails (a 9x8 image): counted as a failure of vit
    v1::ClassifyRequest req;
    req.set_model("vit");
    *req.add_images() = RawImage(RandomImages(1, 9, 8, 1, 1)[0]);
    v1::ClassifyResponse r;
    grpc::ClientContext ctx;
    ASSERT_EQ(stub_->Classify(&ctx, req, &r).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
  // One REST infer of one image.
  std::string data;
  for (int i = 0; i < 64; ++i) data += (i ? "," : "") + std::to_string(i);
  const std::string body =
      R"({"inputs":[{"name":"image","datatype":"UINT8","shape":[1,8,8,1],"data":[)" + data + "]}]}";
  std::string post = InferPost("vit", body);
  post.replace(post.find("HTTP/1.1"), 8, "HTTP/1.0");  // the server closes after the answer
  ASSERT_NE(RawHttp(server_->http_port(), post).find(" 200 "), std::string::npos);
  auto channel = client::MakeChannel(conn_);
  ASSERT_TRUE(channel.ok());
  auto oip = inference::GRPCInferenceService::NewStub(*channel);
  const auto stats = [&](const std::string& name, const std::string& version,
                         inference::ModelStatisticsResponse* r) {
    inference::ModelStatisticsRequest req;
    req.set_name(name);
    req.set_version(version);
    grpc::ClientContext ctx;
    return oip->ModelStatistics(&ctx, req, r);
  };
  // The batches are reported when they end, which may be just after their calls' answers.
  inference::ModelStatisticsResponse r;
  ASSERT_TRUE(Eventually([&] {
    r.Clear();
    if (!stats("vit", "", &r).ok() || r.model_stats_size() != 1) return false;
    uint64_t images = 0;
    for (const auto& b : r.model_stats(0).batch_stats())
      images += b.batch_size() * b.compute_infer().count();
    return images == 7;
  })) << r.DebugString();
  const inference::ModelStatistics& m = r.model_stats(0);
  EXPECT_EQ(m.name(), "vit");
  EXPECT_EQ(m.version(), "1");
  EXPECT_EQ(m.inference_count(), 7u);
  EXPECT_GT(m.last_inference(), 1700000000000u);
  const inference::InferStatistics& i = m.inference_stats();
  EXPECT_EQ(i.success().count(), 3u);
  EXPECT_GT(i.success().ns(), 0u);
  EXPECT_EQ(i.fail().count(), 1u);
  EXPECT_EQ(i.queue().count(), 3u);
  EXPECT_GE(m.execution_count(), 1u);
  EXPECT_EQ(i.compute_infer().count(), m.execution_count());
  // REST: the same figures, and every served model without a name.
  const std::string rest =
      RawHttp(server_->http_port(), "GET /v2/models/vit/stats HTTP/1.0\r\n\r\n");
  const size_t at = rest.find("\r\n\r\n");
  ASSERT_NE(at, std::string::npos) << rest;
  const auto j = nlohmann::json::parse(rest.substr(at + 4));
  ASSERT_EQ(j["model_stats"].size(), 1u) << j;
  EXPECT_EQ(j["model_stats"][0]["inference_count"], 7);
  EXPECT_EQ(j["model_stats"][0]["inference_stats"]["success"]["count"], 3);
  EXPECT_EQ(j["model_stats"][0]["inference_stats"]["fail"]["count"], 1);
  EXPECT_EQ(j["model_stats"][0]["execution_count"], m.execution_count());
  const std::string all = RawHttp(server_->http_port(), "GET /v2/models/stats HTTP/1.0\r\n\r\n");
  const auto k = nlohmann::json::parse(all.substr(all.find("\r\n\r\n") + 4));
  EXPECT_EQ(k["model_stats"].size(), 5u) << k;  // the five tiny models, each version 1
  EXPECT_NE(
      RawHttp(server_->http_port(), "GET /v2/models/nope/stats HTTP/1.0\r\n\r\n").find(" 404 "),
      std::string::npos);
  EXPECT_EQ(stats("vit", "2", &r).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(ServerTest, GenerateDeadlineStopsTheWork) {
  v1::GenerateRequest req;
  req.set_model("karm-big");
  const Stream s = RunGenerate(*stub_, req, 0.05);
  EXPECT_EQ(s.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_TRUE(SlotsFree("karm-big"));
}

// GenerateStart is the first message of every call, sent as soon as its images are queued: a
// call whose image waits for karm-big's one cache slot gets it (with its seed and the waiting
// count) while the slot's holder is still generating.
TEST_F(ServerTest, GenerateStartReachesACallThatWaitsForASlot) {
  grpc::ClientContext hold_ctx;
  v1::GenerateRequest hold;
  hold.set_model("karm-big");
  auto holder = stub_->Generate(&hold_ctx, hold);
  v1::GenerateResponse m;
  ASSERT_TRUE(holder->Read(&m));
  ASSERT_TRUE(Eventually([&] { return Worker("karm-big").active() == 1; }));
  grpc::ClientContext wait_ctx;
  v1::GenerateRequest waits;
  waits.set_model("karm-big");
  waits.set_seed(77);
  auto waiter = stub_->Generate(&wait_ctx, waits);
  ASSERT_TRUE(waiter->Read(&m));
  EXPECT_TRUE(m.has_start());
  EXPECT_EQ(m.start().seed(), 77u);
  EXPECT_EQ(m.progress().waiting(), 1u);
  EXPECT_EQ(m.progress().pixels_done(), 0u);
  // (Not Worker().waiting(): that gauge is updated after a decode step, and may lag the stream.)
  hold_ctx.TryCancel();
  wait_ctx.TryCancel();
  while (holder->Read(&m)) {
  }
  while (waiter->Read(&m)) {
  }
  holder->Finish();
  waiter->Finish();
  EXPECT_TRUE(SlotsFree("karm-big"));
}

TEST_F(ServerTest, FullGeneratorQueueIsUnavailable) {
  // karm-big: 1 slot and 1 waiting image. Occupy the slot, then ask for 3 more.
  grpc::ClientContext ctx;
  v1::GenerateRequest req;
  req.set_model("karm-big");
  auto reader = stub_->Generate(&ctx, req);
  v1::GenerateResponse m;
  ASSERT_TRUE(reader->Read(&m));
  v1::GenerateRequest more;
  more.set_model("karm-big");
  more.set_num_images(3);
  const Stream s = RunGenerate(*stub_, more);
  EXPECT_EQ(s.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(s.status.error_message(), ::testing::HasSubstr("queue is full"));
  ctx.TryCancel();
  while (reader->Read(&m)) {
  }
  reader->Finish();
  EXPECT_TRUE(SlotsFree("karm-big"));
}

TEST_F(ServerTest, ScoreMatchesTheModel) {
  const at::Tensor images = RandomImages(3, 6, 6, 1, 4);
  for (const std::string model : {"karm", "arm"}) {
    v1::ScoreRequest req;
    req.set_model(model);
    for (int i = 0; i < 3; ++i) *req.add_images() = RawImage(images[i]);
    grpc::ClientContext ctx;
    v1::ScoreResponse r;
    ASSERT_TRUE(stub_->Score(&ctx, req, &r).ok());
    auto m = LoadModel(models_.dir + "/" + model + ".safetensors");
    ASSERT_TRUE(m.ok());
    at::NoGradGuard no_grad;
    auto want = ScoreBitsPerDim(*m->pixel, images.reshape({3, -1}));
    ASSERT_TRUE(want.ok());
    ASSERT_EQ(r.bits_per_dim_size(), 3);
    for (int i = 0; i < 3; ++i) EXPECT_DOUBLE_EQ(r.bits_per_dim(i), (*want)[i]);
    EXPECT_NEAR(r.mean_bits_per_dim(), ((*want)[0] + (*want)[1] + (*want)[2]) / 3, 1e-12);
    EXPECT_EQ(r.scored_subpixels_per_image(), 36u);
  }
  v1::ScoreRequest bad;
  *bad.add_images() = RawImage(RandomImages(1, 8, 8, 1, 1)[0]);
  grpc::ClientContext ctx;
  v1::ScoreResponse r;
  const grpc::Status st = stub_->Score(&ctx, bad, &r);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(st.error_message(), ::testing::HasSubstr("but model karm takes 6x6x1"));
}

}  // namespace
}  // namespace krause::testing
