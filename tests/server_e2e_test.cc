// End-to-end tests of krause-server: a real gRPC server on a loopback port (in process), driven
// through the generated client stubs: the model list, health, reflection, Classify (its results,
// every error path, batching, message limits, full queues and deadlines) and thirty-two clients
// at once. The rest of the server's end-to-end tests, on the same fixture (server_test.h):
// server_generate_test (Generate, completion, REST generation, statistics, Score),
// server_inspect_test, server_classes_test (class-conditional generation), server_access_test
// (auth, request log, TLS), server_shutdown_test (shutdown, resuming) and server_start_test (what
// a manifest's settings serve).
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <grpcpp/generic/generic_stub.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "server_test.h"
#include "test_util.h"

namespace krause::testing {
namespace {

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

}  // namespace
}  // namespace krause::testing
