// End-to-end tests of krause-server: a real gRPC server on a loopback port (in process), driven
// through the generated client stubs: every RPC, every error path, batching, deadlines,
// cancellation, queues, health, reflection, auth, TLS, shutdown and concurrency.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <arpa/inet.h>
#include <c10/core/InferenceMode.h>
#include <grpcpp/generic/generic_stub.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "client/resume.h"
#include "inference/grpc_predict_v2.grpc.pb.h"
#include "model/attention/cpu_kernels.h"
#include "model/data/png.h"
#include "model/engine/decode_engine.h"
#include "model/engine/inspect.h"
#include "model/util/threads.h"
#include "model/vit_cpu.h"
#include "server/core/served_classifier.h"
#include "server/core/served_generator.h"
#include "server_test.h"
#include "test_util.h"

namespace krause::testing {
namespace {

using std::chrono::milliseconds;
namespace v1 = krause::v1;

v1::Image RawImage(const at::Tensor& hwc) { return server::EncodeRawImage(hwc); }

// ---------------------------------------------------------------------------------------------

TEST_F(ServerTest, ListAndGetModels) {
  grpc::ClientContext ctx;
  v1::ListModelsResponse r;
  ASSERT_TRUE(stub_->ListModels(&ctx, {}, &r).ok());
  ASSERT_EQ(r.models_size(), 5);
  const v1::ModelInfo& vit = r.models(0);
  EXPECT_EQ(vit.name(), "vit");
  EXPECT_EQ(vit.kind(), v1::ModelInfo::CLASSIFIER);
  EXPECT_EQ(vit.attention(), v1::ModelInfo::KRAUSE);
  EXPECT_TRUE(vit.is_default());  // the only classifier
  EXPECT_EQ(vit.height(), 8u);
  EXPECT_EQ(vit.channels(), 1u);
  EXPECT_THAT(std::vector<std::string>(vit.labels().begin(), vit.labels().end()),
              ::testing::ElementsAre("zero", "one", "two"));
  EXPECT_EQ(vit.max_batch_size(), 8u);
  EXPECT_GT(vit.flops_per_image_executed(), 0);
  EXPECT_LE(vit.flops_per_image_executed(), vit.flops_per_image_dense_equivalent());
  const v1::ModelInfo& karm = r.models(1);
  EXPECT_EQ(karm.kind(), v1::ModelInfo::GENERATOR);
  EXPECT_EQ(karm.attention(), v1::ModelInfo::KRAUSE);
  EXPECT_TRUE(karm.is_default());
  EXPECT_EQ(karm.window(), 8u);
  EXPECT_THAT(std::vector<uint32_t>(karm.top_k().begin(), karm.top_k().end()),
              ::testing::ElementsAre(4u));
  EXPECT_GT(karm.kv_cache_bytes_per_sequence(), 0u);
  EXPECT_EQ(karm.kv_cache_dtype(), "float32");
  EXPECT_EQ(vit.kv_cache_dtype(), "");  // a classifier has no KV cache
  EXPECT_EQ(r.models(2).attention(), v1::ModelInfo::SOFTMAX);
  EXPECT_FALSE(r.models(2).is_default());
  EXPECT_EQ(r.models(2).top_k_size(), 0);
  EXPECT_EQ(r.models(2).flops_per_image_executed(), r.models(2).flops_per_image_dense_equivalent());

  grpc::ClientContext c2;
  v1::GetModelRequest g;
  g.set_name("arm");
  v1::ModelInfo info;
  ASSERT_TRUE(stub_->GetModel(&c2, g, &info).ok());
  EXPECT_EQ(info.SerializeAsString(), r.models(2).SerializeAsString());
  grpc::ClientContext c3;
  g.set_name("missing");
  const grpc::Status st = stub_->GetModel(&c3, g, &info);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(st.error_message(), ::testing::HasSubstr("missing"));
  grpc::ClientContext c4;
  EXPECT_EQ(stub_->GetModel(&c4, {}, &info).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(ServerTest, HealthOverallAndPerService) {
  auto ch = client::MakeChannel(conn_);
  auto health = grpc::health::v1::Health::NewStub(*ch);
  for (const std::string service : {"", "krause.v1.KrauseService"}) {
    grpc::ClientContext ctx;
    grpc::health::v1::HealthCheckRequest req;
    req.set_service(service);
    grpc::health::v1::HealthCheckResponse r;
    ASSERT_TRUE(health->Check(&ctx, req, &r).ok()) << service;
    EXPECT_EQ(r.status(), grpc::health::v1::HealthCheckResponse::SERVING) << service;
  }
  grpc::ClientContext ctx;
  grpc::health::v1::HealthCheckRequest req;
  req.set_service("no.such.Service");
  grpc::health::v1::HealthCheckResponse r;
  EXPECT_EQ(health->Check(&ctx, req, &r).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(ServerTest, ReflectionListsTheService) {
  // grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo with {list_services: ""},
  // encoded by hand (field 7, length-delimited, empty) over the generic stub.
  auto ch = client::MakeChannel(conn_);
  grpc::GenericStub generic(*ch);
  grpc::CompletionQueue cq;
  grpc::ClientContext ctx;
  auto call = generic.PrepareCall(
      &ctx, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  void* tag;
  bool ok;
  auto wait = [&](intptr_t want) {
    EXPECT_TRUE(cq.Next(&tag, &ok));
    EXPECT_EQ(reinterpret_cast<intptr_t>(tag), want);
    return ok;
  };
  call->StartCall(reinterpret_cast<void*>(1));
  ASSERT_TRUE(wait(1));
  const char request[] = {0x3a, 0x00};
  grpc::Slice slice(request, sizeof(request));
  grpc::ByteBuffer out(&slice, 1);
  call->Write(out, reinterpret_cast<void*>(2));
  ASSERT_TRUE(wait(2));
  grpc::ByteBuffer in;
  call->Read(&in, reinterpret_cast<void*>(3));
  ASSERT_TRUE(wait(3));
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(in.Dump(&slices).ok());
  std::string bytes;
  for (const auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  EXPECT_THAT(bytes, ::testing::HasSubstr("krause.v1.KrauseService"));
  EXPECT_THAT(bytes, ::testing::HasSubstr("grpc.health.v1.Health"));
  call->WritesDone(reinterpret_cast<void*>(4));
  wait(4);
  grpc::Status st;
  call->Finish(&st, reinterpret_cast<void*>(5));
  wait(5);
  EXPECT_TRUE(st.ok()) << st.error_message();
}

TEST_F(ServerTest, ClassifyMatchesTheModelForPngAndRaw) {
  const at::Tensor images = RandomImages(3, 8, 8, 1, 7);
  v1::ClassifyRequest req;
  req.set_top_k(2);
  req.set_return_probabilities(true);
  *req.add_images() = RawImage(images[0]);
  auto png = EncodePng(images[1]);
  ASSERT_TRUE(png.ok());
  req.add_images()->set_png(*png);
  *req.add_images() = RawImage(images[2]);
  grpc::ClientContext ctx;
  v1::ClassifyResponse r;
  ASSERT_TRUE(stub_->Classify(&ctx, req, &r).ok());
  EXPECT_EQ(r.model(), "vit");
  ASSERT_EQ(r.results_size(), 3);
  // The same probabilities as the model computed directly.
  auto m = LoadModel(models_.dir + "/vit.safetensors");
  ASSERT_TRUE(m.ok());
  at::NoGradGuard no_grad;
  const at::Tensor want = at::softmax(
      m->vit->Forward(NormalizePixels(m->vit->config(), images.permute({0, 3, 1, 2}))), -1);
  for (int i = 0; i < 3; ++i) {
    const auto& c = r.results(i);
    ASSERT_EQ(c.probabilities_size(), 3);
    for (int k = 0; k < 3; ++k) EXPECT_NEAR(c.probabilities(k), want[i][k].item<float>(), 1e-6);
    ASSERT_EQ(c.top_size(), 2);
    EXPECT_EQ(c.top(0).index(), want[i].argmax().item<int64_t>());
    EXPECT_GE(c.top(0).probability(), c.top(1).probability());
    EXPECT_EQ(c.top(0).label(), std::vector<std::string>({"zero", "one", "two"})[c.top(0).index()]);
  }
  EXPECT_DOUBLE_EQ(r.flops_executed(), 3 * m->FlopsPerImage().executed_flops);
  EXPECT_DOUBLE_EQ(r.flops_dense_equivalent(), 3 * m->FlopsPerImage().dense_equivalent_flops);
}

TEST_F(ServerTest, ClassifyValidationNamesTheFieldAndLimit) {
  struct Case {
    std::function<void(v1::ClassifyRequest*)> make;
    grpc::StatusCode code;
    std::string message;
    std::string field = "";  // google.rpc.BadRequest's field (INVALID_ARGUMENT)
  };
  const at::Tensor ok = RandomImages(1, 8, 8, 1, 1)[0];
  const std::vector<Case> cases = {
      {[](v1::ClassifyRequest*) {}, grpc::StatusCode::INVALID_ARGUMENT, "images is empty",
       "images"},
      {[&](v1::ClassifyRequest* r) {
         for (int i = 0; i < 9; ++i) *r->add_images() = RawImage(ok);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "at most 8 per request", "images"},
      {[&](v1::ClassifyRequest* r) { *r->add_images() = RawImage(RandomImages(1, 9, 8, 1, 1)[0]); },
       grpc::StatusCode::INVALID_ARGUMENT,
       "images[0]: image is 9x8x1 (HxWxC) but model vit takes 8x8x1", "images[0]"},
      {[&](v1::ClassifyRequest* r) {
         *r->add_images() = RawImage(ok);
         r->add_images()->set_png("not a png at all");
       },
       grpc::StatusCode::INVALID_ARGUMENT, "images[1].png is not a readable PNG", "images[1].png"},
      {[&](v1::ClassifyRequest* r) {
         *r->add_images() = RawImage(ok);
         r->mutable_images(0)->mutable_raw()->mutable_pixels()->pop_back();
       },
       grpc::StatusCode::INVALID_ARGUMENT, "images[0].raw.pixels has 63 bytes",
       "images[0].raw.pixels"},
      {[&](v1::ClassifyRequest* r) {
         *r->add_images() = RawImage(ok);
         r->mutable_images(0)->mutable_raw()->set_channels(2);
       },
       grpc::StatusCode::INVALID_ARGUMENT, "images[0].raw.channels must be 1 or 3",
       "images[0].raw.channels"},
      {[&](v1::ClassifyRequest* r) { r->add_images(); }, grpc::StatusCode::INVALID_ARGUMENT,
       "images[0] has neither png nor raw", "images[0]"},
      {[&](v1::ClassifyRequest* r) {
         r->set_model("nope");
         *r->add_images() = RawImage(ok);
       },
       grpc::StatusCode::NOT_FOUND, "model \"nope\" is not served"},
      {[&](v1::ClassifyRequest* r) {
         r->set_model("karm");
         *r->add_images() = RawImage(ok);
       },
       grpc::StatusCode::FAILED_PRECONDITION, "not a classifier"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    v1::ClassifyRequest req;
    cases[i].make(&req);
    grpc::ClientContext ctx;
    v1::ClassifyResponse r;
    const grpc::Status st = stub_->Classify(&ctx, req, &r);
    EXPECT_EQ(st.error_code(), cases[i].code) << i << ": " << st.error_message();
    EXPECT_THAT(st.error_message(), ::testing::HasSubstr(cases[i].message)) << i;
    const server::ErrorDetails d = server::DetailsOf(st);
    if (cases[i].code == grpc::StatusCode::INVALID_ARGUMENT) {
      ASSERT_EQ(d.fields.size(), 1u) << i;
      EXPECT_EQ(d.fields[0].first, cases[i].field) << i;
      EXPECT_EQ(d.fields[0].second, st.error_message()) << i;
    } else {
      EXPECT_TRUE(d.fields.empty()) << i;
    }
  }
  // Bad requests changed nothing: a good one still works.
  v1::ClassifyRequest req;
  *req.add_images() = RawImage(ok);
  grpc::ClientContext ctx;
  v1::ClassifyResponse r;
  EXPECT_TRUE(stub_->Classify(&ctx, req, &r).ok());
}

TEST_F(ServerTest, MessagesOverTheLimitAreRefused) {
  server_->Shutdown();
  server::ServerOptions o = LoopbackOptions(models_.manifest);
  o.max_message_bytes = 4096;
  StartServer(o);
  v1::ClassifyRequest req;
  req.add_images()->set_png(std::string(8192, 'x'));
  grpc::ClientContext ctx;
  v1::ClassifyResponse r;
  EXPECT_EQ(stub_->Classify(&ctx, req, &r).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
}

TEST_F(ServerTest, ConcurrentClassifyCallsShareBatches) {
  server_->Shutdown();
  std::mutex mu;
  std::vector<server::BatchEvent> batches;
  server::WorkerHooks hooks;
  hooks.on_classify_batch = [&](const std::string&, const server::BatchEvent& e) {
    std::lock_guard<std::mutex> l(mu);
    batches.push_back(e);
  };
  // A long queue delay so that concurrent calls surely meet.
  std::filesystem::remove_all(models_.dir);
  models_ = WriteTinyModels("e2e-batch", 300);
  StartServer(LoopbackOptions(models_.manifest), hooks);
  const at::Tensor images = RandomImages(8, 8, 8, 1, 3);
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      v1::ClassifyRequest req;
      *req.add_images() = RawImage(images[t]);
      grpc::ClientContext ctx;
      v1::ClassifyResponse r;
      if (stub_->Classify(&ctx, req, &r).ok() && r.results_size() == 1) ++ok;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 8);
  std::lock_guard<std::mutex> l(mu);
  int64_t images_seen = 0, requests_seen = 0, largest = 0;
  for (const auto& b : batches) {
    images_seen += b.images;
    requests_seen += b.requests;
    largest = std::max(largest, b.requests);
    EXPECT_LE(b.images, 8);
  }
  EXPECT_EQ(images_seen, 8);
  EXPECT_EQ(requests_seen, 8);
  EXPECT_LT(batches.size(), 8u) << "no two calls shared a batch";
  EXPECT_GT(largest, 1);
}

TEST_F(ServerTest, FullClassifyQueueIsUnavailableAndDeadlineIsHonoured) {
  // The batch hook (on the worker thread) holds the worker after its first batch, so the queue
  // fills deterministically.
  server_->Shutdown();
  std::mutex mu;
  std::condition_variable cv;
  bool release = false;
  int64_t images_run = 0;
  server::WorkerHooks hooks;
  hooks.on_classify_batch = [&](const std::string&, const server::BatchEvent& e) {
    std::unique_lock<std::mutex> l(mu);
    images_run += e.images;
    cv.wait(l, [&] { return release; });
  };
  StartServer(LoopbackOptions(models_.manifest), hooks);
  const at::Tensor images = RandomImages(8, 8, 8, 1, 5);
  auto classify = [&](int n, double timeout_s) {
    v1::ClassifyRequest req;
    for (int i = 0; i < n; ++i) *req.add_images() = RawImage(images[i]);
    grpc::ClientContext ctx;
    if (timeout_s > 0)
      ctx.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
    v1::ClassifyResponse r;
    return stub_->Classify(&ctx, req, &r);
  };
  std::vector<std::thread> waiting;
  waiting.emplace_back([&] { EXPECT_TRUE(classify(1, 0).ok()); });  // runs, then holds the worker
  EXPECT_TRUE(Eventually([&] {  // (EXPECT: the release below must still run)
    std::lock_guard<std::mutex> l(mu);
    return images_run == 1;
  }));
  // Expires while queued: DEADLINE_EXCEEDED, and it never runs.
  EXPECT_EQ(classify(4, 0.1).error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  // 4 (expired, not yet dropped: the worker is held) + 8 = 12 images queue up ...
  waiting.emplace_back([&] { EXPECT_TRUE(classify(8, 0).ok()); });
  EXPECT_TRUE(Eventually(
      [&] { return Served<server::ServedClassifier>("vit").batcher().queued_images() == 12; }));
  // ... and 6 more would pass the limit of 16: refused at once.
  const grpc::Status st = classify(6, 0);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(st.error_message(), ::testing::HasSubstr("classify queue is full"));
  // What a program acts on: the reason, the model, and when to try again.
  const server::ErrorDetails d = server::DetailsOf(st);
  EXPECT_EQ(d.reason, "QUEUE_FULL");
  EXPECT_EQ(d.domain, "krause-serve");
  EXPECT_EQ(d.metadata.at("model"), "vit");
  EXPECT_EQ(d.retry_delay, server::kQueueFullRetryDelay);
  EXPECT_THAT(server_->metrics().Scrape(),
              ::testing::HasSubstr("krause_refusals_total{model=\"vit\",protocol=\"krause.v1\","
                                   "reason=\"QUEUE_FULL\",rpc=\"Classify\"} 1"));
  {
    std::lock_guard<std::mutex> l(mu);
    release = true;
  }
  cv.notify_all();
  for (auto& t : waiting) t.join();
  std::lock_guard<std::mutex> l(mu);
  EXPECT_EQ(images_run, 1 + 8) << "the expired request must not run";
}

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

// ---------------------------------------------------------------------------------------------
// Inspect: the reply is the model-level inspection (model/engine/inspect.h, tested against the
// reference operator in inspect_test) of the same model and image, field by field.

void ExpectReplyIs(const v1::InspectResponse& r, const Inspection& want) {
  EXPECT_EQ(r.attention(), want.krause ? v1::ModelInfo::KRAUSE : v1::ModelInfo::SOFTMAX);
  EXPECT_EQ(r.tokens(), static_cast<uint32_t>(want.tokens));
  ASSERT_EQ(r.queries_size(), static_cast<int>(want.queries.size()));
  ASSERT_EQ(r.token_rows_size(), static_cast<int>(want.positions.size()));
  for (size_t t = 0; t < want.positions.size(); ++t) {
    EXPECT_EQ(r.token_rows(t), want.positions[t].first);
    EXPECT_EQ(r.token_columns(t), want.positions[t].second);
  }
  ASSERT_EQ(r.layers_size(), static_cast<int>(want.layers.size()));
  for (size_t l = 0; l < want.layers.size(); ++l) {
    const LayerAttention& wl = want.layers[l];
    EXPECT_EQ(r.layers(l).layer(), static_cast<uint32_t>(wl.layer));
    EXPECT_EQ(r.layers(l).keys_per_query(), static_cast<uint32_t>(wl.k));
    ASSERT_EQ(r.layers(l).heads_size(), static_cast<int>(wl.heads.size()));
    for (size_t h = 0; h < wl.heads.size(); ++h) {
      const v1::HeadAttention& rh = r.layers(l).heads(h);
      EXPECT_FLOAT_EQ(rh.sigma(), static_cast<float>(wl.heads[h].sigma));
      EXPECT_NEAR(rh.sink_share(), wl.heads[h].sink_share, 1e-6);
      EXPECT_NEAR(rh.mean_distance(), wl.heads[h].mean_distance, 1e-6);
      EXPECT_NEAR(rh.effective_neighbours(), wl.heads[h].effective_neighbours, 1e-5);
      EXPECT_EQ(rh.busiest_key(), static_cast<uint32_t>(wl.heads[h].busiest_key));
      EXPECT_NEAR(rh.busiest_key_share(), wl.heads[h].busiest_key_share, 1e-6);
      ASSERT_EQ(rh.queries_size(), static_cast<int>(wl.heads[h].queries.size()));
      for (size_t q = 0; q < wl.heads[h].queries.size(); ++q) {
        const QueryAttention& wq = wl.heads[h].queries[q];
        const v1::QueryAttention& rq = rh.queries(q);
        EXPECT_EQ(rq.query(), static_cast<uint32_t>(wq.query));
        ASSERT_EQ(rq.keys_size(), static_cast<int>(wq.keys.size()));
        for (size_t j = 0; j < wq.keys.size(); ++j) {
          EXPECT_EQ(rq.keys(j), static_cast<uint32_t>(wq.keys[j])) << "query " << wq.query;
          EXPECT_NEAR(rq.weights(j), wq.weights[j], 1e-6);
        }
        EXPECT_NEAR(rq.outside(), wq.outside, 1e-6);
      }
    }
  }
}

TEST_F(ServerTest, InspectGivesTheModelsAttention) {
  const c10::InferenceMode inference;
  // The Krause ViT (the default classifier): 2x2 patches + CLS, every layer and query.
  const at::Tensor image = RandomImages(1, 8, 8, 1, 6)[0];
  {
    v1::InspectRequest req;
    *req.mutable_image() = RawImage(image);
    grpc::ClientContext ctx;
    v1::InspectResponse r;
    ASSERT_TRUE(stub_->Inspect(&ctx, req, &r).ok());
    EXPECT_EQ(r.model(), "vit");
    EXPECT_EQ(r.model_version(), "1");
    EXPECT_EQ(r.implementation(), "fused_cpu");
    EXPECT_EQ(r.grid_height(), 2u);
    EXPECT_EQ(r.grid_width(), 2u);
    auto m = LoadModel(models_.dir + "/vit.safetensors");
    ASSERT_TRUE(m.ok());
    KRAUSE_ASSERT_OK_AND_ASSIGN(Inspection want,
                                InspectClassifier(*m->vit, image.permute({2, 0, 1}), {}));
    ExpectReplyIs(r, want);
  }
  // The conditional KARM, given a class by name, chosen queries; the ARM with its own k.
  const at::Tensor pixels = RandomImages(1, 6, 6, 1, 7)[0];
  for (const std::string model : {"karm-cond", "arm"}) {
    v1::InspectRequest req;
    req.set_model(model);
    *req.mutable_image() = RawImage(pixels);
    InspectOptions o;
    o.queries = {35, 0, 20};
    for (int64_t q : o.queries) req.add_queries(static_cast<uint32_t>(q));
    int64_t cls = -1;
    if (model == "arm") {
      req.set_top_k(5);
      o.top_k = 5;
    } else {
      req.set_label("two");
      cls = 2;
    }
    grpc::ClientContext ctx;
    v1::InspectResponse r;
    const grpc::Status st = stub_->Inspect(&ctx, req, &r);
    ASSERT_TRUE(st.ok()) << st.error_message();
    EXPECT_EQ(r.grid_height(), 6u);
    auto m = LoadModel(models_.dir + "/" + (model == "arm" ? "arm" : "cond") + ".safetensors");
    ASSERT_TRUE(m.ok());
    KRAUSE_ASSERT_OK_AND_ASSIGN(Inspection want,
                                InspectGenerator(*m->pixel, pixels.reshape({-1}), cls, o));
    ExpectReplyIs(r, want);
  }
}

TEST_F(ServerTest, InspectValidationNamesTheField) {
  server_->Shutdown();
  server::ServerOptions o = LoopbackOptions(models_.manifest);
  o.inspect_max_entries = 100;
  StartServer(o);
  const v1::Image vit_image = RawImage(RandomImages(1, 8, 8, 1, 1)[0]);
  const v1::Image karm_image = RawImage(RandomImages(1, 6, 6, 1, 1)[0]);
  struct Case {
    std::function<void(v1::InspectRequest*)> edit;
    std::string field, text;
  };
  const std::vector<Case> cases = {
      {[&](v1::InspectRequest* r) { r->add_layers(1); }, "layers[0]",
       "layers[0] = 1 is out of range: the model's layers are 0 .. 0"},
      {[&](v1::InspectRequest* r) { r->add_queries(2), r->add_queries(5); }, "queries[1]",
       "queries[1] = 5 is out of range: the model's tokens are 0 .. 4"},
      {[&](v1::InspectRequest* r) { r->set_top_k(2); }, "top_k", "top_k is for softmax models"},
      {[&](v1::InspectRequest* r) { r->set_class_index(1); }, "class_index",
       "is a classifier; a class is for conditional generators"},
      {[&](v1::InspectRequest* r) {
         r->set_model("karm");  // 36 queries x 2 heads x 4 keys = 288 > 100
         *r->mutable_image() = karm_image;
       },
       "queries", "the reply would list 288 keys"},
      {[&](v1::InspectRequest* r) {
         r->set_model("karm");
         *r->mutable_image() = karm_image;
         r->set_label("one");
       },
       "label", "label: model karm"},
      {[&](v1::InspectRequest* r) {
         r->set_model("karm-cond");
         *r->mutable_image() = karm_image;
         r->add_queries(1);
         r->set_label("four");
       },
       "label", "label: model karm-cond"},
      {[&](v1::InspectRequest* r) { *r->mutable_image() = karm_image; }, "image",
       "but model vit takes 8x8x1"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    v1::InspectRequest req;
    *req.mutable_image() = vit_image;
    cases[i].edit(&req);
    grpc::ClientContext ctx;
    v1::InspectResponse r;
    const grpc::Status st = stub_->Inspect(&ctx, req, &r);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << i;
    EXPECT_THAT(st.error_message(), ::testing::HasSubstr(cases[i].text)) << i;
    const server::ErrorDetails d = server::DetailsOf(st);
    ASSERT_EQ(d.fields.size(), 1u) << i;
    EXPECT_EQ(d.fields[0].first, cases[i].field) << i << ": " << st.error_message();
  }
  // Within the limit the same model answers; an unknown model is NOT_FOUND.
  v1::InspectRequest ok;
  ok.set_model("karm");
  *ok.mutable_image() = karm_image;
  ok.add_queries(35);
  grpc::ClientContext ctx;
  v1::InspectResponse r;
  EXPECT_TRUE(stub_->Inspect(&ctx, ok, &r).ok());
  EXPECT_EQ(r.layers(0).heads(0).queries(0).keys_size(), 4);
  ok.set_model("nope");
  grpc::ClientContext ctx2;
  EXPECT_EQ(stub_->Inspect(&ctx2, ok, &r).error_code(), grpc::StatusCode::NOT_FOUND);
}

// ---------------------------------------------------------------------------------------------
// Class-conditional generation (karm-cond: classes zero, one, two).

v1::GenerateRequest CondRequest(uint64_t seed, uint32_t n) {
  v1::GenerateRequest req;
  req.set_model("karm-cond");
  req.set_num_images(n);
  req.set_seed(seed);
  return req;
}

TEST_F(ServerTest, ConditionalGeneratorListsItsClassesAndDrawsTheAskedOne) {
  grpc::ClientContext ctx;
  v1::GetModelRequest g;
  g.set_name("karm-cond");
  v1::ModelInfo info;
  ASSERT_TRUE(stub_->GetModel(&ctx, g, &info).ok());
  EXPECT_EQ(info.classes(), 3u);
  EXPECT_THAT(std::vector<std::string>(info.labels().begin(), info.labels().end()),
              ::testing::ElementsAre("zero", "one", "two"));
  grpc::ClientContext c2;
  g.set_name("karm");
  ASSERT_TRUE(stub_->GetModel(&c2, g, &info).ok());
  EXPECT_EQ(info.classes(), 0u);
  EXPECT_EQ(info.labels_size(), 0);

  // By label and by index: the same images; another class or none: other images.
  v1::GenerateRequest by_label = CondRequest(11, 3);
  by_label.set_label("one");
  v1::GenerateRequest by_index = CondRequest(11, 3);
  by_index.set_class_index(1);
  v1::GenerateRequest other = CondRequest(11, 3);
  other.set_label("two");
  const Stream a = RunGenerate(*stub_, by_label), b = RunGenerate(*stub_, by_index),
               c = RunGenerate(*stub_, other), none = RunGenerate(*stub_, CondRequest(11, 3));
  for (const Stream* s : {&a, &b, &c, &none})
    ASSERT_TRUE(s->status.ok()) << s->status.error_message();
  EXPECT_EQ(PngsOf(a), PngsOf(b));
  EXPECT_EQ(RowsOf(a), PngsOf(a));
  EXPECT_NE(PngsOf(a), PngsOf(c));
  EXPECT_NE(PngsOf(a), PngsOf(none));
  // Image i of a call is image 0 of a call with its own seed: per class too.
  v1::GenerateRequest second = CondRequest(server::ImageSeed(11, 1), 1);
  second.set_label("one");
  const Stream s2 = RunGenerate(*stub_, second);
  ASSERT_TRUE(s2.status.ok());
  EXPECT_EQ(PngsOf(s2).at(0), PngsOf(a).at(1));

  // Completion given a class keeps the prompt rows.
  const at::Tensor prompt = RandomImages(1, 6, 6, 1, 3)[0];
  v1::GenerateRequest comp = CondRequest(4, 2);
  comp.set_label("zero");
  *comp.mutable_prompt() = RawImage(prompt);
  comp.set_prompt_rows(2);
  const Stream done = RunGenerate(*stub_, comp);
  ASSERT_TRUE(done.status.ok()) << done.status.error_message();
  const std::string head(reinterpret_cast<const char*>(prompt.contiguous().data_ptr<uint8_t>()),
                         12);
  for (const auto& [i, px] : PngsOf(done)) EXPECT_EQ(px.substr(0, 12), head) << "image " << i;
  EXPECT_TRUE(SlotsFree("karm-cond"));
}

TEST_F(ServerTest, GuidedGenerationIsSeededAndCostsTwoPasses) {
  v1::GenerateRequest guided = CondRequest(21, 2);
  guided.set_label("two");
  guided.set_guidance(3.0f);
  v1::GenerateRequest plain = CondRequest(21, 2);
  plain.set_label("two");
  const Stream a = RunGenerate(*stub_, guided), b = RunGenerate(*stub_, guided),
               p = RunGenerate(*stub_, plain);
  for (const Stream* s : {&a, &b, &p}) ASSERT_TRUE(s->status.ok()) << s->status.error_message();
  EXPECT_EQ(PngsOf(a), PngsOf(b));
  EXPECT_EQ(RowsOf(a), PngsOf(a));
  EXPECT_NE(PngsOf(a), PngsOf(p));
  const v1::GenerateSummary& ga = a.messages.back().summary();
  const v1::GenerateSummary& pa = p.messages.back().summary();
  EXPECT_EQ(ga.pixels_generated(), pa.pixels_generated());
  EXPECT_DOUBLE_EQ(ga.flops_executed(), 2 * pa.flops_executed());
  EXPECT_DOUBLE_EQ(ga.flops_dense_equivalent(), 2 * pa.flops_dense_equivalent());
  // Guidance 1 is plain conditional sampling.
  plain.set_guidance(1.0f);
  EXPECT_EQ(PngsOf(RunGenerate(*stub_, plain)), PngsOf(p));
  EXPECT_TRUE(SlotsFree("karm-cond"));
}

TEST_F(ServerTest, ClassErrorsNameTheFieldAndTheValidLabels) {
  auto expect_invalid = [&](const v1::GenerateRequest& req, const std::vector<std::string>& parts) {
    const Stream s = RunGenerate(*stub_, req);
    EXPECT_EQ(s.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    for (const std::string& p : parts)
      EXPECT_THAT(s.status.error_message(), ::testing::HasSubstr(p));
  };
  v1::GenerateRequest r = CondRequest(1, 1);
  r.set_label("three");
  expect_invalid(r, {"label", "karm-cond", "valid labels: zero, one, two"});
  r.set_class_index(3);
  expect_invalid(r, {"class_index", "outside [0, 3)"});
  r.set_model("karm");
  r.set_label("zero");
  expect_invalid(r, {"label", "model karm", "unconditional"});
  r.set_class_index(0);
  expect_invalid(r, {"class_index", "unconditional"});
  // Guidance: a class is needed, and a scale in [0, 20].
  v1::GenerateRequest g = CondRequest(1, 1);
  g.set_guidance(2.0f);
  expect_invalid(g, {"guidance 2 needs a class", "karm-cond was given none"});
  g.set_model("karm");
  expect_invalid(g, {"guidance 2 needs a class", "karm is unconditional"});
  g.set_model("karm-cond");
  g.set_label("one");
  g.set_guidance(21.0f);
  expect_invalid(g, {"guidance must be in [0, 20], got 21"});
  g.set_guidance(-1.0f);
  expect_invalid(g, {"guidance must be in [0, 20], got -1"});
  EXPECT_TRUE(SlotsFree("karm-cond"));
  EXPECT_TRUE(SlotsFree("karm"));
}

TEST_F(ServerTest, ScoreGivenClassesIsTheConditionalBitsPerDim) {
  const at::Tensor images = RandomImages(3, 6, 6, 1, 8);
  auto score = [&](const std::string& model, const std::vector<std::string>& labels,
                   const std::vector<int32_t>& indices, v1::ScoreResponse* r) {
    v1::ScoreRequest req;
    req.set_model(model);
    for (int i = 0; i < 3; ++i) *req.add_images() = RawImage(images[i]);
    for (const auto& l : labels) req.add_labels(l);
    for (int32_t i : indices) req.add_class_indices(i);
    grpc::ClientContext ctx;
    return stub_->Score(&ctx, req, r);
  };
  v1::ScoreResponse by_label, by_index, none;
  ASSERT_TRUE(score("karm-cond", {"two", "", "zero"}, {}, &by_label).ok());
  ASSERT_TRUE(score("karm-cond", {}, {2, -1, 0}, &by_index).ok());
  ASSERT_TRUE(score("karm-cond", {}, {}, &none).ok());
  auto m = LoadModel(models_.dir + "/cond.safetensors");
  ASSERT_TRUE(m.ok());
  auto want = ScoreBitsPerDim(*m->pixel, images.reshape({3, -1}), {2, -1, 0});
  ASSERT_TRUE(want.ok());
  for (int i = 0; i < 3; ++i) {
    EXPECT_DOUBLE_EQ(by_label.bits_per_dim(i), (*want)[i]);
    EXPECT_DOUBLE_EQ(by_index.bits_per_dim(i), (*want)[i]);
  }
  EXPECT_DOUBLE_EQ(none.bits_per_dim(1), (*want)[1]);  // "" / -1: without a class
  EXPECT_NE(none.bits_per_dim(0), (*want)[0]);

  v1::ScoreResponse r;
  grpc::Status st = score("karm-cond", {"one"}, {}, &r);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(st.error_message(), ::testing::HasSubstr("labels has 1 entries for 3 images"));
  st = score("karm-cond", {"one", "one", "four"}, {}, &r);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(st.error_message(),
              ::testing::HasSubstr("labels[2]: model karm-cond: class \"four\""));
  EXPECT_THAT(st.error_message(), ::testing::HasSubstr("valid labels: zero, one, two"));
  st = score("karm-cond", {"one", "one", "one"}, {0, 0, 0}, &r);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(st.error_message(), ::testing::HasSubstr("at most one of the two"));
  st = score("karm-cond", {}, {0, 3, -2}, &r);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(st.error_message(), ::testing::HasSubstr("class_indices[1]"));
  st = score("karm", {"zero", "zero", "zero"}, {}, &r);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(st.error_message(), ::testing::HasSubstr("unconditional"));
}

TEST_F(ServerTest, ThirtyTwoConcurrentClientsMixingClassifyAndGenerate) {
  // Room for every client's image in the generators' waiting rooms and the classify queue (up
  // to 32 classify calls can be in flight at once when the clients drift between rounds).
  server_->Shutdown();
  std::filesystem::remove_all(models_.dir);
  models_ = WriteTinyModels("e2e-32", 20, 64, 64);
  StartServer(LoopbackOptions(models_.manifest));
  const at::Tensor images = RandomImages(32, 8, 8, 1, 6);
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 32; ++t) {
    threads.emplace_back([&, t] {
      auto stub = Stub(conn_);  // a channel per client
      for (int round = 0; round < 3; ++round) {
        if ((t + round) % 2 == 0) {
          v1::ClassifyRequest req;
          *req.add_images() = RawImage(images[t]);
          grpc::ClientContext ctx;
          v1::ClassifyResponse r;
          const grpc::Status st = stub->Classify(&ctx, req, &r);
          if (st.ok() && r.results_size() == 1)
            ++ok;
          else
            ADD_FAILURE() << st.error_message();
        } else {
          v1::GenerateRequest req;
          req.set_model(t % 4 == 1 ? "arm" : "karm");
          req.set_seed(static_cast<uint64_t>(t));
          const Stream s = RunGenerate(*stub, req);
          if (s.status.ok() && PngsOf(s).size() == 1)
            ++ok;
          else
            ADD_FAILURE() << s.status.error_message();
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 96);
  EXPECT_TRUE(SlotsFree("karm"));
  EXPECT_TRUE(SlotsFree("arm"));
}

TEST_F(ServerTest, TokenAuthentication) {
  server_->Shutdown();
  WriteText(models_.dir + "/tokens", "# tokens\nsecret-one\n\nsecret-two\n");
  server::ServerOptions o = LoopbackOptions(models_.manifest);
  o.auth_tokens_file = models_.dir + "/tokens";
  StartServer(o);
  auto call = [&](const std::string& token) {
    grpc::ClientContext ctx;
    if (!token.empty()) ctx.AddMetadata("authorization", token);
    v1::ListModelsResponse r;
    return stub_->ListModels(&ctx, {}, &r).error_code();
  };
  EXPECT_EQ(call(""), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(call("Bearer wrong"), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(call("secret-one"), grpc::StatusCode::UNAUTHENTICATED);  // no "Bearer "
  EXPECT_EQ(call("Bearer secret-one"), grpc::StatusCode::OK);
  EXPECT_EQ(call("Bearer secret-two"), grpc::StatusCode::OK);
  // The scheme is case-insensitive, the token is not.
  EXPECT_EQ(call("bearer secret-one"), grpc::StatusCode::OK);
  EXPECT_EQ(call("BEARER secret-two"), grpc::StatusCode::OK);
  EXPECT_EQ(call("bearer SECRET-ONE"), grpc::StatusCode::UNAUTHENTICATED);
  // Streams too, and nothing ran: no slot was taken.
  v1::GenerateRequest req;
  EXPECT_EQ(RunGenerate(*stub_, req, 0, "bad").status.error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(RunGenerate(*stub_, req, 0, "secret-two").status.error_code(), grpc::StatusCode::OK);
  // Health needs no token.
  auto ch = client::MakeChannel(conn_);
  auto health = grpc::health::v1::Health::NewStub(*ch);
  grpc::ClientContext ctx;
  grpc::health::v1::HealthCheckResponse r;
  EXPECT_TRUE(health->Check(&ctx, {}, &r).ok());
}

TEST_F(ServerTest, RequestLogHasALinePerCallAndTheCallersIdsComeBack) {
  server_->Shutdown();
  const std::string log = models_.dir + "/requests.jsonl";
  server::ServerOptions o = LoopbackOptions(models_.manifest);
  o.request_log = log;
  StartServer(o);
  // Classify with a request id: echoed in the initial metadata.
  {
    v1::ClassifyRequest req;
    req.set_model("vit");
    *req.add_images() = RawImage(RandomImages(1, 8, 8, 1, 4)[0]);
    *req.add_images() = RawImage(RandomImages(1, 8, 8, 1, 5)[0]);
    grpc::ClientContext ctx;
    ctx.AddMetadata("x-request-id", "req-42");
    v1::ClassifyResponse r;
    ASSERT_TRUE(stub_->Classify(&ctx, req, &r).ok());
    const auto& md = ctx.GetServerInitialMetadata();
    const auto it = md.find("x-request-id");
    ASSERT_NE(it, md.end());
    EXPECT_EQ(std::string(it->second.data(), it->second.size()), "req-42");
  }
  // Generate with a traceparent, and a call for an unknown model.
  const std::string trace = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
  {
    v1::GenerateRequest req;
    req.set_model("karm");
    req.set_num_images(2);
    req.set_seed(1);
    grpc::ClientContext ctx;
    ctx.AddMetadata("traceparent", trace);
    auto reader = stub_->Generate(&ctx, req);
    v1::GenerateResponse m;
    while (reader->Read(&m)) {
    }
    ASSERT_TRUE(reader->Finish().ok());
    const auto& md = ctx.GetServerInitialMetadata();
    ASSERT_NE(md.find("traceparent"), md.end());
  }
  {
    v1::GetModelRequest g;
    g.set_name("nope");
    grpc::ClientContext ctx;
    v1::ModelInfo info;
    EXPECT_EQ(stub_->GetModel(&ctx, g, &info).error_code(), grpc::StatusCode::NOT_FOUND);
  }
  server_->Shutdown();  // every line written
  std::ifstream in(log);
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0]["rpc"], "Classify");
  EXPECT_EQ(lines[0]["model"], "vit");
  EXPECT_EQ(lines[0]["code"], "OK");
  EXPECT_EQ(lines[0]["images"], 2);
  EXPECT_EQ(lines[0]["request_id"], "req-42");
  EXPECT_FALSE(lines[0].contains("traceparent"));
  EXPECT_GE(lines[0]["seconds"].get<double>(), lines[0]["queue_seconds"].get<double>());
  EXPECT_EQ(lines[1]["rpc"], "Generate");
  EXPECT_EQ(lines[1]["model"], "karm");
  EXPECT_EQ(lines[1]["images"], 2);
  EXPECT_EQ(lines[1]["traceparent"], trace);
  EXPECT_EQ(lines[2]["rpc"], "GetModel");
  EXPECT_EQ(lines[2]["code"], "NOT_FOUND");
  for (const auto& l : lines)
    EXPECT_NE(l["peer"].get<std::string>().find("127.0.0.1"), std::string::npos);
}

TEST_F(ServerTest, TlsAndMutualTls) {
  server_->Shutdown();
  const std::string certs = models_.dir + "/certs";
  std::filesystem::create_directories(certs);
  const std::string script = std::string(KRAUSE_SOURCE_DIR) + "/tests/make_test_certs.sh";
  ASSERT_EQ(std::system(("sh " + script + " " + certs).c_str()), 0) << "openssl failed";
  server::ServerOptions o = LoopbackOptions(models_.manifest);
  o.tls_cert = certs + "/server.pem";
  o.tls_key = certs + "/server.key";
  StartServer(o);
  auto list = [&](const client::ConnectionOptions& c) {
    auto stub = Stub(c);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::ListModelsResponse r;
    return stub->ListModels(&ctx, {}, &r).error_code();
  };
  client::ConnectionOptions tls = conn_;
  tls.tls_ca = certs + "/ca.pem";
  tls.server = "localhost:" + std::to_string(server_->port());
  EXPECT_EQ(list(tls), grpc::StatusCode::OK);
  // A failed handshake is UNAVAILABLE (the transport never came up), and the server stays up.
  EXPECT_EQ(list(conn_), grpc::StatusCode::UNAVAILABLE) << "plaintext to a TLS server";
  EXPECT_EQ(list(tls), grpc::StatusCode::OK);
  server_->Shutdown();

  o.tls_client_ca = certs + "/ca.pem";
  StartServer(o);
  tls.server = "localhost:" + std::to_string(server_->port());
  EXPECT_EQ(list(tls), grpc::StatusCode::UNAVAILABLE) << "mutual TLS without a client certificate";
  client::ConnectionOptions mtls = tls;
  mtls.tls_cert = certs + "/client.pem";
  mtls.tls_key = certs + "/client.key";
  EXPECT_EQ(list(mtls), grpc::StatusCode::OK);
}

TEST_F(ServerTest, ShutdownCancelsStreamsAfterTheGrace) {
  server_->Shutdown();
  server::ServerOptions o = LoopbackOptions(models_.manifest);
  o.drain_seconds = 0.3;
  StartServer(o, {}, milliseconds(5));  // the stream takes >= 768 * 5 ms
  grpc::ClientContext ctx;
  v1::GenerateRequest req;
  req.set_model("karm-big");
  req.set_temperature(1);
  auto reader = stub_->Generate(&ctx, req);
  v1::GenerateResponse m;
  ASSERT_TRUE(reader->Read(&m));
  // The first message says what a resume needs: the model version, the seed, the shape.
  ASSERT_TRUE(m.has_start());
  EXPECT_EQ(m.start().model(), "karm-big");
  EXPECT_EQ(m.start().model_version(), "1");
  EXPECT_EQ(m.start().height(), 16u);
  EXPECT_EQ(m.start().width(), 16u);
  EXPECT_EQ(m.start().channels(), 3u);
  // ... and what decides the bits (a resumed attempt must come from a replica that says the same).
  EXPECT_EQ(m.start().numerics(),
            absl::StrCat("fp32 fused_cpu on cpu, ", cpu::CpuKernelFamily(cpu::CpuKernels().name),
                         " kernel family, float32 weights, float32 cache"));
  std::thread stopper([&] { server_->Shutdown(); });
  // Draining: health says NOT_SERVING and new calls are refused.
  EXPECT_TRUE(Eventually([&] { return server_->gate().draining(); }));
  {
    auto ch = client::MakeChannel(conn_);
    auto health = grpc::health::v1::Health::NewStub(*ch);
    grpc::ClientContext hc;
    grpc::health::v1::HealthCheckResponse hr;
    const grpc::Status st = health->Check(&hc, {}, &hr);
    EXPECT_TRUE(!st.ok() || hr.status() == grpc::health::v1::HealthCheckResponse::NOT_SERVING);
    grpc::ClientContext lc;
    v1::ListModelsResponse lr;
    const grpc::Status refused = stub_->ListModels(&lc, {}, &lr);
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE);
    EXPECT_EQ(server::DetailsOf(refused).reason, "DRAINING");
    EXPECT_EQ(server::DetailsOf(refused).retry_delay, std::chrono::milliseconds(0));
    // ... and as gRPC's retry pushback, which the clients' retry policy honours.
    const auto& trailers = lc.GetServerTrailingMetadata();
    const auto pushback = trailers.find("grpc-retry-pushback-ms");
    ASSERT_NE(pushback, trailers.end());
    EXPECT_EQ(std::string(pushback->second.data(), pushback->second.size()), "0");
  }
  bool later_start = false;
  while (reader->Read(&m)) later_start = later_start || m.has_start();
  EXPECT_FALSE(later_start) << "only the first message carries the start";
  const grpc::Status st = reader->Finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(st.error_message(), ::testing::HasSubstr("shutting down"));
  // The stream's end says DRAINING (retry elsewhere at once), with the model.
  EXPECT_EQ(server::DetailsOf(st).reason, "DRAINING");
  EXPECT_EQ(server::DetailsOf(st).metadata.at("model"), "karm-big");
  stopper.join();
}

// The resuming client (client/resume.h) in process, two replicas behind one target: the replica
// serving the stream drains (0.05 s grace) after rows have arrived; the stream continues on the
// other from the rows received and ends with the image an undisturbed call gives. (chaos_test
// does this with processes and kill -9; here it also runs under TSan.)
TEST_F(ServerTest, ResumingClientContinuesAStreamOnAnotherReplica) {
  server_->Shutdown();
  server::ServerOptions o = LoopbackOptions(models_.manifest);
  o.drain_seconds = 0.05;
  StartServer(o, {}, milliseconds(2));  // karm-big: >= 768 * 2 ms per image
  server::WorkerHooks slow;
  slow.on_decode_step = [](const std::string& model, const server::DecodeEvent&) {
    if (model == "karm-big") std::this_thread::sleep_for(milliseconds(2));
  };
  auto other = server::KrauseServer::Start(o, slow);
  ASSERT_TRUE(other.ok()) << other.status();
  v1::GenerateRequest req;
  req.set_model("karm-big");
  req.set_seed(7);
  req.set_temperature(0.9f);
  req.set_update_interval_ms(10);
  // Undisturbed, on the second replica alone.
  auto direct = Stub(ClientFor((*other)->port()));
  const Stream calm = RunGenerate(*direct, req);
  ASSERT_TRUE(calm.status.ok()) << calm.status.error_message();
  const std::string want = calm.messages.back().images(0).png();

  client::ConnectionOptions both;
  both.server = absl::StrCat("ipv4:127.0.0.1:", server_->port(), ",127.0.0.1:", (*other)->port());
  both.retry = true;
  auto ch = client::MakeChannel(both);
  ASSERT_TRUE(ch.ok());
  auto stub = v1::KrauseService::NewStub(*ch);
  client::ResumingGenerate g(stub.get(), both, req, client::ResumeOptions{});
  v1::GenerateResponse m;
  std::string rows, png;
  std::thread stopper;
  while (g.Read(&m)) {
    for (const auto& r : m.rows()) rows += r.pixels();
    for (const auto& im : m.images()) png = im.png();
    if (!stopper.joinable() && rows.size() >= 2 * 16 * 3) {
      // Drain whichever replica runs the stream (its one cache slot is busy).
      server::KrauseServer* serving =
          server_->registry().Find<server::ServedGenerator>("karm-big").value()->worker().active()
              ? server_.get()
              : other->get();
      stopper = std::thread([serving] { serving->Shutdown(); });
    }
  }
  ASSERT_TRUE(stopper.joinable()) << "the stream ended before rows arrived";
  stopper.join();
  const grpc::Status st = g.Finish();
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(png, want) << "the resumed image is the undisturbed one";
  EXPECT_EQ(rows.size(), 16u * 16 * 3) << "every row once";
  const client::ResumeStats stats = g.stats();
  ASSERT_EQ(stats.breaks.size(), 1u);
  EXPECT_THAT(stats.breaks[0], ::testing::HasSubstr("UNAVAILABLE: the server is shutting down"));
  EXPECT_EQ(stats.resumed_calls, 1);
  EXPECT_GE(stats.rows_kept, 2);
  (*other)->Shutdown();
}

TEST_F(ServerTest, ShutdownLetsInFlightStreamsFinishWithinTheGrace) {
  v1::GenerateRequest req;
  req.set_model("karm");
  req.set_num_images(4);
  req.set_update_interval_ms(10);
  grpc::ClientContext ctx;
  auto reader = stub_->Generate(&ctx, req);
  v1::GenerateResponse m;
  ASSERT_TRUE(reader->Read(&m));
  std::thread stopper([&] { server_->Shutdown(); });  // drain_seconds 5
  // (A fast machine may put every image and the summary in the first message already.)
  int images = m.images_size();
  bool summary = m.has_summary();
  while (reader->Read(&m)) {
    images += m.images_size();
    summary = summary || m.has_summary();
  }
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_TRUE(summary);
  stopper.join();
}

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
