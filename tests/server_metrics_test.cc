// /metrics after a known workload: counters and histogram counts match exactly what was sent,
// scraped over HTTP from the server's metrics port.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "client/http_get.h"
#include "model/util/threads.h"
#include "server_fixture.h"

namespace krause::testing {
namespace {

using Labels = std::map<std::string, std::string>;

v1::Image Raw(int64_t h, int64_t w, uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  return server::EncodeRawImage(at::randint(0, 256, {h, w, 1}, gen, at::kLong).to(at::kByte));
}

TEST(ServerMetrics, ScrapeMatchesAKnownWorkload) {
  krause::SetCpuThreads(1);
  const TinyModels models = WriteTinyModels("metrics");
  server::ServerOptions o = LoopbackOptions(models.manifest);
  o.metrics_listen = "127.0.0.1:0";
  auto server = server::KrauseServer::Start(o);
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_GT((*server)->metrics_port(), 0);
  auto stub = Stub(ClientFor((*server)->port()));

  // 3 classify calls of 2 images, one after the other (3 batches); 1 bad shape; 1 unknown model.
  for (int i = 0; i < 3; ++i) {
    v1::ClassifyRequest req;
    *req.add_images() = Raw(8, 8, 2 * i);
    *req.add_images() = Raw(8, 8, 2 * i + 1);
    grpc::ClientContext ctx;
    v1::ClassifyResponse r;
    ASSERT_TRUE(stub->Classify(&ctx, req, &r).ok());
  }
  {
    v1::ClassifyRequest req;
    *req.add_images() = Raw(9, 8, 1);
    grpc::ClientContext ctx;
    v1::ClassifyResponse r;
    ASSERT_EQ(stub->Classify(&ctx, req, &r).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
  {
    v1::ClassifyRequest req;
    req.set_model("nope");
    *req.add_images() = Raw(8, 8, 1);
    grpc::ClientContext ctx;
    v1::ClassifyResponse r;
    ASSERT_EQ(stub->Classify(&ctx, req, &r).error_code(), grpc::StatusCode::NOT_FOUND);
  }
  // 2 generate calls of 2 images (6x6x1: 36 subpixels each).
  int messages = 0;
  for (int i = 0; i < 2; ++i) {
    v1::GenerateRequest req;
    req.set_num_images(2);
    req.set_seed(static_cast<uint64_t>(i));
    grpc::ClientContext ctx;
    auto reader = stub->Generate(&ctx, req);
    v1::GenerateResponse m;
    while (reader->Read(&m)) ++messages;
    ASSERT_TRUE(reader->Finish().ok());
  }
  // 1 guided generate call of 2 images on karm-cond: 2 slots and 2 decode rows per image, but
  // each image's subpixels are counted once (its FLOPs twice).
  {
    v1::GenerateRequest req;
    req.set_model("karm-cond");
    req.set_num_images(2);
    req.set_seed(3);
    req.set_label("one");
    req.set_guidance(2.0f);
    grpc::ClientContext ctx;
    auto reader = stub->Generate(&ctx, req);
    v1::GenerateResponse m;
    while (reader->Read(&m)) {
    }
    ASSERT_TRUE(reader->Finish().ok());
  }
  // 1 score call of 3 images.
  {
    v1::ScoreRequest req;
    req.set_model("arm");
    for (int i = 0; i < 3; ++i) *req.add_images() = Raw(6, 6, 10 + i);
    grpc::ClientContext ctx;
    v1::ScoreResponse r;
    ASSERT_TRUE(stub->Score(&ctx, req, &r).ok());
  }
  // 1 inspect call (counted like the others; it classifies, generates and scores nothing).
  {
    v1::InspectRequest req;
    req.set_model("karm");
    *req.mutable_image() = Raw(6, 6, 20);
    req.add_queries(5);
    grpc::ClientContext ctx;
    v1::InspectResponse r;
    ASSERT_TRUE(stub->Inspect(&ctx, req, &r).ok());
  }

  auto text = client::HttpGet("127.0.0.1:" + std::to_string((*server)->metrics_port()), "/metrics");
  ASSERT_TRUE(text.ok()) << text.status();
  auto sample = [&](const std::string& name, const Labels& labels) {
    auto v = client::PrometheusSample(*text, name, labels);
    EXPECT_TRUE(v.ok()) << name;
    return v.ok() ? *v : -1.0;
  };
  auto m = LoadModel(models.dir + "/vit.safetensors");
  ASSERT_TRUE(m.ok());
  const AttentionCost vit = m->FlopsPerImage();
  auto karm_model = LoadModel(models.dir + "/karm.safetensors");
  ASSERT_TRUE(karm_model.ok());
  const AttentionCost karm = karm_model->FlopsPerImage();

  EXPECT_EQ(sample("krause_requests_total", {{"rpc", "Classify"},
                                             {"protocol", "krause.v1"},
                                             {"model", "vit"},
                                             {"version", "1"},
                                             {"code", "OK"}}),
            3);
  EXPECT_EQ(sample("krause_requests_total", {{"rpc", "Classify"},
                                             {"protocol", "krause.v1"},
                                             {"model", "vit"},
                                             {"version", "1"},
                                             {"code", "INVALID_ARGUMENT"}}),
            1);
  EXPECT_EQ(sample("krause_requests_total", {{"rpc", "Classify"},
                                             {"protocol", "krause.v1"},
                                             {"model", ""},
                                             {"version", ""},
                                             {"code", "NOT_FOUND"}}),
            1);
  EXPECT_EQ(sample("krause_requests_total", {{"rpc", "Generate"},
                                             {"protocol", "krause.v1"},
                                             {"model", "karm"},
                                             {"version", "1"},
                                             {"code", "OK"}}),
            2);
  EXPECT_EQ(sample("krause_requests_total", {{"rpc", "Score"},
                                             {"protocol", "krause.v1"},
                                             {"model", "arm"},
                                             {"version", "1"},
                                             {"code", "OK"}}),
            1);
  EXPECT_EQ(sample("krause_requests_total", {{"rpc", "Inspect"},
                                             {"protocol", "krause.v1"},
                                             {"model", "karm"},
                                             {"version", "1"},
                                             {"code", "OK"}}),
            1);
  EXPECT_EQ(
      sample("krause_request_duration_seconds_count",
             {{"rpc", "Inspect"}, {"protocol", "krause.v1"}, {"model", "karm"}, {"version", "1"}}),
      1);
  EXPECT_EQ(client::PrometheusSum(*text, "krause_requests_total"), 3 + 1 + 1 + 2 + 1 + 1 + 1);
  EXPECT_EQ(
      sample("krause_request_duration_seconds_count",
             {{"rpc", "Classify"}, {"protocol", "krause.v1"}, {"model", "vit"}, {"version", "1"}}),
      4);
  EXPECT_EQ(
      sample("krause_request_duration_seconds_count",
             {{"rpc", "Generate"}, {"protocol", "krause.v1"}, {"model", "karm"}, {"version", "1"}}),
      2);
  EXPECT_EQ(sample("krause_queue_duration_seconds_count", {{"rpc", "Classify"}, {"model", "vit"}}),
            3);
  // Buckets are cumulative and end at +Inf with the count.
  EXPECT_EQ(sample("krause_request_duration_seconds_bucket", {{"rpc", "Classify"},
                                                              {"protocol", "krause.v1"},
                                                              {"model", "vit"},
                                                              {"version", "1"},
                                                              {"le", "+Inf"}}),
            4);
  EXPECT_EQ(sample("krause_classify_batch_images_count", {{"model", "vit"}}), 3);
  EXPECT_EQ(sample("krause_classify_batch_images_sum", {{"model", "vit"}}), 6);
  EXPECT_EQ(sample("krause_compute_duration_seconds_count",
                   {{"model", "vit"}, {"work", "classify_batch"}}),
            3);
  EXPECT_EQ(sample("krause_images_total", {{"rpc", "Classify"}, {"model", "vit"}}), 6);
  EXPECT_EQ(sample("krause_images_total", {{"rpc", "Generate"}, {"model", "karm"}}), 4);
  EXPECT_EQ(sample("krause_images_total", {{"rpc", "Score"}, {"model", "arm"}}), 3);
  EXPECT_EQ(sample("krause_generated_pixels_total", {{"model", "karm"}}), 4 * 36);
  EXPECT_EQ(sample("krause_decode_batch_sequences_sum", {{"model", "karm"}}), 4 * 36);
  EXPECT_EQ(sample("krause_generate_first_chunk_seconds_count", {{"model", "karm"}}), 2);
  EXPECT_EQ(sample("krause_generate_chunk_gap_seconds_count", {{"model", "karm"}}), messages - 2);
  EXPECT_DOUBLE_EQ(sample("krause_flops_executed_total", {{"rpc", "Classify"}, {"model", "vit"}}),
                   6 * vit.executed_flops);
  EXPECT_DOUBLE_EQ(
      sample("krause_flops_dense_equivalent_total", {{"rpc", "Classify"}, {"model", "vit"}}),
      6 * vit.dense_equivalent_flops);
  EXPECT_DOUBLE_EQ(sample("krause_flops_executed_total", {{"rpc", "Generate"}, {"model", "karm"}}),
                   4 * karm.executed_flops);
  auto cond_model = LoadModel(models.dir + "/cond.safetensors");
  ASSERT_TRUE(cond_model.ok());
  EXPECT_EQ(sample("krause_generated_pixels_total", {{"model", "karm-cond"}}), 2 * 36);
  EXPECT_EQ(sample("krause_decode_batch_sequences_sum", {{"model", "karm-cond"}}), 2 * 36);
  EXPECT_DOUBLE_EQ(
      sample("krause_flops_executed_total", {{"rpc", "Generate"}, {"model", "karm-cond"}}),
      2 * 2 * cond_model->FlopsPerImage().executed_flops);
  EXPECT_EQ(sample("krause_kv_cache_slots_in_use", {{"model", "karm-cond"}, {"version", "1"}}), 0);
  EXPECT_EQ(sample("krause_kv_cache_slots", {{"model", "karm"}, {"version", "1"}}), 4);
  EXPECT_EQ(sample("krause_kv_cache_slots_in_use", {{"model", "karm"}, {"version", "1"}}), 0);
  EXPECT_EQ(sample("krause_active_sequences", {{"model", "karm"}, {"version", "1"}}), 0);
  EXPECT_EQ(sample("krause_queued_images", {{"model", "vit"}, {"version", "1"}}), 0);
  // (the last call may still be leaving the gate as its reply arrives: only its presence here)
  EXPECT_TRUE(client::PrometheusSample(*text, "krause_calls_in_flight", {}).ok());
  EXPECT_GT(sample("krause_kv_cache_bytes", {{"model", "karm"}, {"version", "1"}}), 0);
  EXPECT_EQ(client::PrometheusSum(*text, "krause_build_info"), 1);
  EXPECT_EQ((*server)->metrics().Scrape().find("krause_requests_total") != std::string::npos, true);
  (*server)->Shutdown();
  std::filesystem::remove_all(models.dir);
}

}  // namespace
}  // namespace krause::testing

namespace krause::server {
namespace {

// A configured tenant's refusals are counted by reason, its images only when served.
TEST(ServerMetrics, TenantCallsAreCountedWithTheirRefusalReason) {
  Metrics m;
  m.OnTenantCall("team-a", 3, "");
  m.OnTenantCall("team-a", 0, "TENANT_LIMIT");
  m.OnTenantCall("team-b", 0, "QUEUE_FULL");
  const std::string s = m.Scrape();
  for (const char* line :
       {"krause_tenant_calls_total{tenant=\"team-a\"} 2",
        "krause_tenant_images_total{tenant=\"team-a\"} 3",
        "krause_tenant_refusals_total{reason=\"TENANT_LIMIT\",tenant=\"team-a\"} 1",
        "krause_tenant_refusals_total{reason=\"QUEUE_FULL\",tenant=\"team-b\"} 1"})
    EXPECT_NE(s.find(line), std::string::npos) << line << "\n" << s;
  EXPECT_EQ(s.find("krause_tenant_images_total{tenant=\"team-b\"}"), std::string::npos);
}

}  // namespace
}  // namespace krause::server
